//! The trace-driven policy simulator: replays every (request, layer) stream of a trace through
//! the real CPU swap-in step under several policies and buffer sizes in parallel, with
//! Belady's offline optimum and the compulsory misses (an infinite buffer) beside them.
//!
//! A stream starts from the state a decode node would be in: a first sequence that fits the
//! buffer is preloaded (fast path); a longer one starts with an empty buffer (its prompt arrived
//! straight into the host tier), so its first step misses everything it selects.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use crate::error::{PolicyError, Result};
use crate::policy::{self, EvictionPolicy, StepCtx};
use crate::swap_in::{SwapInPlan, SwapInState, SwapInputs};
use crate::trace::{TraceHeader, TraceRecord};

/// What to simulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Policy names (see [`policy::POLICY_NAMES`]); `belady` is the offline bound.
    pub policies: Vec<String>,
    /// Regular slots per buffer to try.
    pub buffer_sizes: Vec<usize>,
    /// Seed of randomised policies.
    pub seed: u64,
    /// Bytes per fetched row (0: the trace header's, else 656).
    pub row_bytes: usize,
}

/// Summary of a distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Distribution {
    /// Summary of `values` (zeros for none).
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let q = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
        Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: q(0.5),
            p99: q(0.99),
            max: values[values.len() - 1],
        }
    }
}

/// One (policy, buffer size) line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct SimResult {
    /// Policy name, or `compulsory` for the infinite-buffer bound.
    pub policy: String,
    /// Regular slots (0 for the infinite buffer).
    pub buffer_slots: usize,
    /// Selected tokens over the whole trace (the newest included).
    pub selected: u64,
    /// Misses over the whole trace.
    pub misses: u64,
    /// `misses / selected`.
    pub miss_ratio: f64,
    /// Rows fetched times the row size.
    pub bytes_fetched: u64,
    /// Misses of one (request, layer) in one step.
    pub misses_per_request_step: Distribution,
    /// Misses of a whole batch's layer in one step, as the batch waits for it: the largest over
    /// the requests of that (step, layer).
    pub misses_per_batch_step: Distribution,
    /// Mean misses per (request, layer), step by step (index = position of the step in the
    /// trace's sorted steps): for plots over time.
    pub series: Vec<f64>,
}

/// The simulator's output.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// The trace's header.
    pub header: TraceHeader,
    /// Records replayed.
    pub records: usize,
    /// (request, layer) streams.
    pub streams: usize,
    /// Distinct steps.
    pub steps: usize,
    /// Bytes per fetched row used for `bytes_fetched`.
    pub row_bytes: usize,
    /// One line per policy and buffer size, then the compulsory bound.
    pub results: Vec<SimResult>,
}

/// Per-record misses of one stream under one combination.
type StreamMisses = Vec<u32>;

struct Stream<'a> {
    request: u64,
    layer: u32,
    records: Vec<&'a TraceRecord>,
}

fn group<'a>(header: &TraceHeader, records: &'a [TraceRecord]) -> Result<Vec<Stream<'a>>> {
    let mut by: BTreeMap<(u64, u32), Vec<&TraceRecord>> = BTreeMap::new();
    for r in records {
        r.check(header, 0)?;
        by.entry((r.request, r.layer)).or_default().push(r);
    }
    by.into_iter()
        .map(|((request, layer), mut recs)| {
            recs.sort_by_key(|r| r.step);
            if let Some(w) = recs.windows(2).find(|w| w[0].step == w[1].step || w[0].seq_len > w[1].seq_len) {
                return Err(PolicyError::Invalid {
                    field: "trace",
                    value: format!("request {request} layer {layer} step {}", w[1].step),
                    reason: "a stream repeats a step or shrinks its sequence".into(),
                });
            }
            Ok(Stream { request, layer, records: recs })
        })
        .collect()
}

