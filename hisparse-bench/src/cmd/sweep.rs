//! `hisparse sweep`: steady-state decode throughput over concurrency x context length, in both
//! modes with the same kernels. Each point is measured over several windows (at least three) and
//! reported as the median with the min and max (the spread of a noisy machine); outputs are a
//! table, JSON, CSV and plots (`sweep_output.rs`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hisparse_engine::{RequestSpec, StageTimes};
use hisparse_memory::{Mode, RequestId};
use hisparse_policy::trace::TraceReader;
use hisparse_policy::{SimConfig, simulate};
use serde::{Deserialize, Serialize};

use super::common::{AttentionKernel, EngineArgs, IndexerKernel};
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, interrupt, progress};

/// Options of `hisparse sweep`.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Engine options.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Concurrency levels (requests submitted at once), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub concurrency: Vec<usize>,
    /// Context lengths (prompt tokens), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "2048,4096")]
    pub context: Vec<usize>,
    /// Decode steps before measuring each level.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Decode steps per measurement window.
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Measurement windows per level (at least 3): the point is their median, with min and max.
    #[arg(long, default_value_t = 3)]
    pub windows: usize,
    /// Output folder (default: results/sweep), written whole: an earlier output of this program there is
    /// replaced, a folder holding other files is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// GPUs (ranks), one engine each with its share of the requests and of the host memory; with
    /// an emulated model the ranks exchange tokens around every FFN (NCCL on CUDA; `--gpus 1`:
    /// one engine with its one-rank collectives). On the CPU backend, that many CPU engines.
    /// Concurrency levels count requests over all ranks. Without it: one engine, no collectives.
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Modes to measure: both (the ratio needs them), or one alone — e.g. hisparse variants
    /// (--miss-fill ...) measured after one run of both, without running resident again.
    #[arg(long, value_enum, default_value_t = super::run::ModeArg::Both)]
    pub mode: super::run::ModeArg,
}

/// One (context, concurrency, mode) point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    /// Prompt tokens.
    pub context: usize,
    /// Requests submitted.
    pub concurrency: usize,
    /// Mode.
    pub mode: Mode,
    /// Requests decoding (mean over the windows); the rest waited for capacity.
    pub running: f64,
    /// Steady-state decode tokens per second: the median window.
    pub tokens_per_s: f64,
    /// The slowest window's tokens per second.
    pub tokens_per_s_min: f64,
    /// The fastest window's tokens per second.
    pub tokens_per_s_max: f64,
    /// Tokens per second of every window, in order.
    pub window_tokens_per_s: Vec<f64>,
    /// Mean decode step time (ms) over the windows.
    pub step_ms: f64,
    /// Misses per step (all requests and layers), mean over the windows.
    pub misses_per_step: f64,
    /// Misses over selected tokens in the windows.
    pub miss_ratio: f64,
    /// Share of decode time in swap-in (and backup).
    pub swap_in_share: f64,
    /// Host-to-device bytes per step of the misses (on the critical path), MB.
    pub h2d_mb_per_step: f64,
    /// Host-to-device bytes per step of prefetches (off the critical path on CUDA), MB.
    pub prefetch_mb_per_step: f64,
    /// Both over the step time: the PCIe bandwidth the point used, GB/s.
    pub h2d_gb_per_s: f64,
    /// Rows prefetched per step.
    pub prefetched_per_step: f64,
    /// Prefetched rows a selection then used, over rows prefetched (0 without prefetch).
    pub prefetch_useful_share: f64,
    /// Prefetched rows evicted unused, over rows prefetched.
    pub prefetch_wasted_share: f64,
    /// Kernel time per step (ms): indexer, top-k, swap-in, attention and replayed launch graphs;
    /// on CUDA from events.
    pub kernel_ms: f64,
    /// Mean time per step and stage over the windows (milliseconds).
    pub stages_ms: StageTimes,
    /// Collective bytes per rank and step (MB; `--gpus` with an emulated model, else 0).
    #[serde(default)]
    pub exchange_mb_per_step: f64,
    /// Of the misses, the rows the copy engine brought in (`--miss-fill copy-engine`, else 0;
    /// the rest the scatter kernel read from the host tier).
    #[serde(default)]
    pub copy_engine_share_of_misses: f64,
}

