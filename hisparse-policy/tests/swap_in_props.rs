//! Property tests of the swap-in step for every policy on random traces: the bijection holds
//! after every step, every selected token is resident where the plan says, no selected token is
//! evicted, the newest token is resident, hits + misses = selection size; and Belady's misses are
//! at most every online policy's.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_policy::policy::{self, POLICY_NAMES};
use hisparse_policy::trace::{TraceHeader, TraceRecord};
use hisparse_policy::{PolicyConfig, SimConfig, StepCtx, SwapInPlan, SwapInState, SwapInputs, simulate};
use proptest::prelude::*;

/// A random stream: a start length, then per step a selection (drawn from a small hot set plus
/// random positions, so that tokens come back), the newest sometimes included.
fn stream() -> impl Strategy<Value = (usize, usize, Vec<Vec<u32>>)> {
    (2usize..12, 0usize..30, prop::collection::vec((prop::collection::vec(0u32..1000, 0..10), any::<bool>()), 1..40))
        .prop_map(|(slots, start, steps)| {
            let k = slots.min(6);
            let mut out = Vec::new();
            for (i, (raw, newest)) in steps.into_iter().enumerate() {
                let seq_len = start + 1 + i;
                let mut sel: Vec<u32> = raw.into_iter().map(|x| (x % 3 * 7 + x) % seq_len as u32).collect();
                sel.sort_unstable();
                sel.dedup();
                sel.truncate(k);
                if newest {
                    let n = (seq_len - 1) as u32;
                    if !sel.contains(&n) {
                        if sel.len() == k {
                            sel.pop();
                        }
                        sel.push(n);
                    }
                }
                sel.sort_unstable();
                out.push(sel);
            }
            (slots, start, out)
        })
}