/// `next[i][j]`: index of the next record after `i` selecting `records[i].selected[j]`
/// (`u32::MAX`: none); `first[t]`: the first record selecting `t`.
fn next_uses(s: &Stream<'_>) -> (Vec<Vec<u32>>, Vec<u32>) {
    let max_len = s.records.iter().map(|r| r.seq_len as usize).max().unwrap_or(0);
    let mut upcoming = vec![u32::MAX; max_len];
    let mut next: Vec<Vec<u32>> = vec![Vec::new(); s.records.len()];
    for (i, r) in s.records.iter().enumerate().rev() {
        next[i] = r.selected.iter().map(|&t| upcoming[t as usize]).collect();
        for &t in &r.selected {
            upcoming[t as usize] = i as u32;
        }
    }
    (next, upcoming)
}

fn run_stream(
    s: &Stream<'_>,
    policy: &dyn EvictionPolicy,
    slots: usize,
    future: Option<&(Vec<Vec<u32>>, Vec<u32>)>,
) -> Result<StreamMisses> {
    let mut state = SwapInState::new(slots)?;
    let first_len = s.records.first().map_or(0, |r| r.seq_len as usize);
    if first_len <= slots {
        state.preload(first_len.saturating_sub(1))?;
    }
    let mut next_use = future.map(|(_, first)| first.clone());
    let mut plan = SwapInPlan::default();
    let mut out = Vec::with_capacity(s.records.len());
    for (i, r) in s.records.iter().enumerate() {
        let ctx = StepCtx {
            step: i as u32 + 1,
            layer: s.layer,
            request: s.request,
            buffer_slots: slots as u32,
            seed: policy.seed(),
        };
        let inputs = SwapInputs { next_use: next_use.as_deref(), scores: None };
        state.step(policy, &r.selected, r.seq_len as usize, &ctx, inputs, &mut plan)?;
        out.push(plan.misses.len() as u32);
        if let (Some(nu), Some((next, _))) = (next_use.as_mut(), future) {
            for (&t, &n) in r.selected.iter().zip(&next[i]) {
                nu[t as usize] = n;
            }
        }
    }
    Ok(out)
}

/// Compulsory misses: the first selection of each token while it is not the newest.
fn compulsory(s: &Stream<'_>) -> StreamMisses {
    let max_len = s.records.iter().map(|r| r.seq_len as usize).max().unwrap_or(0);
    let mut seen = vec![false; max_len];
    s.records
        .iter()
        .map(|r| {
            let newest = r.seq_len - 1;
            r.selected.iter().filter(|&&t| t != newest && !std::mem::replace(&mut seen[t as usize], true)).count()
                as u32
        })
        .collect()
}

/// Bytes the simulator's per-stream arrays may take at once for `records` (positions are dense,
/// so arrays run to the longest sequence): per worker thread, the next-use and first-use
/// arrays, the compulsory bits and a slot table's token index, over the longest stream.
/// `None` if the count overflows.
pub fn memory_estimate(records: &[TraceRecord]) -> Option<u64> {
    let longest = records.iter().map(|r| u64::from(r.seq_len)).max().unwrap_or(0);
    let selected: u64 = records.iter().map(|r| r.selected.len() as u64).sum();
    let threads = rayon::current_num_threads() as u64;
    // u32 next use + u32 first use + bool compulsory + u16 slot index, per position and thread;
    // plus the next-use lists of every record (u32 per selected position).
    longest.checked_mul(11)?.checked_mul(threads)?.checked_add(selected.checked_mul(4)?)
}

