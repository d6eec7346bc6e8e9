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
    /// Every point.
    pub points: Vec<Point>,
    /// Misses per step over time (mean per request and layer) at several buffer sizes.
    pub misses_over_time: Vec<(usize, Vec<f64>)>,
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
    let out = a.out.clone().unwrap_or_else(|| PathBuf::from("results/sweep"));
    ensure_dir(&out)?;
    let steps = a.warmup + a.window;
    let total: usize = a.context.len() * a.concurrency.iter().sum::<usize>() * 2 * steps;
    let bar = progress::bar(total as u64, "request-steps");
    let mut points = Vec::new();
    let mut backend = "cpu";
    let trace = SharedBuf::default();
    let max_n = a.concurrency.iter().copied().max().unwrap_or(1);
    for &context in &a.context {
        for &n in &a.concurrency {
            for mode in [Mode::Resident, Mode::HiSparse] {
                bar.set_message(format!("context {context}, {n} requests, {mode}"));
                let mut e = a.engine.engine(mode, context + steps)?;
                backend = e.backend_name();
                for i in 0..n {
                    e.submit(RequestSpec { id: RequestId(i as u64), prompt_tokens: context, output_tokens: steps })?;
                }
                let (mut tokens, mut secs, mut running, mut misses, mut hits, mut swap, mut kernels) =
                    (0usize, 0f64, 0usize, 0u64, 0u64, 0f64, 0f64);
                let mut stages = StageTimes::default();
                for s in 0..steps {
                    let r = e.step()?;
                    bar.inc(n as u64);
                    if s >= a.warmup {
                        tokens += r.metrics.tokens;
                        secs += r.metrics.seconds;
                        running += r.metrics.running;
                        misses += r.metrics.misses;
                        hits += r.metrics.hits;
                        swap += r.metrics.stages.swap_in + r.metrics.stages.backup;
                        let st = &r.metrics.stages;
                        kernels += st.indexer + st.top_k + st.swap_in + st.attention + st.graph;
                        stages.add(st);
                    }
                }
                let w = a.window as f64;
                points.push(Point {
                    context,
                    concurrency: n,
                    mode,
                    running: running as f64 / w,
                    tokens_per_s: if secs > 0.0 { tokens as f64 / secs } else { 0.0 },
                    step_ms: 1e3 * secs / w,
                    misses_per_step: misses as f64 / w,
                    miss_ratio: if hits + misses > 0 { misses as f64 / (hits + misses) as f64 } else { 0.0 },
                    swap_in_share: if secs > 0.0 { swap / secs } else { 0.0 },
                    kernel_ms: 1e3 * kernels / w,
                    stages_ms: scale_stages(&stages, 1e3 / w),
                });
            }
        }
    }
    // The misses-over-time trace comes from a separate, untimed run of the largest point of the
    // first context (recording slows a step down).
    if let Some(&context) = a.context.first() {
        bar.set_message("selection trace for the misses-over-time plot");
        let mut e = a.engine.engine(Mode::HiSparse, context + steps)?;
        e.record_trace(Box::new(trace.clone()))?;
        for i in 0..max_n {
            e.submit(RequestSpec { id: RequestId(i as u64), prompt_tokens: context, output_tokens: steps })?;
        }
        for _ in 0..steps {
            e.step()?;
        }
        e.finish_trace()?;
    }
    bar.finish_and_clear();
    let misses_over_time = replay(&trace, g.top_k)?;
    let report = SweepReport {
        preset: g.name.clone(),
        backend: backend.into(),
        device_buffer_size: hs.device_buffer_size,
        device_kv_bytes: hs.device_kv_bytes,
        points,
        misses_over_time,
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
    let title = format!("Decode throughput vs concurrency ({}, {} backend)", r.preset, r.backend.to_uppercase());
    let chart = Chart {
        title: &title,
        x_label: "concurrent requests",
        y_label: "decode tokens / s (steady state)",
        log_x: true,
    };
    line_chart(&out.join("throughput.svg"), &chart, &series)?;
    if !r.misses_over_time.is_empty() {
        let lines = r.misses_over_time.iter().map(|(b, v)| (format!("LRU, {b} slots"), v.clone()));
        misses_over_time(&out.join("misses_over_time.svg"), lines)?;
    }
    Ok(())
}

/// The sweep as a table.
pub fn render(r: &SweepReport, out: &std::path::Path) -> String {
    let mut s = format!(
        "hisparse sweep: {} geometry, {} backend, buffer {} slots, device KV budget {:.0} MiB\n\n{:>8} {:>11} {:>11} {:>11} {:>13} {:>13} {:>9} {:>12}\n",
        r.preset,
        r.backend,
        r.device_buffer_size,
        r.device_kv_bytes as f64 / f64::from(1 << 20),
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
        "wrote {}/sweep.json, sweep.csv\nplots: {}/throughput.svg, {}/misses_over_time.svg\n",
        out.display(),
        out.display(),
        out.display()
    );
    s
}
