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
use crate::report::{AtomicFile, Csv, OutputDir};
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
    /// Output folder (default: results/run; this command's files in it are replaced).
    #[arg(long)]
    pub out: Option<PathBuf>,
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
    if let Some(r) = a.arrival_rate
        && !(r.is_finite() && r > 0.0)
    {
        return Err(BenchError::flag("arrival-rate", r, "requests per second: a positive number"));
    }
    for &o in &a.output {
        guard::at_least_one("output", o)?;
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
        let typical = a.context.iter().copied().min().unwrap_or(1) + a.output.iter().copied().min().unwrap_or(1);
        let mut e = a.engine.engine(mode, typical, "context")?;
        if mode == Mode::HiSparse
            && let Some(f) = trace_file.as_mut()
        {
            let clone = f.writer().get_ref().try_clone().map_err(|source| BenchError::Io {
                path: a.record_trace.as_ref().map_or_else(String::new, |p| p.display().to_string()),
                source,
            })?;
            e.record_trace(Box::new(std::io::BufWriter::new(clone)))?;
        }
        let specs: Vec<RequestSpec> = (0..a.concurrency)
            .map(|i| RequestSpec {
                id: RequestId(i as u64),
                prompt_tokens: a.context[i % a.context.len()],
                output_tokens: a.output[i % a.output.len()],
            })
            .collect();
        let times = a.arrival_rate.map(|r| super::arrivals::poisson_times(specs.len(), r, a.engine.seed));
        let all: u64 = specs.iter().map(|s| s.output_tokens as u64).sum();
        let bar = progress::bar(all, &format!("{mode} tokens"));
        let mut rejected = Vec::new();
        let mut summary = RunSummary::default();
        let (mut steps, mut latencies) = (Vec::new(), Vec::new());
        let refused = super::arrivals::drive(e.as_mut(), &specs, times.as_deref(), |r| {
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
        for (id, o) in e.outcomes() {
            if let hisparse_engine::Outcome::Rejected { reason } = o {
                rejected.push((id.0, reason.clone()));
            }
        }
        let latency = LatencySummary::of(&latencies);
        runs.push(ModeRun { mode, summary, steps, rejected, refused, latency });
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
                s.hits.to_string(),
                s.misses.to_string(),
                s.max_misses.to_string(),
                s.bytes_h2d.to_string(),
                s.bytes_d2h.to_string(),
                s.prefetched.to_string(),
                s.prefetch_useful.to_string(),
                s.prefetch_wasted.to_string(),
                s.bytes_h2d_prefetch.to_string(),
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
    Ok((runs, out.keep()))
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
    for r in runs.iter().filter(|r| r.summary.prefetched > 0) {
        let x = &r.summary;
        s += &format!(
            "{}: prefetched {} rows ({:.1} MB of {:.1} MB host → device), {} used by a selection ({:.1}%), {} evicted unused\n",
            r.mode,
            x.prefetched,
            x.bytes_h2d_prefetch as f64 / 1e6,
            x.bytes_h2d as f64 / 1e6,
            x.prefetch_useful,
            100.0 * x.prefetch_useful as f64 / x.prefetched as f64,
            x.prefetch_wasted
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