/// Replays `records` under every policy and buffer size of `cfg`. `progress` is called with the
/// number of streams finished so far (out of `streams * (combinations + 1)`).
pub fn simulate(
    header: &TraceHeader,
    records: &[TraceRecord],
    cfg: &SimConfig,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SimReport> {
    simulate_with(header, records, cfg, progress, &|| false)
}

/// [`simulate`], stopping with [`PolicyError::Cancelled`] (between streams) once `cancel`
/// returns true.
pub fn simulate_with(
    header: &TraceHeader,
    records: &[TraceRecord],
    cfg: &SimConfig,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<SimReport> {
    if cfg.policies.is_empty() || cfg.buffer_sizes.is_empty() {
        return Err(PolicyError::Invalid {
            field: "policies",
            value: cfg.policies.len().to_string(),
            reason: "need at least one policy and one buffer size".into(),
        });
    }
    let policies: Vec<_> = cfg.policies.iter().map(|p| policy::by_name(p, cfg.seed)).collect::<Result<_>>()?;
    for &b in &cfg.buffer_sizes {
        if (b as u64) < u64::from(header.top_k) {
            return Err(PolicyError::Invalid {
                field: "buffer_sizes",
                value: b.to_string(),
                reason: format!("must be at least the trace's top_k = {}", header.top_k),
            });
        }
    }
    let streams = group(header, records)?;
    let combos: Vec<(usize, usize)> =
        (0..policies.len()).flat_map(|p| cfg.buffer_sizes.iter().map(move |&b| (p, b))).collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let tick = || progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    // per_stream[s][c]: misses per record of stream s under combination c; the last is compulsory.
    let per_stream: Vec<Vec<StreamMisses>> = streams
        .par_iter()
        .map(|s| {
            let future = policies.iter().any(|p| p.needs_future()).then(|| next_uses(s));
            let mut lines = combos
                .par_iter()
                .map(|&(p, b)| {
                    if cancel() {
                        return Err(PolicyError::Cancelled);
                    }
                    let f = if policies[p].needs_future() { future.as_ref() } else { None };
                    let r = run_stream(s, policies[p].as_ref(), b, f);
                    tick();
                    r
                })
                .collect::<Result<Vec<_>>>()?;
            lines.push(compulsory(s));
            tick();
            Ok(lines)
        })
        .collect::<Result<_>>()?;

    let mut steps: Vec<u32> = records.iter().map(|r| r.step).collect();
    steps.sort_unstable();
    steps.dedup();
    let step_index = |st: u32| steps.binary_search(&st).unwrap_or(0);
    let row_bytes = if cfg.row_bytes > 0 {
        cfg.row_bytes
    } else if header.row_bytes > 0 {
        header.row_bytes as usize
    } else {
        656
    };
    let selected: u64 = records.iter().map(|r| r.selected.len() as u64).sum();
    let mut labels: Vec<(String, usize)> = combos.iter().map(|&(p, b)| (policies[p].name().to_string(), b)).collect();
    labels.push(("compulsory".into(), 0));
    let results = labels
        .into_iter()
        .enumerate()
        .map(|(c, (policy, buffer_slots))| {
            let mut per_request = Vec::with_capacity(records.len());
            let mut batch: BTreeMap<(usize, u32), u32> = BTreeMap::new();
            let mut sums = vec![(0f64, 0u32); steps.len()];
            for (s, lines) in streams.iter().zip(&per_stream) {
                for (r, &m) in s.records.iter().zip(&lines[c]) {
                    let si = step_index(r.step);
                    per_request.push(f64::from(m));
                    let e = batch.entry((si, s.layer)).or_default();
                    *e = (*e).max(m);
                    sums[si].0 += f64::from(m);
                    sums[si].1 += 1;
                }
            }
            let misses = per_request.iter().sum::<f64>() as u64;
            let mut batch: Vec<f64> = batch.into_values().map(f64::from).collect();
            SimResult {
                policy,
                buffer_slots,
                selected,
                misses,
                miss_ratio: if selected > 0 { misses as f64 / selected as f64 } else { 0.0 },
                bytes_fetched: misses.saturating_mul(row_bytes as u64),
                misses_per_request_step: Distribution::of(&mut per_request),
                misses_per_batch_step: Distribution::of(&mut batch),
                series: sums.iter().map(|&(s, n)| if n > 0 { s / f64::from(n) } else { 0.0 }).collect(),
            }
        })
        .collect();
    Ok(SimReport {
        header: *header,
        records: records.len(),
        streams: streams.len(),
        steps: steps.len(),
        row_bytes,
        results,
    })
}
