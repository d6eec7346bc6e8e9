//! The `hisparse` program: the user's view of the workspace.
//!
//! Commands: `selfcheck` (every CPU kernel checked against its oracle and timed against the
//! in-run memcpy ceiling), `check-kernels` (NVRTC compile of every CUDA kernel for sm_90a),
//! `simulate` (policy simulator over a trace) and `trace synth|info`.
//! Errors print one line and exit with status 2.

// A command-line program: printing results to stdout is its job.
#![allow(clippy::print_stdout)]

mod cmd;
mod error;
mod progress;
mod report;
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
    /// Replay a selection trace under several eviction policies and buffer sizes.
    Simulate(cmd::simulate::SimulateArgs),
    /// Write or describe selection traces.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
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
        Command::Simulate(args) => {
            let (report, out) = cmd::simulate::run(&args)?;
            print!("{}", cmd::simulate::render(&report, &out));
            Ok(0)
        }
        Command::Trace(c) => cmd::trace::run(&c).map(|()| 0),
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
