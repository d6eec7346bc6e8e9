//! `hisparse sweep`: steady-state decode throughput over concurrency x context length, in both
//! modes with the same kernels. Each point is measured over several windows (at least three) and
//! reported as the median with the min and max (the spread of a noisy machine); outputs are a
//! table, JSON, CSV and plots (`sweep_output.rs`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hisparse_engine::RequestSpec;
use hisparse_memory::{Mode, RequestId};
use hisparse_policy::trace::TraceReader;

use super::common::{AttentionKernel, IndexerKernel};
pub use super::sweep_data::{SweepArgs, SweepReport};
use super::sweep_data::{SweepMode, Window, point};
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, interrupt, progress};

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
        if a.bound {
            return Err(BenchError::flag("gpus", n, "--bound measures one engine; leave --gpus out"));
        }
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
    // The sweep records no trace of a model's selections: a score margin is not read.
    #[cfg(feature = "model")]
    a.source.refuse_unread(false)?;
    #[cfg(feature = "model")]
    if a.source.given() {
        return super::sweep_model::run(a, &levels, steps);
    }
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    let model = a.engine.emulated_model()?;
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
    let mut modes: Vec<SweepMode> = a.mode.modes().into_iter().map(SweepMode::from).collect();
    if a.bound {
        modes.push(SweepMode::Bound);
    }
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
                let run = super::sweep_ranks::measure(a, ranks, mode.mode(), (context, life), &levels, steps, &bar)?;
                backend = run.backend;
                if !tier_bytes.iter().any(|&(m, _)| m == mode.mode()) {
                    tier_bytes.push((mode.mode(), run.device_tier_bytes));
                }
                let (ps, per_step) = run.points(a, context, mode, &levels, g.layers);
                points.extend(ps);
                if mode == SweepMode::HiSparse {
                    measured_misses.push((format!("context {context}"), per_step));
                }
                continue;
            }
            bar.set_message(format!("context {context}, {mode}: starting the engine"));
            let mut e = match mode {
                SweepMode::Bound => a.engine.bound_engine(context + life, "context")?,
                m => a.engine.engine(m.mode(), context + life, "context")?,
            };
            backend = e.backend_name();
            if !tier_bytes.iter().any(|&(m, _)| m == mode.mode()) {
                tier_bytes.push((mode.mode(), e.device_tier_bytes() as u64));
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
            if mode == SweepMode::HiSparse {
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
    let mut report = SweepReport {
        preset: g.name.clone(),
        backend: backend.into(),
        emulation: format!(
            "{}{}{}{}",
            model.map_or_else(|| "none: attention only".to_owned(), |m| m.describe()),
            if a.engine.index_queries == hisparse_kernels::IndexerQueries::Fp8 {
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
        bound: a.bound.then(|| super::common::NO_COPIES.to_owned()),
        headline: Vec::new(),
    };
    report.headline = super::sweep_headline::headlines(&report);
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
    super::sweep_data::replay_records(&header, &records, k)
}
