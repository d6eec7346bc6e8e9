//! The simulator over an [`EncodedTrace`]: where every policy is a stamp policy (LRU, FIFO) and
//! nothing prefetches, each stream is replayed in one pass — a record's positions decoded into
//! one reused buffer, then stepped through every (policy, buffer size) and the compulsory count —
//! so no decoded copy of the trace is ever made. Anything else decodes the trace and replays it
//! as [`simulate_policies`](super::simulate_policies) does.

use std::sync::Arc;

use rayon::prelude::*;

use super::aggregate::{self, report};
use super::compulsory::Compulsory;
use super::stamped::StampedReplay;
use super::{SimConfig, SimReport, Stream, checked_config, group};
use crate::error::{PolicyError, Result};
use crate::policy::{EvictionPolicy, StampRule};
use crate::prefetch::Prefetcher;
use crate::trace::{EncodedRecord, EncodedTrace, RecordHead};

/// One stream's misses: per (policy, buffer size), then the compulsory count, per record.
type StreamMisses = (Vec<Vec<u32>>, Vec<u32>);

/// The stamp rule of every policy, if each has one and no prefetcher moves rows.
fn stamp_rules(policies: &[Arc<dyn EvictionPolicy>], prefetchers: &[Arc<dyn Prefetcher>]) -> Option<Vec<StampRule>> {
    if prefetchers.iter().any(|p| p.name() != "none") {
        return None;
    }
    policies.iter().map(|p| p.stamp_rule()).collect()
}

/// Whether [`simulate_encoded_policies`] replays `policies` under `cfg` in one pass per stream
/// without decoding the trace: every policy has a stamp rule (LRU, FIFO) and no prefetcher
/// moves rows.
pub fn replays_in_one_pass(cfg: &SimConfig, policies: &[Arc<dyn EvictionPolicy>]) -> bool {
    let prefetchers: Vec<_> = cfg.prefetchers.iter().map(|p| p.make(&cfg.prefetcher_config)).collect();
    stamp_rules(policies, &prefetchers).is_some()
}

