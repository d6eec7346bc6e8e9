//! The `hisparse` program: the user's view of the workspace.
//!
//! Commands: `selfcheck` (every CPU kernel checked against its oracle and timed against the
//! in-run memcpy ceiling) and `check-kernels` (NVRTC compile of every CUDA kernel for sm_90a).
//! Errors print one line and exit with status 2.

// A command-line program: printing results to stdout is its job.
#![allow(clippy::print_stdout)]

mod cmd;
mod error;
mod timing;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::{BenchError, Result};

/// HiSparse in Rust: a hierarchical KV memory for sparse-attention decoding.
#[derive(Debug, Parser)]
#[command(name = "hisparse", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check every CPU kernel against its oracle on random data and time it.
    Selfcheck(cmd::selfcheck::SelfcheckArgs),
    /// Compile every CUDA kernel source for sm_90a with NVRTC (exit 3: no NVRTC, skipped).
    CheckKernels,
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Selfcheck(args) => {
            let report = cmd::selfcheck::run(&args)?;
            print!("{}", cmd::selfcheck::render(&report));
            match cmd::selfcheck::failures(&report) {
                Some(f) => Err(BenchError::Check(f)),
                None => Ok(0),
            }
        }
        Command::CheckKernels => cmd::check_kernels::run(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("hisparse: {e}");
            ExitCode::from(2)
        }
    }
}
