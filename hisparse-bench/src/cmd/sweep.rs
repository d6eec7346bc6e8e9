//! `hisparse sweep`: steady-state decode throughput over concurrency x context length, in both
//! modes with the same kernels. Each point is measured over several windows (at least three) and
//! reported as the median with the min and max (the spread of a noisy machine); outputs are a
//! table, JSON, CSV and plots (`sweep_output.rs`).

use std::path::PathBuf;

use hisparse_engine::RequestSpec;
use hisparse_memory::{Mode, RequestId};

use super::common::{AttentionKernel, IndexerKernel};
use super::sweep_data::SweepMode;
pub use super::sweep_data::{SweepArgs, SweepReport};
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, progress};

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
    let trace = super::sweep_measure::SharedBuf::default();
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
                m => a.engine.engine(m.mode(), (context + life, context + life), "context")?,
            };
            backend = e.backend_name();
            if !tier_bytes.iter().any(|&(m, _)| m == mode.mode()) {
                tier_bytes.push((mode.mode(), e.device_tier_bytes() as u64));
            }
            let specs: Vec<RequestSpec> = (0..max_n)
                .map(|i| RequestSpec { id: RequestId(i as u64), prompt_tokens: context, output_tokens: life })
                .collect();
            let record = (mode == SweepMode::HiSparse && Some(&context) == a.context.first()).then_some(&trace);
            let (ps, per_step) =
                super::sweep_measure::measure(a, e.as_mut(), &specs, (context, mode), (&levels, steps), record, &bar)?;
            points.extend(ps);
            if mode == SweepMode::HiSparse {
                measured_misses.push((format!("context {context}"), per_step));
            }
        }
    }
    bar.finish_and_clear();
    let misses_by_buffer = super::sweep_measure::replay(&trace, g.top_k)?;
    // Resident alone, with a top-k that covers every request: the engines attend densely.
    let dense = modes == [SweepMode::Resident]
        && a.context.iter().all(|&c| {
            a.engine
                .engine_config(Mode::Resident, (c + life, c + life), "context")
                .is_ok_and(|e| !e.cache.keeps_index())
        });
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
        hierarchy: if dense {
            format!("dense attention: top-k {} covers every request (nothing selected, no index keys)", g.top_k)
        } else {
            super::sweep_output::hierarchy(&hs, a.engine.miss_fill(&hs)?, backend)
        },
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
