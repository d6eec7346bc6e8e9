//! The hierarchy is lossless: for the same requests, the resident and hisparse modes produce
//! bit-identical attention outputs over many steps — requests of different lengths joining and
//! leaving, every online policy, a policy swapped mid-run, and a slow backup worker (through the
//! engine, the per-layer API's first client).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{Digests, config, expected_count, run_on};
use hisparse_engine::EngineConfig;
use hisparse_kernels::CpuBackend;
use hisparse_memory::Mode;

fn run(cfg: EngineConfig, swap_policies: &[&str], delay: Option<Duration>) -> Digests {
    run_on(CpuBackend::new(), cfg, swap_policies, delay)
}

#[test]
fn hisparse_equals_resident_for_every_policy() {
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    assert_eq!(resident.len(), expected_count());
    let online: Vec<_> = hisparse_policy::policy::builtin(0)
        .into_iter()
        .filter(|p| !p.needs_future())
        .map(|p| p.name().to_string())
        .collect();
    assert!(online.len() >= 9, "{online:?}");
    for policy in &online {
        let hs = run(config(Mode::HiSparse, policy), &[], None);
        assert_eq!(hs, resident, "{policy}: outputs differ from the resident baseline");
    }
    // Different requests give different outputs: the check can fail.
    let distinct: std::collections::HashSet<u64> = resident.values().copied().collect();
    assert!(distinct.len() > resident.len() / 2);
}

#[test]
fn swapping_the_policy_and_batch_cap_mid_run_stays_lossless() {
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    let hs = run(config(Mode::HiSparse, "lru"), &["clock", "random", "fifo", "lru"], None);
    assert_eq!(hs, resident);
}

#[test]
fn a_slow_backup_worker_stays_lossless() {
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    let hs = run(config(Mode::HiSparse, "clock"), &[], Some(Duration::from_millis(2)));
    assert_eq!(hs, resident);
}

/// `miss_fill = "attention"`, `"deferred"`, `"hits-first"`, `"copy-engine"` or `"auto"` on the CPU backend: its swap-in copies
/// the misses either way (it cannot leave them to the attention), so the outputs stay the
/// resident ones.
#[test]
fn misses_left_to_the_attention_on_the_cpu_are_still_copied_and_lossless() {
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    for (fill, policy) in [
        ("attention", "clock"),
        ("deferred", "clock"),
        ("deferred-gather", "lru"),
        ("hits-first", "s3fifo"),
        ("copy-engine", "lru"),
        ("auto", "score"),
    ] {
        let form = fill.parse::<hisparse_engine::MissFillMode>().unwrap().into();
        let backend = CpuBackend::new().with_miss_fill(form).unwrap();
        assert_eq!(run_on(backend, config(Mode::HiSparse, policy), &[], None), resident, "{fill} / {policy}");
    }
}

/// With the indexer's queries quantised to fp8 (both modes score the same quantised values),
/// hisparse still equals resident; the selection, and so the outputs, differ from exact queries.
#[test]
fn fp8_index_queries_stay_lossless() {
    let fp8 = |mode, policy| {
        let mut c = config(mode, policy);
        c.cache.index_queries = hisparse_kernels::IndexerQueries::Fp8;
        c
    };
    let resident = run(fp8(Mode::Resident, "lru"), &[], None);
    for policy in ["lru", "score"] {
        assert_eq!(run(fp8(Mode::HiSparse, policy), &[], None), resident, "{policy}");
    }
    let exact = run(config(Mode::Resident, "lru"), &[], None);
    assert_eq!(exact.len(), resident.len());
    assert_ne!(exact, resident, "fp8 queries select differently somewhere");
}

/// Two long requests decoded together: per step, hits, misses and host-to-device bytes.
fn long_counts(backend: CpuBackend, cfg: EngineConfig) -> Vec<(u64, u64, u64)> {
    let mut e = hisparse_engine::Engine::new(backend, cfg).unwrap();
    for (i, prompt_tokens) in [1500, 1900].into_iter().enumerate() {
        let id = hisparse_memory::RequestId(i as u64);
        e.submit(hisparse_engine::RequestSpec { id, prompt_tokens, output_tokens: 150 }).unwrap();
    }
    let mut out = Vec::new();
    while !e.is_idle() {
        let m = e.step().unwrap().metrics;
        out.push((m.swap.hits, m.swap.misses, m.swap.bytes_h2d));
    }
    out
}

/// `miss_fill = "no-copies"` (the sweep's timing bound): the swap-in decides as always (the same
/// hits and misses every step) but copies rows only into slots never written (the CPU attention
/// refuses all-zero rows): once the buffers are full, nothing crosses; and the outputs are not
/// the resident ones.
#[test]
fn the_no_copies_bound_decides_alike_copies_only_cold_slots_and_is_wrong() {
    let bound_backend = CpuBackend::new().with_miss_fill(hisparse_engine::MissFill::NoCopies { max_batch: 8 }).unwrap();
    let cfg = config(Mode::HiSparse, "lru");
    let (hs, bound) = (long_counts(CpuBackend::new(), cfg.clone()), long_counts(bound_backend, cfg.clone()));
    assert_eq!(hs.len(), 150);
    let decisions = |c: &[(u64, u64, u64)]| c.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>();
    assert_eq!(decisions(&bound), decisions(&hs), "the bound decides as hisparse does");
    let late = |c: &[(u64, u64, u64)]| c[20..].iter().map(|c| c.2).sum::<u64>();
    assert!(late(&hs) > 0 && hs[20..].iter().map(|c| c.1).sum::<u64>() > 0, "misses after the buffers filled");
    assert_eq!(late(&bound), 0, "bytes copied into warm slots");
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    let outputs = run_on(bound_backend, cfg, &[], None);
    assert_eq!(outputs.len(), resident.len());
    let same = outputs.iter().filter(|(k, d)| resident.get(k) == Some(d)).count();
    assert!(same < outputs.len(), "every output equals the resident one");
}
