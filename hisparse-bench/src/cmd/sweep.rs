//! `hisparse sweep`: steady-state decode throughput over concurrency x context length, in both
//! modes with the same kernels; a table, JSON, CSV, and two SVG plots — throughput against
//! concurrency (the HiSparse blog's headline figure) and misses per step over time for several
//! buffer sizes (the largest hisparse point's selections replayed under LRU).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hisparse_engine::{RequestSpec, StageTimes};
use hisparse_memory::{Mode, RequestId};
use hisparse_policy::trace::TraceReader;
use hisparse_policy::{SimConfig, simulate};
use serde::Serialize;

use super::common::EngineArgs;
use crate::error::{BenchError, Result};
use crate::progress;
use crate::report::plot::{Chart, Series, line_chart, misses_over_time};
use crate::report::{Csv, ensure_dir, write_json, write_text};

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
    /// Decode steps before measuring.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Decode steps measured.
    #[arg(long, default_value_t = 10)]
    pub window: usize,
    /// Output folder (default: results/sweep).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One (context, concurrency, mode) point.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Prompt tokens.
    pub context: usize,
    /// Requests submitted.
    pub concurrency: usize,
    /// Mode.
    pub mode: Mode,
    /// Requests decoding (mean over the window); the rest waited for capacity.
    pub running: f64,
    /// Steady-state decode tokens per second over the window.
    pub tokens_per_s: f64,
    /// Mean decode step time (ms).
    pub step_ms: f64,
    /// Misses per step (all requests and layers), mean over the window.
    pub misses_per_step: f64,
    /// Misses over selected tokens in the window.
    pub miss_ratio: f64,
    /// Share of decode time in swap-in (and backup).
    pub swap_in_share: f64,
    /// Kernel time per step (ms): indexer, top-k, swap-in, attention and replayed launch graphs;
    /// on CUDA from events.
    pub kernel_ms: f64,
    /// Mean time per step and stage over the window (milliseconds).
    pub stages_ms: StageTimes,
}

/// The sweep's output.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    /// Geometry preset.
    pub preset: String,
    /// Backend used.
    pub backend: String,
    /// Regular hot-buffer slots.
    pub device_buffer_size: usize,
    /// Device bytes for the KV cache.
    pub device_kv_bytes: u64,
    /// The emulated non-attention part of the model (`none` when attention runs alone).
    pub emulation: String,
    /// Host-tier bytes (hisparse).
    pub host_tier_bytes: u64,
    /// Every point.
    pub points: Vec<Point>,
    /// Misses per step (mean per request and layer) over the hisparse runs, as measured.
    pub misses_over_time: Vec<(String, Vec<f64>)>,
    /// Misses per step over a recorded trace replayed under LRU at several buffer sizes.
    pub misses_by_buffer: Vec<(usize, Vec<f64>)>,
}

/// Sums over a measurement window.
#[derive(Default)]
struct Window {
    tokens: usize,
    secs: f64,
    running: usize,
    misses: u64,
    hits: u64,
    swap: f64,
    kernels: f64,
    stages: StageTimes,
}

impl Window {
    fn add(&mut self, m: &hisparse_engine::StepMetrics) {
        self.tokens += m.tokens;
        self.secs += m.seconds;
        self.running += m.running;
        self.misses += m.misses;
        self.hits += m.hits;
        let st = &m.stages;
        self.swap += st.swap_in + st.backup;
        self.kernels += st.indexer + st.top_k + st.swap_in + st.attention + st.graph + st.model;
        self.stages.add(st);
    }

