//! Summing a simulation's replays into its report lines: totals, distributions per request and
//! per batch step (after the warm-up), and the per-step series (all steps); the report made of
//! them, the compulsory bound last.

use std::collections::BTreeMap;

use super::{Distribution, SimConfig, SimReport, SimResult, Stream};
use crate::counts::SwapCounts;
use crate::error::{PolicyError, Result};
use crate::trace::{RecordHead, TraceHeader};

/// One combination's replays: misses per record of each stream, and prefetch counts
/// (prefetched, useful, wasted).
pub(super) struct Line<'a> {
    pub policy: String,
    pub prefetcher: String,
    pub device_buffer_size: usize,
    pub misses: Vec<Option<&'a Vec<u32>>>,
    pub prefetch: [u64; 3],
}

/// The distinct steps of the trace and one result per line.
pub(super) fn results<R: RecordHead>(
    records: &[R],
    streams: &[Stream<'_, R>],
    lines: Vec<Line<'_>>,
    row_bytes: usize,
    warmup: usize,
) -> (usize, Vec<SimResult>) {
    let mut steps: Vec<u32> = records.iter().map(|r| r.step()).collect();
    steps.sort_unstable();
    steps.dedup();
    let step_index = |st: u32| steps.binary_search(&st).unwrap_or(0);
    let selected: u64 = streams.iter().flat_map(|s| s.records.iter().skip(warmup)).map(|r| r.count() as u64).sum();
    let results = lines
        .into_iter()
        .map(|line| {
            let [prefetched, useful, wasted] = line.prefetch;
            let mut per_request = Vec::with_capacity(records.len());
            let mut batch: BTreeMap<(usize, u32), u32> = BTreeMap::new();
            let mut sums = vec![(0f64, 0u32); steps.len()];
            for (s, m) in streams.iter().zip(&line.misses) {
                let m = m.map(|v| v.as_slice()).unwrap_or_default();
                for (i, (r, &m)) in s.records.iter().zip(m).enumerate() {
                    let si = step_index(r.step());
                    if i >= warmup {
                        per_request.push(f64::from(m));
                        let e = batch.entry((si, s.layer)).or_default();
                        *e = (*e).max(m);
                    }
                    sums[si].0 += f64::from(m);
                    sums[si].1 += 1;
                }
            }
            let misses = per_request.iter().sum::<f64>() as u64;
            let mut batch: Vec<f64> = batch.into_values().map(f64::from).collect();
            SimResult {
                policy: line.policy,
                prefetcher: line.prefetcher,
                device_buffer_size: line.device_buffer_size,
                selected,
                swap: SwapCounts {
                    hits: selected.saturating_sub(misses),
                    misses,
                    max_misses: batch.iter().fold(0.0f64, |a, &b| a.max(b)) as u64,
                    bytes_h2d: misses.saturating_add(prefetched).saturating_mul(row_bytes as u64),
                    bytes_h2d_prefetch: prefetched.saturating_mul(row_bytes as u64),
                    prefetched,
                    prefetch_useful: useful,
                    prefetch_wasted: wasted,
                    ..SwapCounts::default()
                },
                miss_ratio: if selected > 0 { misses as f64 / selected as f64 } else { 0.0 },
                wasted_bytes: wasted.saturating_mul(row_bytes as u64),
                misses_per_request_step: Distribution::of(&mut per_request),
                misses_per_batch_step: Distribution::of(&mut batch),
                series: sums.iter().map(|&(s, n)| if n > 0 { s / f64::from(n) } else { 0.0 }).collect(),
            }
        })
        .collect();
    (steps.len(), results)
}

/// The report of `records` in `streams` from each combination's `lines` and the streams'
/// `compulsory` misses, after `replays` replays.
pub(super) fn report<'a, R: RecordHead>(
    header: &TraceHeader,
    records: &[R],
    streams: &[Stream<'_, R>],
    mut lines: Vec<Line<'a>>,
    compulsory: &'a [Vec<u32>],
    cfg: &SimConfig,
    replays: usize,
) -> Result<SimReport> {
    let row_bytes = if cfg.row_bytes > 0 {
        cfg.row_bytes
    } else if header.row_bytes > 0 {
        header.row_bytes as usize
    } else {
        656
    };
    lines.push(Line {
        policy: "compulsory".into(),
        prefetcher: "none".into(),
        device_buffer_size: 0,
        misses: compulsory.iter().map(Some).collect(),
        prefetch: [0; 3],
    });
    let (steps, results) = results(records, streams, lines, row_bytes, cfg.warmup_steps);
    // A ratio of nothing is no result: a warm-up as long as the trace, or a trace that selects
    // nothing (empty, or all padding), is refused rather than reported as 0 misses.
    if results.iter().all(|r| r.selected == 0) {
        return Err(if cfg.warmup_steps > 0 && records.iter().any(|r| r.count() > 0) {
            PolicyError::Invalid {
                field: "warmup_steps",
                value: cfg.warmup_steps.to_string(),
                reason: format!("the trace has {steps} steps after it: nothing would be measured"),
            }
        } else {
            PolicyError::Invalid {
                field: "trace",
                value: format!("{} records", records.len()),
                reason: "selects nothing (empty, or only padding): nothing to measure".into(),
            }
        });
    }
    Ok(SimReport {
        replays,
        header: header.clone(),
        records: records.len(),
        streams: streams.len(),
        steps,
        row_bytes,
        results,
    })
}