/// The sweep's output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepReport {
    /// Geometry preset.
    pub preset: String,
    /// Backend used.
    pub backend: String,
    /// Regular hot-buffer slots.
    pub device_buffer_size: usize,
    /// The hierarchy's policies: eviction policy, prefetcher, and who fills the misses
    /// (empty in reports from before it was recorded).
    #[serde(default)]
    pub hierarchy: String,
    /// GPUs (ranks) of the deployment measured; points sum their tokens (1 in older reports).
    #[serde(default = "one")]
    pub gpus: usize,
    /// Device bytes given to the KV cache (the budget).
    pub device_kv_bytes: u64,
    /// Device bytes the tiers really hold, per mode (whole pages and hot buffers of the budget).
    pub device_tier_bytes: Vec<(Mode, u64)>,
    /// The emulated non-attention part of the model (`none` when attention runs alone).
    pub emulation: String,
    /// Host-tier bytes (hisparse).
    pub host_tier_bytes: u64,
    /// Steps per window and windows per point.
    pub window: usize,
    /// Windows per point.
    pub windows: usize,
    /// Every point.
    pub points: Vec<Point>,
    /// The concurrency levels, and the step (of each measured series) at which each begins.
    pub level_starts: Vec<(usize, usize)>,
    /// Misses per step (mean per request and layer) over the hisparse runs, as measured.
    pub misses_over_time: Vec<(String, Vec<f64>)>,
    /// Misses per step over a recorded trace replayed under LRU at several buffer sizes.
    pub misses_by_buffer: Vec<(usize, Vec<f64>)>,
}

/// Sums over one measurement window.
#[derive(Default, Clone)]
pub(super) struct Window {
    tokens: usize,
    secs: f64,
    steps: usize,
    running: usize,
    counts: hisparse_policy::SwapCounts,
    swap: f64,
    kernels: f64,
    stages: StageTimes,
}

impl Window {
    pub(super) fn add(&mut self, m: &hisparse_engine::StepMetrics) {
        self.tokens += m.tokens;
        self.secs += m.seconds;
        self.steps += 1;
        self.running += m.running;
        self.counts += m.swap;
        let st = &m.stages;
        self.swap += st.swap_in + st.backup;
        self.kernels += st.indexer + st.top_k + st.swap_in + st.attention + st.graph + st.model + st.exchange;
        self.stages.add(st);
    }

