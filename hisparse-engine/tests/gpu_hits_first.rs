//! `miss_fill = "hits-first"` on the H200: each layer's attention over its hits runs while its
//! misses are gathered on the deferred stream, then the attention over the misses and the LSE
//! merge. Its summation is partitioned by hit and miss (and the kernel rounds each tile's
//! probabilities to bf16 against the running maximum of its own partition), so it is checked
//! against resident within the attention's bf16 tolerance (same selections, outputs within 4e-3
//! of the largest, as against the CPU twin; LSEs within 1e-5), for every GPU policy that
//! reads no scores; and bit for bit against itself: run again, with the transfer stream slowed
//! by an injected delay, and replayed from launch graphs with each prefetcher — whose hits,
//! misses and prefetches equal the copying swap-in's at every step. A policy that reads scores
//! and the mma.sync attention are refused by name.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{config, run_counted, run_on};
use hisparse_engine::{Engine, EngineConfig, LayerDump};
use hisparse_kernels::cuda::CudaBackend;
use hisparse_memory::Mode;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA GPU").with_splits(3)
}

/// `backend` running the attention over the hits first.
fn hits_first(backend: CudaBackend) -> CudaBackend {
    backend.with_miss_fill(hisparse_kernels::MissFill::HitsFirst).expect("a valid miss-fill form")
}

fn eager(mode: Mode, policy: &str) -> EngineConfig {
    EngineConfig { launch_graphs: false, ..config(mode, policy) }
}

/// Every layer's dump at steps 1, 6 and 12 of the requests decoded together, and the misses.
fn dumps(backend: CudaBackend, cfg: EngineConfig) -> (Vec<LayerDump>, u64) {
    let mut e = Engine::new(backend, cfg).unwrap();
    for r in common::requests() {
        e.submit(r).unwrap();
    }
    let (mut out, mut misses) = (Vec::new(), 0);
    for s in 1..=12 {
        if [1, 6, 12].contains(&s) {
            e.capture_next_step();
        }
        let rep = e.step().unwrap();
        misses += rep.metrics.swap.misses;
        out.extend(rep.dump);
    }
    (out, misses)
}

/// The largest difference of `hs`'s outputs from `resident`'s, relative to the largest output;
/// selections must be equal. (A dump's rows are read at the attention's locations, which for a
/// miss left to the attention name a placeholder slot: they are not compared.)
fn max_out_diff(resident: &[LayerDump], hs: &[LayerDump], what: &str) -> f32 {
    assert_eq!(resident.len(), hs.len(), "{what}: dumps");
    let mut worst = 0f32;
    for (r, h) in resident.iter().zip(hs) {
        assert_eq!((r.layer, &r.requests, &r.selections), (h.layer, &h.requests, &h.selections), "{what}");
        let max = r.out.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max > 0.0, "{what}: outputs are not trivial");
        for (x, y) in r.out.iter().zip(&h.out) {
            worst = worst.max((x - y).abs() / max);
        }
        for (x, y) in r.lse.iter().zip(&h.lse) {
            assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{what} layer {}: lse {x} vs {y}", r.layer);
        }
    }
    worst
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_hits_first_equals_resident_within_bf16_tolerance() {
    let (resident, _) = dumps(gpu(), eager(Mode::Resident, "lru"));
    let policies: Vec<_> =
        hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some() && !p.needs_future()).collect();
    let mut refused = 0;
    for policy in &policies {
        let cfg = eager(Mode::HiSparse, policy.name());
        if policy.needs_scores() {
            let e = Engine::new(hits_first(gpu()), cfg).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("miss_fill") && e.contains(policy.name()), "{}: {e}", policy.name());
            refused += 1;
            continue;
        }
        let (hs, misses) = dumps(hits_first(gpu()), cfg);
        assert!(misses > 0, "{}: the run must miss", policy.name());
        let worst = max_out_diff(&resident, &hs, policy.name());
        println!("hits-first, {}: largest output difference {worst:.3e} of the largest output", policy.name());
        assert!(worst <= 4e-3, "{}: outputs differ by {worst:e} of the largest", policy.name());
    }
    assert!(refused > 0 && refused < policies.len(), "{refused} of {} policies refused", policies.len());
    // The mma.sync attention has no skip mode: refused by name.
    let e = Engine::new(hits_first(gpu().with_wgmma_attention(false)), eager(Mode::HiSparse, "lru"));
    let e = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("miss_fill") && e.contains("mma-sync"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_hits_first_is_reproducible_slowed_and_replayed() {
    let base = run_on(hits_first(gpu()), eager(Mode::HiSparse, "s3fifo"), &[], None);
    assert_eq!(run_on(hits_first(gpu()), eager(Mode::HiSparse, "s3fifo"), &[], None), base, "run again");
    let mut slow = eager(Mode::HiSparse, "s3fifo");
    slow.cache.transfer_delay = Some(Duration::from_micros(300));
    assert_eq!(run_on(hits_first(gpu()), slow, &[], None), base, "the transfer stream slowed by 300 us");
    // Launch graphs (fork and join through events) against eager launches, with each prefetcher
    // (IndexShare layers for shared-index); the counts against the copying swap-in's.
    let strip = |c: &[common::StepCounts]| c.iter().map(|c| (c.hits, c.misses, c.prefetched)).collect::<Vec<_>>();
    for (prefetcher, c) in common::prefetcher_configs() {
        let (_, cc) = run_counted(gpu(), c.clone(), &[], None);
        let (replayed, hc) = run_counted(hits_first(gpu()), c.clone(), &[], None);
        let (launched, _) = run_counted(hits_first(gpu()), EngineConfig { launch_graphs: false, ..c }, &[], None);
        assert!(hc.iter().map(|c| c.replays).sum::<u64>() >= 10, "{prefetcher}: graphs replayed");
        assert!(hc.iter().map(|c| c.misses).sum::<u64>() > 0, "{prefetcher}: the run must miss");
        assert_eq!(strip(&hc), strip(&cc), "{prefetcher}: hits, misses and prefetches differ from the copy's");
        assert_eq!(replayed.len(), launched.len(), "{prefetcher}: a digest of every layer of every step");
        for (k, d) in &replayed {
            assert_eq!(launched.get(k), Some(d), "{prefetcher}: replayed output {k:?} differs from eager");
        }
    }
}
