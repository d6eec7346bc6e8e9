//! What `hisparse run` is asked and what it reports of one mode: its arguments ([`RunArgs`], the
//! modes to run: [`ModeArg`]), one mode's result ([`ModeRun`]), and the helpers the one-engine
//! run (`run.rs`), the run over ranks (`run_ranks.rs`) and the real model's run
//! (`run_model.rs`) share.

use std::path::PathBuf;

use hisparse_engine::{LatencySummary, RunSummary, StepMetrics};
use hisparse_memory::Mode;
use serde::Serialize;

use super::common::EngineArgs;
use crate::error::{BenchError, Result};
use crate::files::AtomicFile;

/// Which modes to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Both, resident first.
    Both,
    /// The baseline: whole KV on the device.
    Resident,
    /// Full KV on the host, a hot buffer on the device.
    Hisparse,
    /// Hybrid placement: a request's whole KV on the device while it has room, demoted to a hot
    /// buffer and the host tier when admitting others needs it, promoted back when it frees.
    Hybrid,
    /// Resident, hisparse and hybrid, in that order.
    All,
}

impl ModeArg {
    /// The modes to run.
    pub fn modes(self) -> Vec<Mode> {
        match self {
            Self::Both => vec![Mode::Resident, Mode::HiSparse],
            Self::Resident => vec![Mode::Resident],
            Self::Hisparse => vec![Mode::HiSparse],
            Self::Hybrid => vec![Mode::Hybrid],
            Self::All => vec![Mode::Resident, Mode::HiSparse, Mode::Hybrid],
        }
    }
}

/// Options of `hisparse run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Engine options.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Modes to run.
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    /// Requests: submitted at once, or arriving one by one with --arrival-rate.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Requests arrive by a Poisson process of this many per second (seeded by --seed) instead
    /// of all at once; time to first decode counts from each one's arrival. A comma-separated
    /// list is a load sweep: every mode at every rate, the same requests arriving in the same
    /// order (the gaps scaled), with load.csv and latency.svg (latency against offered load).
    #[arg(long, value_delimiter = ',')]
    pub arrival_rate: Vec<f64>,
    /// Prompt tokens per request; a comma-separated list is cycled through (request i gets
    /// entry i modulo the list's length).
    #[arg(long, value_delimiter = ',', default_value = "4096")]
    pub context: Vec<usize>,
    /// Tokens to generate per request; a comma-separated list is cycled through like
    /// --context.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    pub output: Vec<usize>,
    /// Record the hisparse run's selections as a trace (for `hisparse simulate`); an existing
    /// file is refused unless --overwrite is given.
    #[arg(long)]
    pub record_trace: Option<PathBuf>,
    /// Replace an existing --record-trace file.
    #[arg(long)]
    pub overwrite: bool,
    /// Output folder (default: results/run), written whole: an earlier output of this program there is
    /// replaced, a folder holding other files is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// GPUs (ranks), one engine each with its share of the requests (round robin) and of the
    /// host memory; with an emulated model the ranks exchange tokens around every FFN (NCCL on
    /// CUDA) and step together until the last one is done. On the CPU backend, that many CPU
    /// engines. Without it: one engine, no collectives.
    #[arg(long)]
    pub gpus: Option<usize>,
    /// A real model as the input (`--model`, `--gguf`, with `--text`).
    #[cfg(feature = "model")]
    #[command(flatten)]
    pub source: super::model_source::ModelSource,
}

impl RunArgs {
    /// The offered loads to run, in requests per second: each `--arrival-rate`, or `None` (all
    /// at once) without one.
    pub fn loads(&self) -> Vec<Option<f64>> {
        match self.arrival_rate.as_slice() {
            [] => vec![None],
            rates => rates.iter().map(|&r| Some(r)).collect(),
        }
    }

    /// `--score-margin` (0 in a build without the real model's flags).
    pub fn score_margin(&self) -> usize {
        #[cfg(feature = "model")]
        return self.source.score_margin;
        #[cfg(not(feature = "model"))]
        0
    }
}

/// One mode's result.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRun {
    /// The mode.
    pub mode: Mode,
    /// The summary.
    pub summary: RunSummary,
    /// Every step.
    pub steps: Vec<StepMetrics>,
    /// Requests rejected whole, with the reason.
    pub rejected: Vec<(u64, String)>,
    /// Requests refused by the full waiting queue (--max-queued).
    pub refused: Vec<u64>,
    /// Time to first decode and per-token latency.
    pub latency: LatencySummary,
    /// Ranks (engines) it ran on; a step is then the slowest rank's, its tokens their sum.
    pub gpus: usize,
    /// Collective bytes per rank and step (`--gpus` with an emulated model, else 0).
    pub exchange_mb_per_step: f64,
    /// Set when the run copied no rows (`--miss-fill no-copies`): timing only, outputs wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing_only: Option<&'static str>,
    /// The offered load it ran at (requests per second, `--arrival-rate`); none: all at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<f64>,
}

impl ModeRun {
    /// Its name in tables: the mode, with its load in a load sweep.
    pub fn label(&self) -> String {
        match self.arrival_rate {
            Some(r) => format!("{}@{r}/s", self.mode),
            None => self.mode.to_string(),
        }
    }
}

/// The shortest and the longest request of `a` (prompt + output tokens).
pub fn request_lengths(a: &RunArgs) -> (usize, usize) {
    let min = |v: &[usize]| v.iter().copied().min().unwrap_or(1);
    let max = |v: &[usize]| v.iter().copied().max().unwrap_or(1);
    (min(&a.context) + min(&a.output), max(&a.context) + max(&a.output))
}

/// The requests `e` rejected whole, with the reason.
pub fn rejected_of(e: &dyn hisparse_engine::DecodeEngine) -> Vec<(u64, String)> {
    e.outcomes()
        .iter()
        .filter_map(|(id, o)| match o {
            hisparse_engine::Outcome::Rejected { reason } => Some((id.0, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The `--record-trace` file of `a`, checked and made now (before minutes of work; placed at
/// the end): refused for a `.jsonl` name (the engine records a binary trace) and when the run
/// has no hisparse mode to record.
pub fn trace_file(a: &RunArgs) -> Result<Option<AtomicFile>> {
    match &a.record_trace {
        Some(p) if p.extension().is_some_and(|e| e == "jsonl") => Err(BenchError::flag(
            "record-trace",
            p.display(),
            "the engine records a binary trace: name it .hstrace (JSON lines come from `trace synth` \
             and `trace import`)",
        )),
        Some(p) if a.mode.modes().contains(&Mode::HiSparse) => {
            Ok(Some(AtomicFile::create("record-trace", p, a.overwrite)?))
        }
        Some(p) => Err(BenchError::flag(
            "record-trace",
            p.display(),
            "records the hisparse run: use --mode hisparse, both or all",
        )),
        None => Ok(None),
    }
}
