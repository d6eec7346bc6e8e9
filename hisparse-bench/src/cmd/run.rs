//! `hisparse run`: one configuration, in one or both modes: requests (all at once, or arriving by
//! a Poisson process: `--arrival-rate`) decoded to the end with continuous batching, with the
//! run's summary (throughput, time per stage, hits and misses, bytes moved and held, time to
//! first decode and per-token latency percentiles) printed and written as JSON, and every
//! step's metrics as CSV.

use std::path::PathBuf;

use hisparse_engine::RequestSpec;
use hisparse_memory::{Mode, RequestId};

pub use super::run_args::{ModeArg, ModeRun, RunArgs};
use super::run_args::{request_lengths, trace_file};
use super::run_output::write_outputs;
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::guard;

/// Runs; returns the results and the output folder.
pub fn run(a: &RunArgs) -> Result<(Vec<ModeRun>, PathBuf)> {
    #[cfg(feature = "model")]
    a.source.refuse_unread(a.record_trace.is_some())?;
    #[cfg(feature = "model")]
    if a.source.given() {
        return super::run_model::run(a);
    }
    guard::within("concurrency", a.concurrency, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
    if a.context.is_empty() {
        return Err(BenchError::flag("context", "", "give at least one length"));
    }
    if a.output.is_empty() {
        return Err(BenchError::flag("output", "", "give at least one length"));
    }
    super::run_engine::check_arrival_rate(a)?;
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
    refuse_a_run_admitting_nothing(a)?;
    let out = OutputDir::prepare("out", a.out.as_deref().unwrap_or(std::path::Path::new("results/run")))?;
    let mut trace_file = trace_file(a)?;
    let mut runs = Vec::new();
    for (rate, mode) in a.loads().into_iter().flat_map(|r| a.mode.modes().into_iter().map(move |m| (r, m))) {
        let specs: Vec<RequestSpec> = (0..a.concurrency)
            .map(|i| RequestSpec {
                id: RequestId(i as u64),
                prompt_tokens: a.context[i % a.context.len()],
                output_tokens: a.output[i % a.output.len()],
            })
            .collect();
        let times = rate.map(|r| super::arrivals::poisson_times(specs.len(), r, a.engine.seed));
        let mut run = match a.gpus {
            Some(ranks) => super::run_ranks::run_mode(a, mode, ranks, &specs, times.as_deref())?,
            None => {
                let mut e = a.engine.engine(mode, request_lengths(a), "context")?;
                super::run_engine::run_mode(a, mode, e.as_mut(), &specs, times.as_deref(), trace_file.as_mut())?
            }
        };
        run.arrival_rate = rate;
        runs.push(run);
    }
    let g = a.engine.geometry()?;
    if !a.engine.miss_fill(&a.engine.hisparse(&g)?)?.copies() {
        for r in runs.iter_mut().filter(|r| r.mode == Mode::HiSparse) {
            r.timing_only = Some(super::common::NO_COPIES);
        }
    }
    write_outputs(&out, &runs)?;
    if let Some(f) = trace_file {
        f.commit()?;
    }
    Ok((runs, out.commit()?))
}

/// Refuses, before any work, a run in which no mode can admit even its smallest request (the
/// flag that would make room named); a mode that cannot beside one that can runs, rejecting
/// its requests (what the comparison shows).
fn refuse_a_run_admitting_nothing(a: &RunArgs) -> Result<()> {
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    // Request i has context i and output i, each list cycled.
    let smallest = (0..a.context.len().max(a.output.len()))
        .map(|i| (a.context[i % a.context.len()], a.output[i % a.output.len()]))
        .min_by_key(|&(c, o)| c.saturating_add(o));
    let Some((context, output)) = smallest else { return Ok(()) };
    let tokens = guard::sum(("context", context), ("output", output))?;
    let mut first = None;
    for mode in a.mode.modes() {
        match a.engine.check_request_fits(&g, &hs, mode, "context", context, tokens) {
            Ok(()) => return Ok(()),
            Err(e) => first = first.or(Some(e)),
        }
    }
    first.map_or(Ok(()), Err)
}

/// The runs as a table.
pub fn render(runs: &[ModeRun], out: &std::path::Path) -> String {
    let w = runs.iter().map(|r| r.label().len()).max().unwrap_or(0).max(9);
    let mut s = format!(
        "{:<w$} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}\n",
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
            "{:<w$} {:>6} {:>8} {:>10.1} {:>8} {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.1}% {:>7.2}% {:>10.1} {:>10.1}\n",
            r.label(),
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
            r.label(),
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
            r.label(),
            r.gpus,
            r.exchange_mb_per_step,
            100.0 * x.exchange / x.decode().max(1e-12)
        );
    }
    for r in runs {
        let (f, t) = (&r.latency.first_decode, &r.latency.per_token);
        s += &format!(
            "{}: time to first decode p50 {:.1} ms, p99 {:.1} ms (max {:.1}); per token p50 {:.1} ms, p99 {:.1} ms (max {:.1})\n",
            r.label(),
            1e3 * f.p50,
            1e3 * f.p99,
            1e3 * f.max,
            1e3 * t.p50,
            1e3 * t.p99,
            1e3 * t.max
        );
        for (id, reason) in &r.rejected {
            s += &format!("{}: request {id} rejected: {reason}\n", r.label());
        }
        if !r.refused.is_empty() {
            s += &format!("{}: {} requests refused by the full waiting queue\n", r.label(), r.refused.len());
        }
        if let Some(note) = r.timing_only {
            s += &format!("{}: {note}\n", r.label());
        }
        if r.mode == Mode::Hybrid {
            let p = &r.summary.placement;
            let mb = |b: u64| b as f64 / 1e6;
            s += &format!(
                "{}: {} demotions ({:.1} MB to the host tier), {} promotions ({:.1} MB back), {} pages moved ({:.1} MB)\n",
                r.label(),
                p.demotions,
                mb(p.bytes_demoted),
                p.promotions,
                mb(p.bytes_promoted),
                p.moved_pages,
                mb(p.bytes_moved)
            );
        }
    }
    if super::run_output::is_load_sweep(runs) {
        for (mode, load) in super::run_output::first_waiting_load(runs) {
            s += &match load {
                Some(l) => format!("{mode}: requests first waited for capacity at {l} requests/s\n"),
                None => format!("{mode}: no request waited for capacity at any load\n"),
            };
        }
        s += &format!("\nwrote {}/{{run.json, steps.csv, load.csv, latency.svg}}\n", out.display());
    } else {
        s += &format!("\nwrote {}/{{run.json, steps.csv}}\n", out.display());
    }
    s
}
