//! The trace-driven policy simulator: replays a trace through the real CPU swap-in step under
//! every combination of eviction policy, prefetcher and buffer size, in parallel, with Belady's
//! offline optimum and the compulsory misses (an infinite buffer) beside them.
//!
//! A request's streams (one per layer) are replayed together, in layer order, when the
//! prefetcher moves rows across layers ([`crate::prefetch`] gives the order); otherwise each
//! stream alone. A stream starts from the state a decode node would be in: a first sequence that
//! fits the buffer is preloaded (fast path); a longer one starts with an empty buffer (its prompt
//! arrived straight into the host tier), so its first step misses everything it selects.
//!
//! Misses here are *critical-path* misses: rows fetched after the selection is known, which the
//! layer waits for. Prefetched rows cross the bus before; a prefetch is *useful* when a selection
//! uses the row and *wasted* when the row is evicted unused.

mod aggregate;
mod compulsory;
mod replay;
mod stamped;
mod streamed;

pub use streamed::{memory_estimate_encoded, replays_in_one_pass, simulate_encoded, simulate_encoded_policies};

use std::collections::BTreeMap;
use std::sync::Arc;

use rayon::prelude::*;
use serde::Serialize;

use crate::choice::{PolicyChoice, PrefetcherChoice};
use crate::counts::SwapCounts;
use crate::error::{PolicyError, Result};
use crate::policy::{EvictionPolicy, PolicyConfig};
use crate::prefetch::PrefetcherConfig;
use crate::trace::{RecordHead, TraceHeader, TraceRecord};

/// What to simulate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimConfig {
    /// The policies (any registered one; `belady` is the offline bound).
    pub policies: Vec<PolicyChoice>,
    /// The prefetchers; empty: `none` only.
    pub prefetchers: Vec<PrefetcherChoice>,
    /// Regular slots per buffer to try.
    pub buffer_sizes: Vec<usize>,
    /// The policies' tunables (the seed of `random`, ...).
    pub policy_config: PolicyConfig,
    /// The prefetchers' tunables (the row budget).
    pub prefetcher_config: PrefetcherConfig,
    /// Bytes per fetched row (0: the trace header's, else 656).
    pub row_bytes: usize,
    /// Leading steps of every stream that are replayed but not counted (the buffers warm up);
    /// the per-step series still shows them.
    pub warmup_steps: usize,
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

/// One (policy, prefetcher, buffer size) line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct SimResult {
    /// Policy name, or `compulsory` for the infinite-buffer bound.
    pub policy: String,
    /// Prefetcher name (`none` for the compulsory bound).
    pub prefetcher: String,
    /// Regular slots (0 for the infinite buffer).
    pub device_buffer_size: usize,
    /// Selected tokens over the whole trace (the newest included).
    pub selected: u64,
    /// What the replay counted: critical-path misses (rows fetched after their selection was
    /// known), hits, prefetches and what became of them, bytes fetched (misses and prefetches
    /// times the row size); its fields at the top level of the JSON.
    #[serde(flatten)]
    pub swap: SwapCounts,
    /// `misses / selected`.
    pub miss_ratio: f64,
    /// `prefetch_wasted` times the row size.
    pub wasted_bytes: u64,
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
    /// Replays run (stream groups times combinations).
    pub replays: usize,
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

/// One (request, layer)'s records, by step.
struct Stream<'a, R = TraceRecord> {
    request: u64,
    layer: u32,
    records: Vec<&'a R>,
}

impl<R: RecordHead> Stream<'_, R> {
    /// The longest sequence of the stream.
    fn max_len(&self) -> usize {
        self.records.iter().map(|r| r.seq_len() as usize).max().unwrap_or(0)
    }
}

/// The streams of `records`, each checked ([`RecordHead::validate`]), by (request, layer).
fn group<'a, R: RecordHead>(header: &TraceHeader, records: &'a [R]) -> Result<Vec<Stream<'a, R>>> {
    if let Some(e) = records.par_iter().find_map_first(|r| r.validate(header).err()) {
        return Err(e);
    }
    let mut by: BTreeMap<(u64, u32), Vec<&R>> = BTreeMap::new();
    for r in records {
        by.entry((r.request(), r.layer())).or_default().push(r);
    }
    by.into_iter()
        .map(|((request, layer), mut recs)| {
            recs.sort_by_key(|r| r.step());
            if let Some(w) = recs.windows(2).find(|w| w[0].step() == w[1].step() || w[0].seq_len() > w[1].seq_len()) {
                return Err(PolicyError::Invalid {
                    field: "trace",
                    value: format!("request {request} layer {layer} step {}", w[1].step()),
                    reason: "a stream repeats a step or shrinks its sequence".into(),
                });
            }
            Ok(Stream { request, layer, records: recs })
        })
        .collect()
}

