//! The `hisparse` program: the user's view of the workspace.
//!
//! Commands: `sweep` (throughput over concurrency x context, both modes), `run` (one
//! configuration), `dump-step` (one step as safetensors), `simulate` (policy simulator over a
//! trace), `trace synth|info`, `calibrate` (the workload's locality), `selfcheck` (every CPU
//! kernel against its oracle, timed against the in-run memcpy ceiling) and `check-kernels`
//! (NVRTC compile of every CUDA kernel for sm_90a). `HISPARSE_LOG=debug` prints tracing spans.
//! Errors print one line and exit with status 2.

// A command-line program: printing results to stdout is its job.
#![allow(clippy::print_stdout)]

mod cmd;
mod error;
mod guard;
mod interrupt;
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
    /// Steady-state decode throughput over concurrency x context, resident against hisparse.
    // Negative numbers reach the flag's own check (an error naming it), not clap's "unexpected argument".
    #[command(allow_negative_numbers = true)]
    Sweep(cmd::sweep::SweepArgs),
    /// A sweep's tables, CSV and plots again from its sweep.json.
    Replot(cmd::replot::ReplotArgs),
    /// One configuration decoded to the end, in one or both modes.
    #[command(allow_negative_numbers = true)]
    Run(cmd::run::RunArgs),
    /// One decode step's inputs and outputs as a safetensors file.
    #[command(allow_negative_numbers = true)]
    DumpStep(cmd::dump_step::DumpStepArgs),
    /// Measure the synthetic workload's locality against the published figures.
    #[command(allow_negative_numbers = true)]
    Calibrate(cmd::calibrate::CalibrateArgs),
    /// GPU swap-in path: ceilings, host-tier set-up, miss-gather bandwidth, swap-in latency.
    #[cfg(feature = "cuda")]
    #[command(allow_negative_numbers = true)]
    GpuBench(cmd::gpu_bench::GpuBenchArgs),
    /// CUDA decode kernels (indexer, top-k, attention) against HBM-copy and cuBLAS ceilings.
    #[cfg(feature = "cuda")]
    #[command(allow_negative_numbers = true)]
    KernelBench(cmd::kernel_bench::KernelBenchArgs),
    /// Check every CPU kernel against its oracle on random data and time it.
    #[command(allow_negative_numbers = true)]
    Selfcheck(cmd::selfcheck::SelfcheckArgs),
    /// Compile every CUDA kernel source for sm_90a with NVRTC (exit 3: no NVRTC, skipped).
    CheckKernels,
    /// Replay a selection trace under several eviction policies and buffer sizes.
    #[command(allow_negative_numbers = true)]
    Simulate(cmd::simulate::SimulateArgs),
    /// Write or describe selection traces.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Sweep(args) => {
            let (report, out) = cmd::sweep::run(&args)?;
            print!("{}", cmd::sweep_output::render(&report, &out));
            Ok(0)
        }
        Command::Replot(args) => {
            let (report, out) = cmd::replot::run(&args)?;
            print!("{}", cmd::sweep_output::render(&report, &out));
            Ok(0)
        }
        Command::Run(args) => {
            let (runs, out) = cmd::run::run(&args)?;
            print!("{}", cmd::run::render(&runs, &out));
            Ok(0)
        }
        Command::DumpStep(args) => {
            let (path, n) = cmd::dump_step::run(&args)?;
            println!(
                "wrote {} ({n} tensors); tensor names are documented in `hisparse dump-step --help`",
                path.display()
            );
            Ok(0)
        }
        #[cfg(feature = "cuda")]
        Command::GpuBench(args) => {
            let figs = cmd::gpu_bench::run(&args)?;
            println!("{} figures written to {}/gpu-bench.json", figs.len(), args.out.display());
            Ok(0)
        }
        #[cfg(feature = "cuda")]
        Command::KernelBench(args) => {
            let figs = cmd::kernel_bench::run(&args)?;
            println!("{} figures written to {}/kernel-bench.json", figs.len(), args.out.display());
            Ok(0)
        }
        Command::Calibrate(args) => {
            print!("{}", cmd::calibrate::run(&args)?);
            Ok(0)
        }
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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("HISPARSE_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        Err(e) => {
            // One line: clap's first line, without its "error: " prefix.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments").trim_start_matches("error: ");
            eprintln!("hisparse: {first}");
            return ExitCode::from(2);
        }
    };
    interrupt::install();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e @ BenchError::Interrupted(_)) => {
            eprintln!("hisparse: {e}");
            ExitCode::from(interrupt::EXIT_INTERRUPTED)
        }
        Err(e) => {
            eprintln!("hisparse: {e}");
            ExitCode::from(2)
        }
    }
}