    fn point(&self, context: usize, concurrency: usize, mode: Mode, window: usize) -> Point {
        let w = window as f64;
        let sel = self.hits + self.misses;
        Point {
            context,
            concurrency,
            mode,
            running: self.running as f64 / w,
            tokens_per_s: if self.secs > 0.0 { self.tokens as f64 / self.secs } else { 0.0 },
            step_ms: 1e3 * self.secs / w,
            misses_per_step: self.misses as f64 / w,
            miss_ratio: if sel > 0 { self.misses as f64 / sel as f64 } else { 0.0 },
            swap_in_share: if self.secs > 0.0 { self.swap / self.secs } else { 0.0 },
            kernel_ms: 1e3 * self.kernels / w,
            stages_ms: scale_stages(&self.stages, 1e3 / w),
        }
    }
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

/// `s` with every stage multiplied by `f`.
fn scale_stages(s: &StageTimes, f: f64) -> StageTimes {
    StageTimes {
        workload: s.workload * f,
        append: s.append * f,
        indexer: s.indexer * f,
        top_k: s.top_k * f,
        swap_in: s.swap_in * f,
        attention: s.attention * f,
        graph: s.graph * f,
        model: s.model * f,
        backup: s.backup * f,
        bookkeeping: s.bookkeeping * f,
        admission: s.admission * f,
    }
}

/// Runs the sweep; returns the report and the output folder.
pub fn run(a: &SweepArgs) -> Result<(SweepReport, PathBuf)> {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) {
        return Err(BenchError::flag("concurrency", format!("{:?}", a.concurrency), "every level must be at least 1"));
    }
    if a.context.is_empty() || a.context.contains(&0) {
        return Err(BenchError::flag("context", format!("{:?}", a.context), "every length must be at least 1"));
    }
    if a.window == 0 {
        return Err(BenchError::flag("window", 0, "must be at least 1"));
    }
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    let model = a.engine.model()?;
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("results/sweep"));
    ensure_dir(&out)?;
    let mut levels = a.concurrency.clone();
    levels.sort_unstable();
    levels.dedup();
    let max_n = levels.last().copied().unwrap_or(1);
    let steps = a.warmup + a.window;
    // Requests outlive the sweep (and the trace recorded after it): each level only admits
    // what it adds to the previous one.
    let life = (levels.len() + 1) * steps + 1;
    let total: usize = a.context.len() * levels.iter().sum::<usize>() * 2 * steps;
    let bar = progress::bar(total as u64, "request-steps");
    let mut points = Vec::new();
    let mut measured_misses = Vec::new();
    let mut backend = "cpu";
    let trace = SharedBuf::default();
    for &context in &a.context {
        for mode in [Mode::Resident, Mode::HiSparse] {
            bar.set_message(format!("context {context}, {mode}: starting the engine"));
            let mut e = a.engine.engine(mode, context + life)?;
            backend = e.backend_name();
            for i in 0..max_n {
                e.submit(RequestSpec { id: RequestId(i as u64), prompt_tokens: context, output_tokens: life })?;
            }
            let mut per_step = Vec::new();
            for &n in &levels {
                bar.set_message(format!("context {context}, {n} requests, {mode}"));
                let mut rc = e.runtime().get();
                rc.max_running = n;
                e.runtime().set(rc)?;
                let mut w = Window::default();
                for s in 0..steps {
                    let r = e.step()?;
                    bar.inc(n as u64);
                    let m = &r.metrics;
                    per_step.push(m.misses as f64 / (m.running * g.layers).max(1) as f64);
                    if s >= a.warmup {
                        w.add(m);
                    }
                }
                points.push(w.point(context, n, mode, a.window));
            }
            if mode == Mode::HiSparse {
                measured_misses.push((format!("context {context}, hisparse (measured)"), per_step));
                if Some(&context) == a.context.first() {
                    // The buffer-size comparison replays selections recorded after the
                    // measurements (recording slows a step down).
                    bar.set_message(format!("context {context}: selection trace for the buffer-size plot"));
                    e.record_trace(Box::new(trace.clone()))?;
                    for _ in 0..steps {
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
        emulation: model.map_or_else(|| "none: attention only".to_owned(), |m| m.describe()),
        device_buffer_size: hs.device_buffer_size,
        device_kv_bytes: hs.device_kv_bytes,
        host_tier_bytes: hs.host_bytes(),
        points,
        misses_over_time: measured_misses,
        misses_by_buffer,
    };
    write_outputs(&report, &out)?;
    Ok((report, out))
}

/// Replays the recorded selections under LRU at 1, 2 and 4 times top-k slots.
fn replay(trace: &SharedBuf, k: usize) -> Result<Vec<(usize, Vec<f64>)>> {
    let bytes = trace.0.lock().map_err(|_| BenchError::Check("trace buffer poisoned".into()))?.clone();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = TraceReader::new(bytes.as_slice())?;
    let header = *r.header();
    let records = r.by_ref().collect::<std::result::Result<Vec<_>, _>>()?;
    let cfg = SimConfig { policies: vec!["lru".into()], buffer_sizes: vec![k, 2 * k, 4 * k], seed: 0, row_bytes: 0 };
    let rep = simulate(&header, &records, &cfg, &|_| {})?;
    Ok(rep.results.iter().filter(|x| x.policy == "lru").map(|x| (x.buffer_slots, x.series.clone())).collect())
}

fn write_outputs(r: &SweepReport, out: &std::path::Path) -> Result<()> {
    write_json(out, "sweep.json", r)?;
    let mut csv = Csv::new(&[
        "context",
        "concurrency",
        "mode",
        "running",
        "tokens_per_s",
        "step_ms",
        "misses_per_step",
        "miss_ratio",
        "swap_in_share",
        "kernel_ms",
    ]);
    for p in &r.points {
        csv.row([
            p.context.to_string(),
            p.concurrency.to_string(),
            p.mode.to_string(),
            format!("{:.2}", p.running),
            format!("{:.2}", p.tokens_per_s),
            format!("{:.3}", p.step_ms),
            format!("{:.1}", p.misses_per_step),
            format!("{:.5}", p.miss_ratio),
            format!("{:.4}", p.swap_in_share),
            format!("{:.3}", p.kernel_ms),
        ]);
    }
    write_text(out, "sweep.csv", csv.text())?;
    let mut contexts: Vec<usize> = r.points.iter().map(|p| p.context).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut series = Vec::new();
    for &c in &contexts {
        for mode in [Mode::Resident, Mode::HiSparse] {
            series.push(Series {
                label: format!("{mode}, context {c}"),
                points: r
                    .points
                    .iter()
                    .filter(|p| p.context == c && p.mode == mode)
                    .map(|p| (p.concurrency as f64, p.tokens_per_s))
                    .collect(),
                dashed: mode == Mode::Resident,
            });
        }
    }
    let emulated = if r.emulation.starts_with("none") { "attention only" } else { "non-attention part emulated" };
    let title = format!("Decode throughput vs concurrency ({}, {}, {})", r.preset, r.backend.to_uppercase(), emulated);
    let chart = Chart {
        title: &title,
        x_label: "concurrent requests",
        y_label: "decode tokens / s (steady state)",
        log_x: true,
    };
    line_chart(&out.join("throughput.svg"), &chart, &series)?;
    if !r.misses_over_time.is_empty() {
        misses_over_time(&out.join("misses_over_time.svg"), r.misses_over_time.iter().cloned())?;
    }
    if !r.misses_by_buffer.is_empty() {
        let lines = r.misses_by_buffer.iter().map(|(b, v)| (format!("LRU, {b} slots (replayed trace)"), v.clone()));
        misses_over_time(&out.join("misses_by_buffer.svg"), lines)?;
    }
    Ok(())
}

/// The sweep as a table.
pub fn render(r: &SweepReport, out: &std::path::Path) -> String {
    let mut s = format!(
        "hisparse sweep: {} geometry, {} backend, buffer {} slots, device KV budget {:.1} GiB, host tier {:.1} GiB\nmodel: {}\n\n{:>8} {:>11} {:>11} {:>11} {:>13} {:>13} {:>9} {:>12}\n",
        r.preset,
        r.backend,
        r.device_buffer_size,
        r.device_kv_bytes as f64 / f64::from(1 << 30),
        r.host_tier_bytes as f64 / f64::from(1 << 30),
        r.emulation,
        "context",
        "concurrency",
        "resident",
        "hisparse",
        "resident tok/s",
        "hisparse tok/s",
        "ratio",
        "hs miss %"
    );
    let mut keys: Vec<(usize, usize)> = r.points.iter().map(|p| (p.context, p.concurrency)).collect();
    keys.sort_unstable();
    keys.dedup();
    for (c, n) in keys {
        let get = |m: Mode| r.points.iter().find(|p| p.context == c && p.concurrency == n && p.mode == m);
        if let (Some(res), Some(hs)) = (get(Mode::Resident), get(Mode::HiSparse)) {
            s += &format!(
                "{:>8} {:>11} {:>11.1} {:>11.1} {:>13.1} {:>13.1} {:>8.2}x {:>11.2}%\n",
                c,
                n,
                res.running,
                hs.running,
                res.tokens_per_s,
                hs.tokens_per_s,
                hs.tokens_per_s / res.tokens_per_s.max(1e-9),
                100.0 * hs.miss_ratio
            );
        }
    }
    s += "\n(resident / hisparse: requests decoding at once; the rest waited for capacity)\n";
    s += &format!(
        "wrote {}/sweep.json, sweep.csv\nplots: {}/throughput.svg, {}/misses_over_time.svg, {}/misses_by_buffer.svg\n",
        out.display(),
        out.display(),
        out.display(),
        out.display()
    );
    s
}
