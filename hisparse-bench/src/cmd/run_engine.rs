//! One mode of `hisparse run` on one engine, whatever model it drives (the synthetic workload or
//! a real model, `run_model.rs`): the requests decoded to the end (at once, or arriving by
//! `--arrival-rate`), with progress, the trace of the hisparse run, and the mode's summary and
//! latencies.

use hisparse_engine::{DecodeEngine, LatencySummary, RequestSpec, RunSummary};
use hisparse_memory::Mode;

use super::run_args::{ModeRun, RunArgs, rejected_of};
use crate::error::{BenchError, Result};
use crate::files::AtomicFile;
use crate::{guard, interrupt, progress};

/// Refuses an `--arrival-rate` that is not a positive rate, or whose arrivals would span more
/// than a day; a load sweep (several rates) with `--record-trace`, which records one run.
pub fn check_arrival_rate(a: &RunArgs) -> Result<()> {
    if let (Some(p), [_, _, ..]) = (&a.record_trace, a.arrival_rate.as_slice()) {
        return Err(BenchError::flag(
            "record-trace",
            p.display(),
            "records one run: give one --arrival-rate (or none)",
        ));
    }
    guard::once_each("arrival-rate", &a.arrival_rate)?;
    for &r in &a.arrival_rate {
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
    Ok(())
}

/// One mode on engine `e` (of the synthetic workload or a real model): `specs` decoded to the
/// end (arriving at `times`), the hisparse run recorded into `trace` where given (with
/// `--score-margin`'s scores).
pub fn run_mode(
    a: &RunArgs,
    mode: Mode,
    e: &mut dyn DecodeEngine,
    specs: &[RequestSpec],
    times: Option<&[f64]>,
    trace: Option<&mut AtomicFile>,
) -> Result<ModeRun> {
    if mode == Mode::HiSparse
        && let Some(f) = trace
    {
        e.record_trace(f.second_writer()?, a.score_margin())?;
    }
    let all: u64 = specs.iter().map(|s| s.output_tokens as u64).sum();
    let bar = progress::bar(all, &format!("{mode} tokens"));
    let mut summary = RunSummary::default();
    let (mut steps, mut latencies) = (Vec::new(), Vec::new());
    let refused = super::arrivals::drive(e, specs, times, None, |r| {
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
    let rejected = rejected_of(e);
    let latency = LatencySummary::of(&latencies);
    Ok(ModeRun {
        mode,
        summary,
        steps,
        rejected,
        refused,
        latency,
        gpus: 1,
        exchange_mb_per_step: 0.0,
        timing_only: None,
        arrival_rate: None,
    })
}
