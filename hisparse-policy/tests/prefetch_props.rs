//! Prefetch, property-tested for every policy: a prefetch never evicts a protected token, never
//! brings in more than its budget or anything not nominated, keeps the slot table a bijection,
//! and the step that follows still finds every selected token where its plan says; across
//! layers, the simulator's shared-index prefetch leaves shared layers no critical-path misses.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_policy::policy::{self, POLICY_NAMES};
use hisparse_policy::trace::{TraceHeader, TraceRecord};
use hisparse_policy::{
    BuiltinPolicy, BuiltinPrefetcher, Nominated, PolicyChoice, PrefetchPlan, SimConfig, SimReport, SimResult, StepCtx,
    SwapInPlan, SwapInState, SwapInputs, simulate,
};
use proptest::prelude::*;

/// Per step: a selection, prefetch candidates, a protected set and a budget.
type Step = (Vec<u32>, Vec<u32>, Vec<u32>, usize);

fn steps() -> impl Strategy<Value = (usize, usize, Vec<Step>)> {
    let step = (
        prop::collection::vec(0u32..400, 0..8),
        prop::collection::vec(0u32..400, 0..10),
        prop::collection::vec(0u32..400, 0..6),
        0usize..8,
    );
    (4usize..12, 0usize..40, prop::collection::vec(step, 1..30))
}

fn clean(mut v: Vec<u32>, seq_len: usize, k: usize) -> Vec<u32> {
    v.iter_mut().for_each(|x| *x %= seq_len as u32);
    v.sort_unstable();
    v.dedup();
    v.truncate(k);
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn prefetch_keeps_protection_budget_and_the_step_exact((slots, start, steps) in steps()) {
        for name in POLICY_NAMES {
            let p = policy::by_name(name, 5).unwrap();
            let mut st = SwapInState::new(slots).unwrap();
            let (mut plan, mut pp) = (SwapInPlan::default(), PrefetchPlan::default());
            let max_len = start + steps.len() + 1;
            let nu: Vec<u32> = (0..max_len as u32).map(|t| t % 7).collect();
            let scores: Vec<f32> = (0..max_len).map(|t| if t % 3 == 0 { f32::NAN } else { (t % 11) as f32 }).collect();
            let (mut fills, mut used) = (0usize, 0usize);
            for (i, (sel, cands, protect, budget)) in steps.iter().enumerate() {
                let seq_len = start + 1 + i;
                let ctx = StepCtx { step: i as u32 + 1, layer: 0, request: 1, device_buffer_size: slots as u32, seed: p.seed() };
                let inputs = SwapInputs { next_use: Some(&nu), scores: Some(&scores) };
                let cands: Vec<u32> = cands.iter().map(|c| c % seq_len as u32).collect();
                let protect = clean(protect.clone(), seq_len, slots);
                let before: Vec<Option<u32>> = (0..slots as u32).map(|s| st.table().token_at(s)).collect();
                let nominated = Nominated { candidates: &cands, protect: &protect, budget: *budget };
                st.prefetch(p.as_ref(), nominated, seq_len, &ctx, inputs, &mut pp).unwrap();
                prop_assert!(st.table().check().is_ok(), "{name}");
                prop_assert!(pp.fills.len() <= *budget, "{name}: {} fills over a budget of {budget}", pp.fills.len());
                for &(t, s) in &pp.fills {
                    prop_assert!(cands.contains(&t), "{name}: filled {t}, not nominated");
                    prop_assert!(!before.contains(&Some(t)), "{name}: filled {t}, already resident");
                    prop_assert_eq!(st.table().slot_of(t), Some(s));
                    prop_assert!(st.is_prefetched(s));
                }
                for &(t, _) in &pp.evictions {
                    prop_assert!(protect.binary_search(&t).is_err(), "{name}: evicted protected {t}");
                }
                fills += pp.fills.len();
                let sel = clean(sel.clone(), seq_len, slots);
                st.step(p.as_ref(), &sel, seq_len, &ctx, inputs, &mut plan).unwrap();
                used += plan.prefetch_used;
                for (&t, &loc) in sel.iter().zip(&plan.locations) {
                    prop_assert_eq!(st.table().slot_of(t), Some(loc), "{}: token {} not where the plan says", name, t);
                }
                for &(t, _) in &plan.evictions {
                    prop_assert!(sel.binary_search(&t).is_err(), "{name}: evicted selected {t}");
                }
            }
            prop_assert!(used <= fills, "{name}: {used} prefetches used of {fills}");
        }
    }
}

/// Three layers, layer 1 sharing layer 0's selection; layer 2 full.
/// The result line of `policy` with `prefetcher` at `slots`.
fn line<'a>(report: &'a SimReport, policy: &str, prefetcher: &str, slots: usize) -> &'a SimResult {
    report
        .results
        .iter()
        .find(|r| r.policy == policy && r.prefetcher == prefetcher && r.device_buffer_size == slots)
        .unwrap()
}

/// Misses of `policy` at `slots` replaying `records` alone, without prefetch.
fn misses_alone(header: &TraceHeader, records: &[TraceRecord], policy: &str, slots: usize) -> u64 {
    let c = SimConfig {
        policies: vec![PolicyChoice::parse(policy).unwrap()],
        buffer_sizes: vec![slots],
        ..SimConfig::default()
    };
    simulate(header, records, &c, &|_| {}).unwrap().results[0].swap.misses
}

