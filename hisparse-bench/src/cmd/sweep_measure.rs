//! The sweep's measurement of one engine, whatever model it drives (the synthetic workload or a
//! real model, `sweep_model.rs`): the points at every concurrency level over its windows, the
//! misses of every step, and the selection trace the buffer-size comparison replays.

use std::io::Write;
use std::sync::{Arc, Mutex};

use hisparse_engine::{DecodeEngine, RequestSpec};
use hisparse_policy::trace::TraceReader;

use super::sweep_data::{Point, SweepArgs, SweepMode, Window, point};
use crate::error::{BenchError, Result};
use crate::interrupt;

/// A selection trace's bytes, written by an engine and read back by the sweep.
#[derive(Clone, Default)]
pub struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One engine's points at every level of `levels` (`steps` steps each) for requests `specs`
/// (submitted at once, outliving the sweep), at `context` in `mode`; and the misses per request
/// and layer of every step. With `record`, then `steps` more steps recorded into it as a
/// selection trace (the buffer-size comparison replays selections recorded after the
/// measurements: recording slows a step down).
pub fn measure(
    a: &SweepArgs,
    e: &mut dyn DecodeEngine,
    specs: &[RequestSpec],
    (context, mode): (usize, SweepMode),
    (levels, steps): (&[usize], usize),
    record: Option<&SharedBuf>,
    bar: &indicatif::ProgressBar,
) -> Result<(Vec<Point>, Vec<f64>)> {
    let layers = e.config().cache.geometry.layers;
    for s in specs {
        e.submit(*s)?;
    }
    let (mut points, mut per_step) = (Vec::new(), Vec::new());
    for &n in levels {
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
            per_step.push(m.swap.misses as f64 / (m.running * layers).max(1) as f64);
            if s >= a.warmup {
                windows[(s - a.warmup) / a.window].add(m);
            }
        }
        points.push(point(context, n, mode, &windows));
    }
    if let Some(trace) = record {
        bar.set_message(format!("context {context}: selection trace for the buffer-size plot"));
        e.record_trace(Box::new(trace.clone()), 0)?;
        for _ in 0..steps {
            interrupt::check(|| format!("recording the selection trace of context {context}"))?;
            e.step()?;
        }
        e.finish_trace()?;
    }
    Ok((points, per_step))
}

/// Replays the recorded selections under LRU at 1, 2 and 4 times top-k slots.
pub fn replay(trace: &SharedBuf, k: usize) -> Result<Vec<(usize, Vec<f64>)>> {
    let bytes = trace.0.lock().map_err(|_| BenchError::Check("trace buffer poisoned".into()))?.clone();
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut r = TraceReader::new(bytes.as_slice())?;
    let header = r.header().clone();
    let records = r.by_ref().collect::<std::result::Result<Vec<_>, _>>()?;
    super::sweep_data::replay_records(&header, &records, k)
}