/// [`simulate_with`](super::simulate_with) over an encoded trace: the same report, from one
/// decoding pass per stream where the policies allow it (see the module's header), else from
/// the decoded trace.
pub fn simulate_encoded(
    trace: &EncodedTrace,
    cfg: &SimConfig,
    progress: &(dyn Fn(u64) + Sync),
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<SimReport> {
    let policies: Vec<_> = cfg.policies.iter().map(|p| p.make(&cfg.policy_config)).collect::<Result<_>>()?;
    simulate_encoded_policies(trace, cfg, &policies, progress, cancel)
}

/// [`simulate_encoded`] of policies made by the caller (`cfg.policies` is not read), as
/// [`simulate_policies`](super::simulate_policies) is to [`simulate_with`](super::simulate_with).
pub fn simulate_encoded_policies(
    trace: &EncodedTrace,
    cfg: &SimConfig,
    policies: &[Arc<dyn EvictionPolicy>],
    progress: &(dyn Fn(u64) + Sync),
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<SimReport> {
    let header = trace.header();
    let prefetchers = checked_config(header, cfg, policies)?;
    let Some(rules) = stamp_rules(policies, &prefetchers) else {
        let (header, records) = trace.decode()?;
        return super::simulate_policies(&header, &records, cfg, policies, progress, cancel);
    };
    let streams = group(header, trace.records())?;
    let combos: Vec<(usize, usize)> =
        (0..policies.len()).flat_map(|p| cfg.buffer_sizes.iter().map(move |&b| (p, b))).collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let tick = |n: u64| progress(done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n);
    let outcomes: Vec<Result<StreamMisses>> = streams
        .par_iter()
        .map(|s| {
            if cancel() {
                return Err(PolicyError::Cancelled);
            }
            let r = replay_stream(trace, s, &combos.iter().map(|&(p, b)| (rules[p], b)).collect::<Vec<_>>());
            // As many replays as the general simulator counts: one per prefetcher (each of
            // them `none`, so one replay serves them all) and the compulsory count.
            tick((combos.len() * prefetchers.len()) as u64 + 1);
            r
        })
        .collect();
    // The first failing stream's error, in stream order (whatever the threads' order).
    let (misses, compulsory): (Vec<_>, Vec<_>) = outcomes.into_iter().collect::<Result<Vec<_>>>()?.into_iter().unzip();
    // Lines in the general simulator's order: policy, prefetcher, buffer size.
    let mut lines: Vec<aggregate::Line<'_>> = Vec::new();
    for (p, policy) in policies.iter().enumerate() {
        for f in &prefetchers {
            for (i, &b) in cfg.buffer_sizes.iter().enumerate() {
                let c = p * cfg.buffer_sizes.len() + i;
                lines.push(aggregate::Line {
                    policy: policy.name().to_string(),
                    prefetcher: f.name().to_string(),
                    device_buffer_size: b,
                    misses: misses.iter().map(|m: &Vec<Vec<u32>>| Some(&m[c])).collect(),
                    prefetch: [0; 3],
                });
            }
        }
    }
    let replays = (lines.len() + 1) * streams.len();
    report(header, trace.records(), &streams, lines, &compulsory, cfg, replays)
}

/// One stream of `trace` replayed under every (rule, slots) of `combos` and counted for its
/// compulsory misses, a record at a time: per combination and for the compulsory count, the
/// misses of each record.
fn replay_stream(
    trace: &EncodedTrace,
    s: &Stream<'_, EncodedRecord>,
    combos: &[(StampRule, usize)],
) -> Result<StreamMisses> {
    let (max_len, first) = (s.max_len(), s.records.first().map(|r| r.seq_len));
    let mut replays = combos
        .iter()
        .map(|&(rule, slots)| StampedReplay::new(rule, slots, max_len, first))
        .collect::<Result<Vec<_>>>()?;
    let mut compulsory = Compulsory::new(max_len);
    let mut misses: Vec<Vec<u32>> = vec![Vec::with_capacity(s.records.len()); combos.len()];
    let mut first_misses = Vec::with_capacity(s.records.len());
    let mut selected = Vec::new();
    for &r in &s.records {
        // `s` holds records of `trace` (grouped from its records).
        trace.positions_of(r, &mut selected)?;
        for (replay, m) in replays.iter_mut().zip(&mut misses) {
            m.push(replay.record(&selected, r.seq_len())?);
        }
        first_misses.push(compulsory.record(&selected, r.seq_len()));
    }
    Ok((misses, first_misses))
}

/// [`memory_estimate`](super::memory_estimate) for [`simulate_encoded`] of `trace` under `cfg`:
/// the decoded trace and the general replay's arrays where the policies need them, else per
/// worker thread a token index per (policy, buffer size) and the compulsory bytes over the
/// longest stream. `None` if the count overflows.
pub fn memory_estimate_encoded(trace: &EncodedTrace, cfg: &SimConfig) -> Option<u64> {
    let records = trace.records();
    let policies: Option<Vec<_>> = cfg.policies.iter().map(|p| p.make(&cfg.policy_config).ok()).collect();
    if !policies.is_some_and(|p| replays_in_one_pass(cfg, &p)) {
        let positions: u64 = records.iter().map(|r| u64::from(r.count)).sum();
        // The decoded records: a u32 per position and a record's fields.
        let decoded = positions.checked_mul(4)?.checked_add((records.len() as u64).checked_mul(64)?)?;
        return super::memory_estimate(records)?.checked_add(decoded);
    }
    let longest = records.iter().map(|r| u64::from(r.seq_len())).max().unwrap_or(0);
    let combos = (cfg.policies.len() as u64).checked_mul(cfg.buffer_sizes.len() as u64)?;
    let threads = rayon::current_num_threads() as u64;
    // u16 token index per combination + bool compulsory, per position and thread.
    longest.checked_mul(combos.checked_mul(2)?.checked_add(1)?)?.checked_mul(threads)
}
