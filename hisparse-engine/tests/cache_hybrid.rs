//! Hybrid placement through the per-layer API: requests on the device while pages are free,
//! demoted to a hot buffer and the host tier when admitting others needs the pages, promoted
//! back when pages free. Every step's outputs equal sparse resident's bit for bit through any
//! sequence of demotions and promotions; capacity is hisparse's; nothing leaks.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::scenario::{self, Digests, Req, geometry, run_requests, scenario, squeeze};
use hisparse_engine::{CacheConfig, DemotionOrder, KvCache};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{KvGeometry, Mode};

fn cache(mode: Mode, g: &KvGeometry, budget: u64, policy: &str, order: DemotionOrder) -> KvCache<CpuBackend> {
    let cfg = CacheConfig { demotion: order, ..scenario::config(mode, g, budget) };
    scenario::cache_with(CpuBackend::new(), cfg, policy, "none")
}

fn resident(g: &KvGeometry, reqs: &[Req]) -> Digests {
    let mut c = cache(Mode::Resident, g, 64 << 20, "lru", DemotionOrder::Oldest);
    run_requests(&mut c, g, reqs).0
}

#[test]
fn hybrid_equals_sparse_resident_through_demotions_and_promotions() {
    let g = geometry(false);
    let want = resident(&g, &squeeze());
    for (mb, policy, order) in [
        (10, "lru", DemotionOrder::Oldest),
        (10, "score", DemotionOrder::Largest),
        (12, "clock", DemotionOrder::Oldest),
        (12, "lru", DemotionOrder::Largest),
    ] {
        let mut c = cache(Mode::Hybrid, &g, mb << 20, policy, order);
        let (got, misses) = run_requests(&mut c, &g, &squeeze());
        let moved = c.placement();
        assert_eq!(got, want, "{mb} MiB, {policy}, {order:?}: outputs differ from sparse resident");
        assert!(moved.demotions > 0 && moved.bytes_demoted > 0, "{mb} MiB, {policy}: {moved:?}");
        if order == DemotionOrder::Oldest {
            assert!(moved.promotions > 0 && moved.bytes_promoted > 0, "{moved:?}");
            // Seats taken under the pages in use moved pages out of their rows.
            assert!(moved.moved_pages > 0 && moved.bytes_moved > 0, "{moved:?}");
        }
        assert!(misses > 0, "demoted requests read their hot buffers");
    }
}

#[test]
fn one_request_stays_on_the_device_and_never_swaps() {
    let g = geometry(true);
    let reqs = vec![Req { id: 1, arrive: 0, prompt: 1500, output: 12, abort_after: None }];
    let mut c = cache(Mode::Hybrid, &g, 24 << 20, "lru", DemotionOrder::Oldest);
    let (got, misses) = run_requests(&mut c, &g, &reqs);
    assert_eq!(got, resident(&g, &reqs));
    assert_eq!(misses, 0, "a request on the device reads its rows by position");
    assert_eq!(c.placement(), Default::default(), "nothing moved");
}

/// A request in pages holds no seat, so the pages left to others grow by a seat a request:
/// hybrid misses no more rows than hisparse at any budget, and none where every request's
/// pages fit beside the seats of the requests off the device. Prints the misses per budget
/// (`cargo test --test cache_hybrid misses -- --nocapture`).
#[test]
fn hybrid_misses_fewer_rows_than_hisparse_and_none_where_pages_fit() {
    let g = geometry(false);
    for mb in [8u64, 14, 20, 24, 28] {
        let misses =
            |mode| run_requests(&mut cache(mode, &g, mb << 20, "score", DemotionOrder::Oldest), &g, &scenario()).1;
        let (hy, hs) = (misses(Mode::Hybrid), misses(Mode::HiSparse));
        eprintln!("{mb} MiB: hybrid {hy} misses, hisparse {hs}");
        assert!(hy < hs, "{mb} MiB: hybrid {hy}, hisparse {hs}");
        if mb == 28 {
            assert_eq!(hy, 0, "28 MiB holds every request's pages once no request in pages holds a seat");
        }
    }
}

#[test]
fn the_engine_in_hybrid_placement_equals_resident() {
    let cpu = CpuBackend::new;
    let resident = common::run_on(cpu(), common::config(Mode::Resident, "lru"), &[], None);
    assert_eq!(common::run_on(cpu(), common::config(Mode::Hybrid, "lru"), &[], None), resident);
}

#[test]
fn capacity_is_hisparse_s() {
    let g = geometry(false);
    for mb in [8u64, 24] {
        let (hy, hs) = (
            cache(Mode::Hybrid, &g, mb << 20, "lru", DemotionOrder::Oldest),
            cache(Mode::HiSparse, &g, mb << 20, "lru", DemotionOrder::Oldest),
        );
        // Keys in the pool: one key page fewer where the budget's remainder does not cover the
        // pool's rounding of its seats to whole key pages (`SharedPoolShape::bytes`).
        let (a, b) = (hy.capacity(), hs.capacity());
        assert_eq!((a.seats, a.host_pages, a.kv_pages), (b.seats, b.host_pages, b.kv_pages), "{mb} MiB");
        assert!(b.index_pages - a.index_pages <= 1, "{mb} MiB: {a:?} against {b:?}");
        // The pages live in the seats' and keys' bytes, within the budget and within one key page
        // a layer of hisparse's device bytes.
        let (hyb, hsb) = (hy.device_tier_bytes(), hs.device_tier_bytes());
        let key_page = hy.layouts().1.page_bytes(hy.config().hisparse.page_tokens).unwrap() * g.layers;
        assert!(
            hyb <= (mb << 20) as usize && hyb.abs_diff(hsb) < key_page,
            "{mb} MiB: hybrid {hyb} B, hisparse {hsb} B"
        );
    }
}

mod random {
    use super::*;
    use proptest::prelude::*;

    fn requests() -> impl Strategy<Value = Vec<Req>> {
        prop::collection::vec((0usize..8, 20usize..2500, 1usize..12, prop::option::weighted(0.2, 0usize..6)), 3..8)
            .prop_map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (arrive, prompt, output, abort))| Req {
                        id: i as u64 + 1,
                        arrive,
                        prompt,
                        output,
                        abort_after: abort.filter(|&a| a < output),
                    })
                    .collect()
            })
    }

    /// Random arrivals, lengths and aborts under a tight budget: every token's outputs equal
    /// sparse resident's whatever was demoted and promoted, and the cache ends empty; across
    /// the cases, requests were demoted and promoted.
    #[test]
    fn random_arrivals_stay_bit_identical() {
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases: 12, ..ProptestConfig::default() });
        let moved = std::cell::Cell::new((0u64, 0u64));
        runner
            .run(&(requests(), 6u64..13, any::<bool>()), |(reqs, mb, largest)| {
                let g = geometry(false);
                let order = if largest { DemotionOrder::Largest } else { DemotionOrder::Oldest };
                let mut c = cache(Mode::Hybrid, &g, mb << 20, "lru", order);
                let (got, _) = run_requests(&mut c, &g, &reqs);
                prop_assert_eq!(got, resident(&g, &reqs));
                prop_assert_eq!(c.device_bytes_in_use(), 0);
                let (d, p) = moved.get();
                moved.set((d + c.placement().demotions, p + c.placement().promotions));
                Ok(())
            })
            .unwrap();
        let (d, p) = moved.get();
        assert!(d > 0 && p > 0, "the random cases demoted {d} and promoted {p} requests");
    }
}
