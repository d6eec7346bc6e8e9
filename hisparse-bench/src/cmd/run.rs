//! `hisparse run`: one configuration, in one or both modes: requests (all at once, or arriving by
//! a Poisson process: `--arrival-rate`) decoded to the end with continuous batching, with the
//! run's summary (throughput, time per stage, hits and misses, bytes moved and held, time to
//! first decode and per-token latency percentiles) printed and written as JSON, and every
//! step's metrics as CSV.

use std::path::PathBuf;

use hisparse_engine::{LatencySummary, RequestSpec, RunSummary, StepMetrics};
use hisparse_memory::{Mode, RequestId};
use serde::Serialize;

use super::common::EngineArgs;
use crate::error::{BenchError, Result};
use crate::files::{AtomicFile, OutputDir};
use crate::report::Csv;
use crate::{guard, interrupt, progress};

/// Which modes to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Both, resident first.
    Both,
    /// The baseline: whole KV on the device.
    Resident,
    /// Full KV on the host, a hot buffer on the device.
    Hisparse,
}

impl ModeArg {
    /// The modes to run.
    pub fn modes(self) -> Vec<Mode> {
        match self {
            Self::Both => vec![Mode::Resident, Mode::HiSparse],
            Self::Resident => vec![Mode::Resident],
            Self::Hisparse => vec![Mode::HiSparse],
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
    /// of all at once; time to first decode counts from each one's arrival.
    #[arg(long)]
    pub arrival_rate: Option<f64>,
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
}

/// Runs; returns the results and the output folder.
pub fn run(a: &RunArgs) -> Result<(Vec<ModeRun>, PathBuf)> {
    guard::within("concurrency", a.concurrency, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
    if a.context.is_empty() {
        return Err(BenchError::flag("context", "", "give at least one length"));
    }
    if a.output.is_empty() {
        return Err(BenchError::flag("output", "", "give at least one length"));
    }
    if let Some(r) = a.arrival_rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(BenchError::flag("arrival-rate", r, "requests per second: a positive number"));
        }
        // The arrivals' expected span: beyond a day, the run would only wait.
        let span = a.concurrency as f64 / r;
        if span > super::arrivals::LONGEST_ARRIVALS_S {
            return Err(BenchError::flag(
                "arrival-rate",
                format!("{r:?}"),
                format!(
                    "{} requests would arrive over about {span:.3e} s; arrivals may span at most a day ({} s)",
                    a.concurrency,
                    super::arrivals::LONGEST_ARRIVALS_S
                ),
            ));
        }
    }
    for &o in &a.output {
        guard::at_least_one("output", o)?;
    }
    if let Some(n) = a.gpus {
        guard::within("gpus", n, 1, 1024)?;
        if a.engine.host_tier_file.is_some() {
            return Err(BenchError::flag("gpus", n, "the ranks cannot share one host-tier file"));
        }
        if a.record_trace.is_some() {
            return Err(BenchError::flag("gpus", n, "--record-trace records one engine: run without --gpus"));
        }
    }
    for &c in &a.context {
        guard::at_least_one("context", c)?;
        let o = a.output.iter().copied().max().unwrap_or(1);
        // A request is at most 2^31 positions (longer ones are refused, not wrapped).
        let total = guard::sum(("context", c), ("output", o))?;
        if total > u32::MAX as usize / 2 {
            let (flag, v) = if c > o { ("context", c) } else { ("output", o) };
            return Err(BenchError::flag(flag, v, "a request (context + output) must stay below 2^31 tokens"));
        }
    }
    let out = OutputDir::prepare("out", a.out.as_deref().unwrap_or(std::path::Path::new("results/run")))?;
    // Checked for writability now, before minutes of work; renamed into place at the end.
    let mut trace_file = match &a.record_trace {
        Some(p) if p.extension().is_some_and(|e| e == "jsonl") => {
            return Err(BenchError::flag(
                "record-trace",
                p.display(),
                "the engine records a binary trace: name it .hstrace (JSON lines come from `trace synth` \
                 and `trace import`)",
            ));
        }
        Some(p) if a.mode.modes().contains(&Mode::HiSparse) => {
            Some(AtomicFile::create("record-trace", p, a.overwrite)?)
        }
        Some(p) => {
            return Err(BenchError::flag(
                "record-trace",
                p.display(),
                "records the hisparse run: use --mode hisparse or both",
            ));
        }
        None => None,
    };
    let mut runs = Vec::new();
    for mode in a.mode.modes() {
        let specs: Vec<RequestSpec> = (0..a.concurrency)
            .map(|i| RequestSpec {
                id: RequestId(i as u64),
                prompt_tokens: a.context[i % a.context.len()],
                output_tokens: a.output[i % a.output.len()],
            })
            .collect();
        let times = a.arrival_rate.map(|r| super::arrivals::poisson_times(specs.len(), r, a.engine.seed));
        let run = match a.gpus {
            Some(ranks) => super::run_ranks::run_mode(a, mode, ranks, &specs, times.as_deref())?,
            None => run_mode(a, mode, &specs, times.as_deref(), trace_file.as_mut())?,
        };
        runs.push(run);
    }
    out.write_json("run.json", &runs)?;
    let mut csv = Csv::new(&[
        "mode",
        "step",
        "seconds",
        "tokens",
        "running",
        "queued",
        "hits",
        "misses",
        "max_misses",
        "bytes_h2d",
        "bytes_d2h",
        "prefetched",
        "prefetch_useful",
        "prefetch_wasted",
        "bytes_h2d_prefetch",
        "indexer_s",
        "top_k_s",
        "swap_in_s",
        "attention_s",
        "backup_s",
        "append_s",
        "device_bytes",
        "host_bytes",
    ]);
    for r in &runs {
        for s in &r.steps {
            let st = &s.stages;
            csv.row([
                r.mode.to_string(),
                s.step.to_string(),
                format!("{:.6}", s.seconds),
                s.tokens.to_string(),
                s.running.to_string(),
                s.queued.to_string(),
                s.swap.hits.to_string(),
                s.swap.misses.to_string(),
                s.swap.max_misses.to_string(),
                s.swap.bytes_h2d.to_string(),
                s.bytes_d2h.to_string(),
                s.swap.prefetched.to_string(),
                s.swap.prefetch_useful.to_string(),
                s.swap.prefetch_wasted.to_string(),
                s.swap.bytes_h2d_prefetch.to_string(),
                format!("{:.6}", st.indexer),
                format!("{:.6}", st.top_k),
                format!("{:.6}", st.swap_in),
                format!("{:.6}", st.attention),
                format!("{:.6}", st.backup),
                format!("{:.6}", st.append),
                s.device_bytes_in_use.to_string(),
                s.host_bytes_in_use.to_string(),
            ]);
        }
    }
    out.write("steps.csv", csv.text().as_bytes())?;
    if let Some(f) = trace_file {
        f.commit()?;
    }
    Ok((runs, out.commit()?))
}

/// The shortest and the longest request of `a` (prompt + output tokens).
pub(super) fn request_lengths(a: &RunArgs) -> (usize, usize) {
    let min = |v: &[usize]| v.iter().copied().min().unwrap_or(1);
    let max = |v: &[usize]| v.iter().copied().max().unwrap_or(1);
    (min(&a.context) + min(&a.output), max(&a.context) + max(&a.output))
}

/// One mode on one engine: `specs` decoded to the end (arriving at `times`), the hisparse run
/// recorded into `trace` where given.
fn run_mode(
    a: &RunArgs,
    mode: Mode,
    specs: &[RequestSpec],
    times: Option<&[f64]>,
    trace: Option<&mut AtomicFile>,
) -> Result<ModeRun> {
    let mut e = a.engine.engine(mode, request_lengths(a).0, "context")?;
    if mode == Mode::HiSparse
        && let Some(f) = trace
    {
        let clone = f.writer().get_ref().try_clone().map_err(|source| BenchError::Io {
            path: a.record_trace.as_ref().map_or_else(String::new, |p| p.display().to_string()),
            source,
        })?;
        e.record_trace(Box::new(std::io::BufWriter::new(clone)))?;
    }
    let all: u64 = specs.iter().map(|s| s.output_tokens as u64).sum();
    let bar = progress::bar(all, &format!("{mode} tokens"));
    let mut summary = RunSummary::default();
    let (mut steps, mut latencies) = (Vec::new(), Vec::new());
    let refused = super::arrivals::drive(e.as_mut(), specs, times, None, |r| {
        interrupt::check(|| format!("decoding the {mode} run (step {})", steps.len() + 1))?;
        bar.inc(r.metrics.tokens as u64);
        summary.add(&r.metrics);
        steps.push(r.metrics);
        latencies.extend(r.latencies);
        Ok(())
    })?;
    bar.finish_and_clear();
    e.finish_trace()?;
    e.check_pools()?;
    let rejected = rejected_of(e.as_ref());
    let latency = LatencySummary::of(&latencies);
    Ok(ModeRun { mode, summary, steps, rejected, refused, latency, gpus: 1, exchange_mb_per_step: 0.0 })
}

/// The requests `e` rejected whole, with the reason.
pub(super) fn rejected_of(e: &dyn hisparse_engine::DecodeEngine) -> Vec<(u64, String)> {
    e.outcomes()
        .iter()
        .filter_map(|(id, o)| match o {
            hisparse_engine::Outcome::Rejected { reason } => Some((id.0, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The runs as a table.
pub fn render(runs: &[ModeRun], out: &std::path::Path) -> String {
    let mut s = format!(
        "{:<9} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}\n",
        "mode",
        "steps",
        "tokens",
        "tokens/s",
        "running",
        "index%",
        "topk%",
        "swap%",
        "attn%",
        "graph%",
        "backup%",
        "miss%",
        "device MB",
        "host MB"
    );
    for r in runs {
        let x = &r.summary;
        let d = x.stages.decode().max(1e-12);
        s += &format!(
            "{:<9} {:>6} {:>8} {:>10.1} {:>8} {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.2}% {:>10.1} {:>10.1}\n",
            r.mode.to_string(),
            x.steps,
            x.tokens,
            x.tokens_per_s,
            x.max_running,
            100.0 * x.stages.indexer / d,
            100.0 * x.stages.top_k / d,
            100.0 * x.stages.swap_in / d,
            100.0 * x.stages.attention / d,
            100.0 * x.stages.graph / d,
            100.0 * x.stages.backup / d,
            100.0 * x.miss_ratio,
            x.peak_device_bytes as f64 / 1e6,
            x.peak_host_bytes as f64 / 1e6
        );
    }
    for r in runs.iter().filter(|r| r.summary.swap.prefetched > 0) {
        let x = &r.summary;
        s += &format!(
            "{}: prefetched {} rows ({:.1} MB of {:.1} MB host → device), {} used by a selection ({:.1}%), {} evicted unused\n",
            r.mode,
            x.swap.prefetched,
            x.swap.bytes_h2d_prefetch as f64 / 1e6,
            x.swap.bytes_h2d as f64 / 1e6,
            x.swap.prefetch_useful,
            100.0 * x.swap.prefetch_useful as f64 / x.swap.prefetched as f64,
            x.swap.prefetch_wasted
        );
    }
    for r in runs.iter().filter(|r| r.gpus > 1 || r.exchange_mb_per_step > 0.0) {
        let x = &r.summary.stages;
        s += &format!(
            "{}: {} GPUs, one engine each (requests round robin, host tier divided); a step is the slowest rank's, \
             tokens summed; collectives {:.2} MB per rank and step, {:.1}% of the decode time (in layers launched \
             one by one)\n",
            r.mode,
            r.gpus,
            r.exchange_mb_per_step,
            100.0 * x.exchange / x.decode().max(1e-12)
        );
    }
    for r in runs {
        let (f, t) = (&r.latency.first_decode, &r.latency.per_token);
        s += &format!(
            "{}: time to first decode p50 {:.1} ms, p99 {:.1} ms (max {:.1}); per token p50 {:.1} ms, p99 {:.1} ms (max {:.1})\n",
            r.mode,
            1e3 * f.p50,
            1e3 * f.p99,
            1e3 * f.max,
            1e3 * t.p50,
            1e3 * t.p99,
            1e3 * t.max
        );
        for (id, reason) in &r.rejected {
            s += &format!("{}: request {id} rejected: {reason}\n", r.mode);
        }
        if !r.refused.is_empty() {
            s += &format!("{}: {} requests refused by the full waiting queue\n", r.mode, r.refused.len());
        }
    }
    s += &format!("\nwrote {}/{{run.json, steps.csv}}\n", out.display());
    s
}
