//! The program's commands, one module each.

pub mod check_kernels;
pub mod selfcheck;