/// Next use of every token after step `i` (naive: scans the future).
fn next_use(steps: &[Vec<u32>], i: usize, max_len: usize) -> Vec<u32> {
    let mut nu = vec![u32::MAX; max_len];
    for (j, s) in steps.iter().enumerate().skip(i + 1).rev() {
        for &t in s {
            nu[t as usize] = j as u32;
        }
    }
    nu
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_the_invariants((slots, start, steps) in stream()) {
        let max_len = start + steps.len() + 1;
        for name in POLICY_NAMES {
            let p = policy::by_name(name, 11).unwrap();
            let mut st = SwapInState::new(slots).unwrap();
            if start < slots {
                st.preload(start).unwrap();
            }
            let mut plan = SwapInPlan::default();
            for (i, sel) in steps.iter().enumerate() {
                let seq_len = start + 1 + i;
                let ctx = StepCtx { step: i as u32 + 1, layer: 1, request: 5, device_buffer_size: slots as u32, seed: p.seed() };
                let nu = next_use(&steps, i, max_len);
                // Scores for some tokens (others unknown), changing every step.
                let scores: Vec<f32> = (0..max_len as u64)
                    .map(|t| {
                        let h = policy::mix64(t * 1_000_003 + i as u64);
                        if h.is_multiple_of(3) { f32::NAN } else { (h >> 40) as f32 / 1e4 - 800.0 }
                    })
                    .collect();
                let inputs = SwapInputs { next_use: Some(&nu), scores: Some(&scores) };
                st.step(p.as_ref(), sel, seq_len, &ctx, inputs, &mut plan).unwrap();
                let t = st.table();
                prop_assert!(t.check().is_ok(), "{}: {:?}", name, t.check());
                prop_assert_eq!(plan.hits.len() + plan.misses.len(), sel.len(), "{}", name);
                prop_assert_eq!(plan.locations.len(), sel.len());
                for (&tok, &loc) in sel.iter().zip(&plan.locations) {
                    prop_assert_eq!(t.slot_of(tok), Some(loc), "{}: token {} not where the plan says", name, tok);
                }
                for (tok, _) in &plan.evictions {
                    prop_assert!(!sel.contains(tok), "{}: evicted selected token {}", name, tok);
                }
                let newest = (seq_len - 1) as u32;
                prop_assert!(t.slot_of(newest).is_some(), "{}: newest {} not resident", name, newest);
                if seq_len > slots {
                    prop_assert_eq!(t.slot_of(newest), Some(slots as u32), "{}: newest not in the reserved slot", name);
                }
                // Every miss took a distinct slot, and only misses moved in.
                let mut taken: Vec<u32> = plan.misses.iter().map(|m| m.1).collect();
                taken.sort_unstable();
                taken.dedup();
                prop_assert_eq!(taken.len(), plan.misses.len());
            }
        }
    }

    #[test]
    fn the_compulsory_misses_are_each_tokens_first_selection(
        start in 0usize..600,
        steps in prop::collection::vec((prop::collection::vec(any::<u32>(), 0..48), any::<bool>()), 1..30),
    ) {
        // Positions spread over many 64-token words, the newest sometimes selected.
        let records: Vec<TraceRecord> = steps
            .iter()
            .enumerate()
            .map(|(i, (raw, newest))| {
                let seq_len = (start + 1 + i) as u32;
                let mut sel: Vec<u32> = raw.iter().map(|x| x % seq_len).collect();
                if *newest {
                    sel.push(seq_len - 1);
                }
                sel.sort_unstable();
                sel.dedup();
                sel.truncate(48);
                TraceRecord { step: i as u32, request: 0, layer: 0, seq_len, selected: sel, ..TraceRecord::default() }
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        let naive: u64 = records
            .iter()
            .map(|r| r.selected.iter().filter(|&&t| t != r.seq_len - 1 && seen.insert(t)).count() as u64)
            .sum();
        let header = TraceHeader { top_k: 48, layers: 1, row_bytes: 656, ..TraceHeader::default() };
        let cfg = SimConfig { policies: vec!["lru".parse().unwrap()], buffer_sizes: vec![48], ..SimConfig::default() };
        // A stream that selects nothing measures nothing: refused, not reported as 0 misses.
        if records.iter().all(|r| r.selected.is_empty()) {
            let refused = simulate(&header, &records, &cfg, &|_| {}).is_err();
            prop_assert!(refused);
            return Ok(());
        }
        let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
        let compulsory = report.results.iter().find(|r| r.policy == "compulsory").unwrap();
        prop_assert_eq!(compulsory.swap.misses, naive);
    }

    #[test]
    fn belady_is_a_lower_bound_for_every_online_policy((slots, start, steps) in stream()) {
        let slots = slots.max(6);
        let records: Vec<TraceRecord> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| TraceRecord { step: i as u32, request: 0, layer: 0, seq_len: (start + 1 + i) as u32, selected: s.clone(), ..TraceRecord::default() })
            .collect();
        let header = TraceHeader { top_k: 6, layers: 1, row_bytes: 656, ..TraceHeader::default() };
        // Policies that need scores are refused on a trace without near-cut scores.
        let online = POLICY_NAMES.iter().filter(|n| !policy::by_name(n, 0).unwrap().needs_scores());
        let cfg = SimConfig { policies: online.map(|s| s.parse().unwrap()).collect(), buffer_sizes: vec![slots], policy_config: PolicyConfig::seeded(3), ..SimConfig::default() };
        // A stream that selects nothing measures nothing: refused, not reported as 0 misses.
        if records.iter().all(|r| r.selected.is_empty()) {
            let refused = simulate(&header, &records, &cfg, &|_| {}).is_err();
            prop_assert!(refused);
            return Ok(());
        }
        let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
        let misses = |name: &str| report.results.iter().find(|r| r.policy == name).unwrap().swap.misses;
        let compulsory = misses("compulsory");
        for name in ["lru", "fifo", "random", "clock"] {
            prop_assert!(misses("belady") <= misses(name), "belady {} > {} {}", misses("belady"), name, misses(name));
        }
        if start + 1 > slots {
            prop_assert!(compulsory <= misses("belady"), "cold start: compulsory {} > belady {}", compulsory, misses("belady"));
        }
    }
}