fn shared_trace() -> (TraceHeader, Vec<TraceRecord>) {
    let header = TraceHeader { top_k: 16, layers: 3, index_source: vec![0, 0, 2], ..TraceHeader::default() };
    let mut records = Vec::new();
    for step in 1..=30u32 {
        let seq_len = 500 + step;
        for layer in 0..3u32 {
            let src = if layer == 1 { 0 } else { layer };
            let mut sel: Vec<u32> =
                (0..15u32).map(|j| (j * 37 + step * (3 + src) * 11 + src * 101) % (seq_len - 1)).collect();
            sel.push(seq_len - 1);
            sel.sort_unstable();
            sel.dedup();
            records.push(TraceRecord { step, request: 9, layer, seq_len, selected: sel, ..TraceRecord::default() });
        }
    }
    (header, records)
}

#[test]
fn shared_index_prefetch_leaves_shared_layers_no_critical_misses() {
    let (header, records) = shared_trace();
    let cfg = SimConfig {
        policies: vec![BuiltinPolicy::Lru.into(), BuiltinPolicy::Belady.into()],
        prefetchers: vec![BuiltinPrefetcher::None.into(), BuiltinPrefetcher::SharedIndex.into()],
        buffer_sizes: vec![16, 32],
        ..SimConfig::default()
    };
    let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
    // Shared layer 1's misses under `none` move off the critical path: the same rows are
    // prefetched instead, and every one is used.
    let only = |layers: &[u32]| records.iter().filter(|r| layers.contains(&r.layer)).cloned().collect::<Vec<_>>();
    for policy in ["lru", "belady"] {
        for slots in [16, 32] {
            let (none, shared) = (line(&report, policy, "none", slots), line(&report, policy, "shared-index", slots));
            let full = misses_alone(&header, &only(&[0, 2]), policy, slots);
            let layer1 = misses_alone(&header, &only(&[1]), policy, slots);
            assert_eq!(none.swap.misses, full + layer1, "{policy} {slots}");
            assert_eq!(shared.swap.misses, full, "{policy} {slots}: shared layers must not miss");
            assert_eq!(
                shared.swap.prefetched, layer1,
                "{policy} {slots}: prefetched rows are the shared layer's misses"
            );
            assert_eq!(
                shared.swap.prefetch_useful, shared.swap.prefetched,
                "{policy} {slots}: exact prefetch wastes nothing"
            );
            assert!(layer1 > 0, "the trace must make the shared layer miss");
        }
    }
}

/// Three layers as [`shared_trace`], each full layer selecting 15 of a hot set of 40 positions
/// that drifts by two a step (and the newest): rows come back, as in a real model.
fn drifting_shared_trace() -> (TraceHeader, Vec<TraceRecord>) {
    let header = TraceHeader { top_k: 16, layers: 3, index_source: vec![0, 0, 2], ..TraceHeader::default() };
    let mut x = 12345u64;
    let mut rand = move |n: u32| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 33) % u64::from(n)) as u32
    };
    let mut hot: Vec<Vec<u32>> = (0..2).map(|_| (0..40).map(|_| rand(500)).collect()).collect();
    let mut records = Vec::new();
    for step in 1..=120u32 {
        let seq_len = 500 + step;
        for h in &mut hot {
            for _ in 0..2 {
                let i = rand(40) as usize;
                h[i] = rand(seq_len - 1);
            }
        }
        for layer in 0..3u32 {
            let h = &hot[usize::from(layer == 2)];
            let mut sel: Vec<u32> = Vec::new();
            while sel.len() < 15 {
                let t = h[rand(40) as usize];
                if !sel.contains(&t) {
                    sel.push(t);
                }
            }
            if layer == 1 {
                sel = records
                    .iter()
                    .rev()
                    .find(|r: &&TraceRecord| r.layer == 0)
                    .map_or(sel, |r| r.selected.iter().copied().filter(|&t| t != seq_len - 1).collect());
            }
            sel.push(seq_len - 1);
            sel.sort_unstable();
            sel.dedup();
            records.push(TraceRecord { step, request: 9, layer, seq_len, selected: sel, ..TraceRecord::default() });
        }
    }
    (header, records)
}

#[test]
fn exact_prefetch_moves_about_what_it_replaces_under_every_online_policy() {
    // A shared layer's rows all arrive by prefetch: a policy that ages on evictions (CLOCK,
    // S3-FIFO) must age on the prefetch's evictions too, or it keeps evicting the same slots and
    // moves far more rows than the misses it replaces.
    let (header, records) = drifting_shared_trace();
    let policies = ["lru", "fifo", "clock", "s3fifo", "mq", "random"];
    let cfg = SimConfig {
        policies: policies.iter().map(|p| PolicyChoice::parse(p).unwrap()).collect(),
        prefetchers: vec![BuiltinPrefetcher::None.into(), BuiltinPrefetcher::SharedIndex.into()],
        buffer_sizes: vec![24, 32],
        ..SimConfig::default()
    };
    let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
    let only: Vec<TraceRecord> = records.iter().filter(|r| r.layer == 1).cloned().collect();
    for policy in policies {
        for slots in [24, 32] {
            let (none, shared) = (line(&report, policy, "none", slots), line(&report, policy, "shared-index", slots));
            let layer1 = misses_alone(&header, &only, policy, slots);
            assert!(layer1 > 0 && none.swap.misses > shared.swap.misses, "{policy} {slots}");
            let ratio = shared.swap.prefetched as f64 / layer1 as f64;
            assert!(
                (0.8..=1.2).contains(&ratio),
                "{policy} {slots}: prefetched {} for {layer1} misses",
                shared.swap.prefetched
            );
        }
    }
}
