//! Prefetch in the engine (CPU backend): every prefetcher, with every kind of policy, leaves the
//! attention outputs bit-identical to resident; `shared-index` removes the shared layers' misses
//! exactly (nothing it fetches is wasted); the speculative prefetchers move rows that
//! selections then use; the device path refuses a prefetcher it cannot run.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{StepCounts, config, expected_count, run_counted, run_on};
use hisparse_engine::EngineConfig;
use hisparse_kernels::CpuBackend;
use hisparse_memory::{IndexerLayout, Mode};
use hisparse_policy::prefetch::PREFETCHER_NAMES;

/// cpu-small with layers 0 and 2 full, 1 and 3 shared (GLM-5.2's IndexShare, scaled down).
fn shared(mut c: EngineConfig) -> EngineConfig {
    c.cache.geometry = c.cache.geometry.with_indexers(IndexerLayout::Every { first_full: 1, freq: 2 });
    c
}

fn with_prefetcher(mut c: EngineConfig, prefetcher: &str, budget: usize) -> EngineConfig {
    c.cache.hisparse.prefetch = prefetcher.parse().unwrap();
    c.cache.hisparse.prefetch = c.cache.hisparse.prefetch.with_budget(budget);
    c
}

#[derive(Debug, Default, PartialEq)]
struct Totals {
    misses: u64,
    prefetched: u64,
    useful: u64,
    wasted: u64,
}

fn totals(c: &[StepCounts]) -> Totals {
    c.iter().fold(Totals::default(), |t, s| Totals {
        misses: t.misses + s.misses,
        prefetched: t.prefetched + s.prefetched,
        useful: t.useful + s.prefetch_useful,
        wasted: t.wasted + s.prefetch_wasted,
    })
}

#[test]
fn every_prefetcher_with_every_kind_of_policy_is_lossless() {
    for layout in [false, true] {
        let base = |mode, policy| if layout { shared(config(mode, policy)) } else { config(mode, policy) };
        let resident = run_on(CpuBackend::new(), base(Mode::Resident, "lru"), &[], None);
        assert_eq!(resident.len(), expected_count());
        // Recency, frequency with token words, and score-aware policies.
        for policy in ["lru", "s3fifo", "score"] {
            for pf in PREFETCHER_NAMES {
                let cfg = with_prefetcher(base(Mode::HiSparse, policy), pf, 64);
                let (hs, counts) = run_counted(CpuBackend::new(), cfg, &[], None);
                assert_eq!(hs, resident, "{policy} + {pf} (shared layers: {layout}): outputs differ");
                let t = totals(&counts);
                if pf == "none" || (pf == "shared-index" && !layout) {
                    assert_eq!(t.prefetched, 0, "{policy} + {pf}: {t:?}");
                } else {
                    assert!(t.prefetched > 0, "{policy} + {pf} (shared layers: {layout}): nothing prefetched");
                }
            }
        }
    }
}

#[test]
fn shared_index_prefetch_removes_the_shared_layers_misses() {
    let none = totals(&run_counted(CpuBackend::new(), shared(config(Mode::HiSparse, "lru")), &[], None).1);
    let cfg = with_prefetcher(shared(config(Mode::HiSparse, "lru")), "shared-index", 0);
    let pf = totals(&run_counted(CpuBackend::new(), cfg, &[], None).1);
    assert!(none.misses > 0 && pf.prefetched > 0, "{none:?} {pf:?}");
    // Exact: every fetched row is used at once, and the shared layers miss nothing; the misses
    // left are the full layers', which prefetch does not touch (same policy, same buffers).
    assert_eq!(pf.wasted, 0);
    assert_eq!(pf.useful, pf.prefetched);
    assert_eq!(pf.misses + pf.prefetched, none.misses, "{none:?} {pf:?}");
}

#[test]
fn speculative_prefetch_moves_rows_that_selections_use() {
    for pf in ["adjacent-layer", "next-step"] {
        let cfg = with_prefetcher(config(Mode::HiSparse, "lru"), pf, 128);
        let t = totals(&run_counted(CpuBackend::new(), cfg, &[], None).1);
        assert!(t.prefetched > 0 && t.useful > 0, "{pf}: {t:?}");
        assert!(t.useful + t.wasted <= t.prefetched, "{pf}: {t:?}");
    }
    // The adjacent layer's selection overlaps this one's: prefetch takes misses off the critical
    // path.
    let none = totals(&run_counted(CpuBackend::new(), config(Mode::HiSparse, "lru"), &[], None).1);
    let cfg = with_prefetcher(config(Mode::HiSparse, "lru"), "adjacent-layer", 256);
    let adj = totals(&run_counted(CpuBackend::new(), cfg, &[], None).1);
    assert!(adj.misses < none.misses, "adjacent-layer {adj:?} against none {none:?}");
}

#[test]
fn a_budget_bounds_what_one_buffer_takes_per_step() {
    let cfg = with_prefetcher(config(Mode::HiSparse, "lru"), "adjacent-layer", 8);
    let counts = run_counted(CpuBackend::new(), cfg, &[], None).1;
    // Layers 1..3 each take at most 8 rows per running request (at most 5 run at once).
    for c in &counts {
        assert!(c.prefetched <= 8 * 3 * 5, "{c:?}");
    }
    assert!(counts.iter().any(|c| c.prefetched > 0));
}

#[test]
fn an_unknown_prefetcher_is_refused_by_name_where_it_is_read() {
    // A name is resolved once, where it comes in: no engine is ever built with one it lacks.
    let e = "psychic".parse::<hisparse_policy::PrefetcherChoice>().unwrap_err();
    assert!(e.to_string().contains("psychic") && e.to_string().contains("adjacent-layer"), "{e}");
    let e = hisparse_policy::HiSparseConfig::from_json(r#"{"prefetcher": "psychic"}"#).unwrap_err();
    assert!(e.to_string().contains("psychic"), "{e}");
}