    fn tokens_per_s(&self) -> f64 {
        if self.secs > 0.0 { self.tokens as f64 / self.secs } else { 0.0 }
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole > 0 { part as f64 / whole as f64 } else { 0.0 }
}

/// The point of `windows` (at least one).
pub(super) fn point(context: usize, concurrency: usize, mode: Mode, windows: &[Window]) -> Point {
    let mut all = Window::default();
    for w in windows {
        all.tokens += w.tokens;
        all.secs += w.secs;
        all.steps += w.steps;
        all.running += w.running;
        all.counts += w.counts;
        all.swap += w.swap;
        all.kernels += w.kernels;
        all.stages.add(&w.stages);
    }
    let rates: Vec<f64> = windows.iter().map(Window::tokens_per_s).collect();
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let n = all.steps.max(1) as f64;
    let c = all.counts;
    Point {
        context,
        concurrency,
        mode,
        running: all.running as f64 / n,
        tokens_per_s: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        tokens_per_s_min: sorted.first().copied().unwrap_or(0.0),
        tokens_per_s_max: sorted.last().copied().unwrap_or(0.0),
        window_tokens_per_s: rates,
        step_ms: 1e3 * all.secs / n,
        misses_per_step: c.misses as f64 / n,
        miss_ratio: c.miss_ratio(),
        swap_in_share: if all.secs > 0.0 { all.swap / all.secs } else { 0.0 },
        // The engine's host-to-device bytes include the prefetches'.
        h2d_mb_per_step: c.bytes_h2d.saturating_sub(c.bytes_h2d_prefetch) as f64 / n / 1e6,
        prefetch_mb_per_step: c.bytes_h2d_prefetch as f64 / n / 1e6,
        h2d_gb_per_s: if all.secs > 0.0 { c.bytes_h2d as f64 / all.secs / 1e9 } else { 0.0 },
        prefetched_per_step: c.prefetched as f64 / n,
        prefetch_useful_share: share(c.prefetch_useful, c.prefetched),
        prefetch_wasted_share: share(c.prefetch_wasted, c.prefetched),
        kernel_ms: 1e3 * all.kernels / n,
        stages_ms: super::sweep_output::scale_stages(&all.stages, 1e3 / n),
        exchange_mb_per_step: 0.0,
        copy_engine_share_of_misses: share(c.copy_engine_rows, c.misses),
    }
}

fn one() -> usize {
    1
}

#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks every flag before any engine starts; returns the sorted levels and the steps per level.
fn check(a: &SweepArgs) -> Result<(Vec<usize>, usize)> {
    if a.concurrency.is_empty() {
        return Err(BenchError::flag("concurrency", "", "give at least one level"));
    }
    for &n in &a.concurrency {
        guard::within("concurrency", n, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
    }
    if a.context.is_empty() {
        return Err(BenchError::flag("context", "", "give at least one length"));
    }
    if let Some(n) = a.gpus {
        guard::within("gpus", n, 1, 1024)?;
        if a.engine.host_tier_file.is_some() {
            return Err(BenchError::flag("gpus", n, "the ranks cannot share one host-tier file"));
        }
    }
    for &c in &a.context {
        guard::at_least_one("context", c)?;
    }
    guard::at_least_one("window", a.window)?;
    if a.windows < 3 {
        return Err(BenchError::flag("windows", a.windows, "a point's spread needs at least 3 windows"));
    }
    let measured = a.window.checked_mul(a.windows).ok_or_else(|| {
        let (flag, v) = if a.window >= a.windows { ("window", a.window) } else { ("windows", a.windows) };
        BenchError::flag(flag, v, "window x windows overflows")
    })?;
    let steps = guard::sum(("warmup", a.warmup), ("window", measured))?;
    let mut levels = a.concurrency.clone();
    levels.sort_unstable();
    levels.dedup();
    Ok((levels, steps))
}

/// Runs the sweep; returns the report and the output folder.
pub fn run(a: &SweepArgs) -> Result<(SweepReport, PathBuf)> {
    let (levels, steps) = check(a)?;
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    let model = a.engine.model()?;
    // Requests outlive the sweep (and the trace recorded after it): each level only admits
    // what it adds to the previous one.
    let life = (levels.len() + 1).checked_mul(steps).and_then(|s| s.checked_add(1)).ok_or_else(|| {
        let (flag, v) = guard::largest(&[("window", a.window, 4), ("windows", a.windows, 3), ("warmup", a.warmup, 3)]);
        BenchError::flag(flag, v, "the sweep's steps overflow")
    })?;
    for &c in &a.context {
        let tokens = guard::sum(("context", c), ("window", life))?;
        a.engine.check_request_fits(&g, &hs, Mode::HiSparse, "context", c, tokens)?;
    }
    let out = OutputDir::prepare("out", a.out.as_deref().unwrap_or(std::path::Path::new("results/sweep")))?;
    let max_n = levels.last().copied().unwrap_or(1);
    let modes = a.mode.modes();
    let total = levels.iter().sum::<usize>().saturating_mul(a.context.len() * modes.len()).saturating_mul(steps);
    let bar = progress::bar(total as u64, "request-steps");
    let mut points = Vec::new();
    let mut measured_misses = Vec::new();
    let mut tier_bytes = Vec::new();
    let mut backend = "cpu";
    let trace = SharedBuf::default();
    for &context in &a.context {
        for &mode in &modes {
            if let Some(ranks) = a.gpus {
                bar.set_message(format!("context {context}, {mode}: {ranks} ranks"));
                let run = super::sweep_ranks::measure(a, ranks, mode, (context, life), &levels, steps, &bar)?;
                backend = run.backend;
                if !tier_bytes.iter().any(|&(m, _)| m == mode) {
                    tier_bytes.push((mode, run.device_tier_bytes));
                }
                let (ps, per_step) = run.points(a, context, mode, &levels, g.layers);
                points.extend(ps);
                if mode == Mode::HiSparse {
                    measured_misses.push((format!("context {context}"), per_step));
                }
                continue;
            }
            bar.set_message(format!("context {context}, {mode}: starting the engine"));
            let mut e = a.engine.engine(mode, context + life, "context")?;
            backend = e.backend_name();
            if !tier_bytes.iter().any(|&(m, _)| m == mode) {
                tier_bytes.push((mode, e.device_tier_bytes() as u64));
            }
            for i in 0..max_n {
                e.submit(RequestSpec { id: RequestId(i as u64), prompt_tokens: context, output_tokens: life })?;
            }
            let mut per_step = Vec::new();
            for &n in &levels {
                bar.set_message(format!("context {context}, {n} requests, {mode}"));
                let mut rc = e.runtime().get();
                rc.max_running = n;
                e.runtime().set(rc)?;
                let mut windows = vec![Window::default(); a.windows];
                for s in 0..steps {
                    interrupt::check(|| format!("measuring context {context}, {n} requests, {mode}"))?;
                    let r = e.step()?;
                    bar.inc(n as u64);
                    let m = &r.metrics;
                    per_step.push(m.swap.misses as f64 / (m.running * g.layers).max(1) as f64);
                    if s >= a.warmup {
                        windows[(s - a.warmup) / a.window].add(m);
                    }
                }
                points.push(point(context, n, mode, &windows));
            }
            if mode == Mode::HiSparse {
                measured_misses.push((format!("context {context}"), per_step));
                if Some(&context) == a.context.first() {
                    // The buffer-size comparison replays selections recorded after the
                    // measurements (recording slows a step down).
                    bar.set_message(format!("context {context}: selection trace for the buffer-size plot"));
                    e.record_trace(Box::new(trace.clone()))?;
                    for _ in 0..steps {
                        interrupt::check(|| format!("recording the selection trace of context {context}"))?;
                        e.step()?;
                    }
                    e.finish_trace()?;
                }
            }
        }
    }
    bar.finish_and_clear();
    let misses_by_buffer = replay(&trace, g.top_k)?;
    let report = SweepReport {
        preset: g.name.clone(),
        backend: backend.into(),
        emulation: format!(
            "{}{}{}{}",
            model.map_or_else(|| "none: attention only".to_owned(), |m| m.describe()),
            if a.engine.index_queries == "fp8" {
                "; indexer queries fp8 (e4m3, a power-of-two scale per head)"
            } else {
                ""
            },
            if a.engine.attention_kernel == AttentionKernel::MmaSync && backend == "cuda" {
                "; attention on mma.sync"
            } else {
                ""
            },
            if a.engine.indexer_kernel == IndexerKernel::MmaSync && backend == "cuda" {
                "; indexer on mma.sync"
            } else {
                ""
            }
        ),
        device_buffer_size: hs.device_buffer_size,
        gpus: a.gpus.unwrap_or(1),
        hierarchy: super::sweep_output::hierarchy(&hs, backend),
        device_kv_bytes: hs.device_kv_bytes,
        device_tier_bytes: tier_bytes,
        host_tier_bytes: hs.host_bytes(),
        window: a.window,
        windows: a.windows,
        points,
        level_starts: levels.iter().enumerate().map(|(i, &n)| (n, i * steps)).collect(),
        misses_over_time: measured_misses,
        misses_by_buffer,
    };
    super::sweep_output::write(&report, &out)?;
    Ok((report, out.commit()?))
}

/// Replays the recorded selections under LRU at 1, 2 and 4 times top-k slots.
fn replay(trace: &SharedBuf, k: usize) -> Result<Vec<(usize, Vec<f64>)>> {
    let bytes = trace.0.lock().map_err(|_| BenchError::Check("trace buffer poisoned".into()))?.clone();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = TraceReader::new(bytes.as_slice())?;
    let header = r.header().clone();
    let records = r.by_ref().collect::<std::result::Result<Vec<_>, _>>()?;
    let cfg = SimConfig {
        policies: vec![hisparse_policy::BuiltinPolicy::Lru.into()],
        buffer_sizes: vec![k, 2 * k, 4 * k],
        ..SimConfig::default()
    };
    let rep = simulate(&header, &records, &cfg, &|_| {})?;
    Ok(rep.results.iter().filter(|x| x.policy == "lru").map(|x| (x.buffer_slots, x.series.clone())).collect())
}
