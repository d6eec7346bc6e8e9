//! What `hisparse sweep` is asked and what it reports: its arguments ([`SweepArgs`]), a point
//! of the sweep ([`Point`], made from measurement [`Window`]s) and the whole report
//! ([`SweepReport`]). The sweep itself is `sweep.rs` (one engine) and `sweep_ranks.rs` (one per
//! GPU); its outputs `sweep_output.rs`.

use std::path::PathBuf;

use hisparse_engine::StageTimes;
use hisparse_memory::Mode;
use serde::{Deserialize, Serialize};

use super::common::EngineArgs;
use super::run_args::ModeArg;
use crate::error::Result;

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
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    pub mode: ModeArg,
    /// Also measure the swap-in-free bound at every point: the hisparse step with the
    /// swap-in's copies taken out (`--miss-fill no-copies`; timing only, its outputs are
    /// wrong), and hisparse's efficiency against it. One engine only (not with --gpus).
    #[arg(long)]
    pub bound: bool,
    /// A real model as the input (`--model`, `--gguf`, with `--text`).
    #[cfg(feature = "model")]
    #[command(flatten)]
    pub source: super::model_source::ModelSource,
}

/// What a sweep's series measures: a serving mode, or the swap-in-free bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepMode {
    /// The whole KV on the device.
    Resident,
    /// The hierarchy.
    #[serde(rename = "hisparse")]
    HiSparse,
    /// Hybrid placement: whole KV on the device while it has room, demoted to the hierarchy
    /// when admitting others needs it.
    Hybrid,
    /// The hisparse step with the swap-in's copies taken out (`--bound`): timing only, its
    /// outputs are wrong.
    Bound,
}

impl SweepMode {
    /// The serving mode its engine runs in.
    pub fn mode(self) -> Mode {
        match self {
            Self::Resident => Mode::Resident,
            Self::HiSparse | Self::Bound => Mode::HiSparse,
            Self::Hybrid => Mode::Hybrid,
        }
    }
}

impl From<Mode> for SweepMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Resident => Self::Resident,
            Mode::HiSparse => Self::HiSparse,
            Mode::Hybrid => Self::Hybrid,
        }
    }
}

impl std::fmt::Display for SweepMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Resident => "resident",
            Self::HiSparse => "hisparse",
            Self::Hybrid => "hybrid",
            Self::Bound => "bound",
        })
    }
}

/// One (context, concurrency, mode) point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    /// Prompt tokens.
    pub context: usize,
    /// Requests submitted.
    pub concurrency: usize,
    /// Mode (or the bound).
    pub mode: SweepMode,
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

impl Point {
    /// Its tokens/s as the tables print it: the median, then the windows' range.
    pub fn tokens_per_s_cell(&self) -> String {
        format!("{:.1} [{:.1}-{:.1}]", self.tokens_per_s, self.tokens_per_s_min, self.tokens_per_s_max)
    }
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
    /// What the `bound` points are, where measured (`--bound`): timing only, outputs wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<String>,
    /// Per context: capacity, efficiency (with `--bound`) and peak against peak.
    #[serde(default)]
    pub headline: Vec<Headline>,
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
pub(super) fn point(context: usize, concurrency: usize, mode: SweepMode, windows: &[Window]) -> Point {
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
        stages_ms: scale_stages(&all.stages, 1e3 / n),
        exchange_mb_per_step: 0.0,
        copy_engine_share_of_misses: share(c.copy_engine_rows, c.misses),
    }
}

fn one() -> usize {
    1
}

/// `s` with every stage multiplied by `f`.
pub fn scale_stages(s: &StageTimes, f: f64) -> StageTimes {
    StageTimes {
        workload: s.workload * f,
        append: s.append * f,
        indexer: s.indexer * f,
        top_k: s.top_k * f,
        swap_in: s.swap_in * f,
        attention: s.attention * f,
        graph: s.graph * f,
        model: s.model * f,
        exchange: s.exchange * f,
        backup: s.backup * f,
        bookkeeping: s.bookkeeping * f,
        admission: s.admission * f,
    }
}

/// LRU's misses over the sweep's buffer sizes (1, 2 and 4 times `k`), replayed from recorded
/// selections (`sweep::replay` reads them from a trace's bytes; a model's sweep has them at hand).
pub(super) fn replay_records(
    header: &hisparse_policy::trace::TraceHeader,
    records: &[hisparse_policy::trace::TraceRecord],
    k: usize,
) -> Result<Vec<(usize, Vec<f64>)>> {
    let cfg = hisparse_policy::SimConfig {
        policies: vec![hisparse_policy::BuiltinPolicy::Lru.into()],
        buffer_sizes: hisparse_policy::compared_device_buffer_sizes(k),
        ..hisparse_policy::SimConfig::default()
    };
    let rep = hisparse_policy::simulate(header, records, &cfg, &|_| {})?;
    Ok(rep.results.iter().filter(|x| x.policy == "lru").map(|x| (x.device_buffer_size, x.series.clone())).collect())
}

/// One context's headline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    /// Prompt tokens.
    pub context: usize,
    /// Most requests decoding at once (mean over a point's windows), resident.
    pub resident_running: f64,
    /// The same, hisparse.
    pub hisparse_running: f64,
    /// `hisparse_running / resident_running`.
    pub capacity: f64,
    /// The concurrency at which hisparse first ran its most requests.
    pub at_concurrency: usize,
    /// hisparse's tokens/s over the bound's there (None without `--bound`).
    pub efficiency: Option<f64>,
    /// hisparse's best tokens/s over resident's best.
    pub peak_ratio: f64,
    /// The bound's best tokens/s over resident's best (None without `--bound`).
    pub bound_peak_ratio: Option<f64>,
}