/// Bytes the simulator's per-stream arrays may take at once for `records` (positions are dense,
/// so arrays run to the longest sequence): per worker thread, the next-use and first-use
/// arrays, the compulsory bits and a slot table's token index, over the longest stream.
/// `None` if the count overflows.
pub fn memory_estimate(records: &[impl RecordHead]) -> Option<u64> {
    let longest = records.iter().map(|r| u64::from(r.seq_len())).max().unwrap_or(0);
    let selected: u64 = records.iter().map(|r| r.count() as u64).sum();
    let threads = rayon::current_num_threads() as u64;
    // u32 next use + u32 first use + bool compulsory + u16 slot index, per position and thread;
    // plus the next-use lists of every record (u32 per selected position).
    longest.checked_mul(11)?.checked_mul(threads)?.checked_add(selected.checked_mul(4)?)
}

/// Replays `records` under every policy, prefetcher and buffer size of `cfg`. `progress` is
/// called with the number of replays finished so far (out of [`SimReport::replays`], known from
/// [`replays`]).
pub fn simulate(
    header: &TraceHeader,
    records: &[TraceRecord],
    cfg: &SimConfig,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SimReport> {
    simulate_with(header, records, cfg, progress, &|| false)
}

/// How many replays [`simulate`] runs for `records` under `cfg` (for a progress bar).
pub fn replays(records: &[impl RecordHead], cfg: &SimConfig) -> u64 {
    let mut streams: Vec<(u64, u32)> = records.iter().map(|r| (r.request(), r.layer())).collect();
    streams.sort_unstable();
    streams.dedup();
    let mut requests: Vec<u64> = streams.iter().map(|s| s.0).collect();
    requests.dedup();
    let prefetchers =
        if cfg.prefetchers.is_empty() { vec![PrefetcherChoice::default()] } else { cfg.prefetchers.clone() };
    let per_policy_buffer: u64 = prefetchers
        .iter()
        .map(|p| if p.make(&cfg.prefetcher_config).crosses_layers() { requests.len() } else { streams.len() } as u64)
        .sum();
    per_policy_buffer * (cfg.policies.len() * cfg.buffer_sizes.len()) as u64 + streams.len() as u64
}

/// [`simulate`], stopping with [`PolicyError::Cancelled`] (between replays) once `cancel`
/// returns true.
pub fn simulate_with(
    header: &TraceHeader,
    records: &[TraceRecord],
    cfg: &SimConfig,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<SimReport> {
    let policies: Vec<_> = cfg.policies.iter().map(|p| p.make(&cfg.policy_config)).collect::<Result<_>>()?;
    simulate_policies(header, records, cfg, &policies, progress, cancel)
}

/// [`simulate_with`] of policies made by the caller (`cfg.policies` is not read): a policy of
/// the caller's own, one defined in another language through its hooks, or a built-in.
pub fn simulate_policies(
    header: &TraceHeader,
    records: &[TraceRecord],
    cfg: &SimConfig,
    policies: &[Arc<dyn EvictionPolicy>],
    progress: &(dyn Fn(u64) + Sync),
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<SimReport> {
    let prefetchers = checked_config(header, cfg, policies)?;
    let streams = group(header, records)?;
    let any_future = policies.iter().any(|p| p.needs_future());
    let futures: Vec<Option<_>> = streams.par_iter().map(|s| any_future.then(|| replay::next_uses(s))).collect();
    // Groups: every stream alone, and each request's streams together.
    let singles: Vec<Vec<usize>> = (0..streams.len()).map(|i| vec![i]).collect();
    let mut per_request: Vec<Vec<usize>> = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        match per_request.last_mut() {
            Some(g) if streams[g[0]].request == s.request => g.push(i),
            _ => per_request.push(vec![i]),
        }
    }
    // Combinations (policy, prefetcher, buffer) and the replays of each.
    let mut combos: Vec<(usize, usize, usize)> = Vec::new();
    for p in 0..policies.len() {
        for f in 0..prefetchers.len() {
            for &b in &cfg.buffer_sizes {
                combos.push((p, f, b));
            }
        }
    }
    let jobs: Vec<(usize, &Vec<usize>)> = combos
        .iter()
        .enumerate()
        .flat_map(|(c, &(_, f, _))| {
            let groups = if prefetchers[f].crosses_layers() { &per_request } else { &singles };
            groups.iter().map(move |g| (c, g))
        })
        .collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let tick = || progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    let outcomes: Vec<replay::ReplayCounts> = jobs
        .par_iter()
        .map(|&(c, g)| {
            if cancel() {
                return Err(PolicyError::Cancelled);
            }
            let (p, f, b) = combos[c];
            let group: Vec<&Stream<'_>> = g.iter().map(|&i| &streams[i]).collect();
            let fut: Vec<_> =
                g.iter().map(|&i| if policies[p].needs_future() { futures[i].clone() } else { None }).collect();
            let stamp = policies[p].stamp_rule().filter(|_| prefetchers[f].name() == "none" && group.len() == 1);
            let r = match stamp {
                // LRU and FIFO without prefetch: the exact bucketed replay.
                Some(rule) => stamped::replay_stamped(group[0], rule, b)
                    .map(|m| replay::ReplayCounts { misses: vec![m], ..Default::default() }),
                None => replay::replay(
                    header,
                    &group,
                    &fut,
                    (policies[p].as_ref(), prefetchers[f].as_ref()),
                    b,
                    cfg.warmup_steps,
                ),
            };
            tick();
            r
        })
        .collect::<Result<_>>()?;
    let compulsory: Vec<Vec<u32>> = streams
        .par_iter()
        .map(|s| {
            let c = compulsory::compulsory(s);
            tick();
            c
        })
        .collect();

    let mut lines: Vec<aggregate::Line<'_>> = combos
        .iter()
        .map(|&(p, f, b)| aggregate::Line {
            policy: policies[p].name().to_string(),
            prefetcher: prefetchers[f].name().to_string(),
            device_buffer_size: b,
            misses: vec![None; streams.len()],
            prefetch: [0; 3],
        })
        .collect();
    for (&(c, g), o) in jobs.iter().zip(&outcomes) {
        for (&i, m) in g.iter().zip(&o.misses) {
            lines[c].misses[i] = Some(m);
        }
        let t = &mut lines[c].prefetch;
        t[0] += o.prefetched;
        t[1] += o.useful;
        t[2] += o.wasted;
    }
    aggregate::report(header, records, &streams, lines, &compulsory, cfg, jobs.len() + streams.len())
}

/// The prefetchers of `cfg` (`none` if it names none), once `cfg` and `policies` are checked
/// against each other and against `header`.
fn checked_config(
    header: &TraceHeader,
    cfg: &SimConfig,
    policies: &[Arc<dyn EvictionPolicy>],
) -> Result<Vec<Arc<dyn crate::prefetch::Prefetcher>>> {
    if policies.is_empty() || cfg.buffer_sizes.is_empty() {
        return Err(PolicyError::Invalid {
            field: "policies",
            value: policies.len().to_string(),
            reason: "need at least one policy and one buffer size".into(),
        });
    }
    let chosen = if cfg.prefetchers.is_empty() { vec![PrefetcherChoice::default()] } else { cfg.prefetchers.clone() };
    let prefetchers: Vec<_> = chosen.iter().map(|p| p.make(&cfg.prefetcher_config)).collect();
    for &b in &cfg.buffer_sizes {
        if (b as u64) < u64::from(header.top_k) {
            return Err(PolicyError::Invalid {
                field: "buffer_sizes",
                value: b.to_string(),
                reason: format!("must be at least the trace's top_k = {}", header.top_k),
            });
        }
    }
    if let Some(p) = policies.iter().find(|p| p.needs_scores() && header.score_margin == 0) {
        return Err(PolicyError::Invalid {
            field: "policies",
            value: p.name().to_string(),
            reason: "reads the indexer's scores: a trace recorded with them (score_margin > 0, trace version 3) and read with them".into(),
        });
    }
    if let Some(p) = prefetchers.iter().find(|p| p.needs_near() && header.score_margin == 0) {
        return Err(PolicyError::Invalid {
            field: "prefetchers",
            value: p.name().to_string(),
            reason: "reads the candidates below the cut: a trace recorded with them (score_margin > 0, trace version 3) and read with them".into(),
        });
    }
    Ok(prefetchers)
}
