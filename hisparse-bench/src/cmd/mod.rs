//! The program's commands, one module each.

pub mod arrivals;
pub mod calibrate;
pub mod check_kernels;
pub mod common;
pub mod dump_step;
#[cfg(feature = "cuda")]
pub mod gpu_bench;
#[cfg(feature = "cuda")]
pub mod kernel_bench;
#[cfg(feature = "cuda")]
pub mod launch_gaps;
pub mod rank_vote;
pub mod replot;
pub mod run;
pub mod run_args;
pub mod run_ranks;
pub mod selfcheck;
pub mod simulate;
pub mod sizing;
pub mod sweep;
pub mod sweep_data;
pub mod sweep_headline;
pub mod sweep_output;
pub mod sweep_ranks;
pub mod trace;
pub mod trace_import;
