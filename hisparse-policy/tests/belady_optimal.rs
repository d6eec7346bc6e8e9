//! Belady's MIN, adapted never to evict a token selected in the current step, is optimal:
//! checked against an exhaustive search over every eviction choice on small random traces.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::HashMap;

use hisparse_policy::trace::{TraceHeader, TraceRecord};
use hisparse_policy::{BuiltinPolicy, SimConfig, simulate};
use rand::{Rng, SeedableRng};

/// Fewest total misses from step `i` on with resident set `r` (bit t = token t resident in a
/// regular slot), trying every set of evictions.
fn best(
    steps: &[(u32, u32)],
    sels: &[u32],
    i: usize,
    r: u32,
    slots: u32,
    memo: &mut HashMap<(usize, u32), u32>,
) -> u32 {
    if i == steps.len() {
        return 0;
    }
    if let Some(&v) = memo.get(&(i, r)) {
        return v;
    }
    let newest = steps[i].1 - 1;
    let s = sels[i] & !(1 << newest);
    let misses = (s & !r).count_ones();
    let evictable = r & !s;
    let mut result = u32::MAX;
    // Every subset v of the evictable tokens, as long as what stays plus the misses fits.
    let mut v = evictable;
    loop {
        let next = (r & !v) | s;
        if next.count_ones() <= slots {
            result = result.min(misses + best(steps, sels, i + 1, next, slots, memo));
        }
        if v == 0 {
            break;
        }
        v = (v - 1) & evictable;
    }
    memo.insert((i, r), result);
    result
}

#[test]
fn belady_matches_exhaustive_search() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut checked = 0;
    for _ in 0..300 {
        let slots = rng.random_range(2u32..5);
        let start = slots as usize + rng.random_range(1..4); // cold start: longer than the buffer
        let n = rng.random_range(3..9);
        let mut steps = Vec::new();
        let mut sels = Vec::new();
        let mut records = Vec::new();
        for i in 0..n {
            let seq_len = (start + i + 1) as u32;
            // A hot set of a few tokens makes re-use likely.
            let k = rng.random_range(1..=slots as usize);
            let mut sel: Vec<u32> = (0..k)
                .map(|_| {
                    if rng.random_bool(0.7) {
                        rng.random_range(0..6.min(seq_len))
                    } else {
                        rng.random_range(0..seq_len)
                    }
                })
                .collect();
            sel.sort_unstable();
            sel.dedup();
            steps.push((i as u32, seq_len));
            sels.push(sel.iter().fold(0u32, |m, &t| m | 1 << t));
            records.push(TraceRecord {
                step: i as u32,
                request: 0,
                layer: 0,
                seq_len,
                selected: sel,
                ..TraceRecord::default()
            });
        }
        let header = TraceHeader { top_k: slots, layers: 1, row_bytes: 0, ..TraceHeader::default() };
        let cfg = SimConfig {
            policies: vec![BuiltinPolicy::Belady.into(), BuiltinPolicy::Lru.into()],
            buffer_sizes: vec![slots as usize],
            ..SimConfig::default()
        };
        // A trace that selects nothing measures nothing: refused, not reported as 0 misses.
        if records.iter().all(|r| r.selected.is_empty()) {
            assert!(simulate(&header, &records, &cfg, &|_| {}).is_err());
            continue;
        }
        let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
        let belady = report.results[0].swap.misses as u32;
        let optimum = best(&steps, &sels, 0, 0, slots, &mut HashMap::new());
        assert_eq!(belady, optimum, "slots {slots}, trace {records:?}");
        checked += usize::from(report.results[1].swap.misses as u32 > optimum);
    }
    assert!(checked > 10, "LRU should lose to the optimum on some traces ({checked})");
}
