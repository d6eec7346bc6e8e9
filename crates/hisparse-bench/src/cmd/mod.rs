//! The program's commands, one module each.

pub mod check_kernels;
pub mod selfcheck;
pub mod simulate;
pub mod trace;
