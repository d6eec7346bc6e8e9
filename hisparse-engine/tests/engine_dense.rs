//! Dense attention (resident mode, top-k at least every request's length) keeps no index keys:
//! its budget holds KV rows alone, its outputs equal a cache that keeps (and never reads) the
//! keys, and a request past its top-k is refused whole.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use hisparse_engine::{EngineConfig, KvCache};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{Admission, KvGeometry, Mode, RequestId};

/// `base` with top-k 2048 (past every request of `common::requests`) and the longest request
/// `longest` positions: at most 2048 keeps no index, more keeps one.
fn dense(mut base: EngineConfig, longest: usize) -> EngineConfig {
    base.cache.geometry.top_k = 2048;
    // The config asks for a buffer that holds a selection in either mode.
    base.cache.hisparse.device_buffer_size = 2048;
    base.cache.hisparse.max_request_tokens = longest;
    base
}

fn gqa(mode: Mode) -> EngineConfig {
    let mut c = common::config(mode, "lru");
    c.cache = hisparse_engine::CacheConfig {
        hisparse: c.cache.hisparse.clone(),
        typical_tokens: c.cache.typical_tokens,
        ..hisparse_engine::CacheConfig::new(KvGeometry::preset("smollm2-135m").unwrap(), mode, 64 << 20)
    };
    c
}

#[test]
fn dense_attention_keeps_no_keys_and_decodes_as_with_them() {
    for (name, base) in
        [("cpu-small (MLA)", common::config(Mode::Resident, "lru")), ("smollm2 (GQA)", gqa(Mode::Resident))]
    {
        let layers = base.cache.geometry.layers;
        let (without, with) = (dense(base.clone(), 2048), dense(base, 4096));
        assert!(!without.cache.keeps_index() && with.cache.keeps_index(), "{name}");
        let (a, b) =
            (common::run_on(CpuBackend::new(), without, &[], None), common::run_on(CpuBackend::new(), with, &[], None));
        let tokens: usize = common::requests().iter().map(|r| r.output_tokens).sum();
        assert_eq!(a.len(), tokens * layers, "{name}: every digest recorded");
        assert_eq!(a, b, "{name}: dense attention is the same with and without index keys");
    }
}

#[test]
fn dense_attention_spends_the_budget_on_rows_and_refuses_longer_requests() {
    let cfg = dense(common::config(Mode::Resident, "lru"), 2048).cache;
    let (kv, key) = (cfg.geometry.kv_row().unwrap().row_bytes(), cfg.geometry.index_key().unwrap().row_bytes());
    let mut with_keys = cfg.clone();
    with_keys.hisparse.max_request_tokens = 4096;
    let (d, k) = (
        KvCache::with_named_policies(CpuBackend::new(), cfg.clone()).unwrap(),
        KvCache::with_named_policies(CpuBackend::new(), with_keys).unwrap(),
    );
    let (dc, kc) = (d.capacity(), k.capacity());
    assert_eq!(dc.index_pages, 0);
    let (layers, page) = (cfg.geometry.layers as u64, cfg.hisparse.page_tokens as u64);
    let budget = cfg.hisparse.device_kv_bytes;
    assert_eq!(dc.kv_pages as u64, budget / (page * layers * kv as u64));
    let index_layers = cfg.geometry.index_layers() as u64;
    assert_eq!(kc.kv_pages as u64, budget / (page * (layers * kv as u64 + index_layers * key as u64)));
    assert!(dc.kv_pages > kc.kv_pages, "{dc:?} against {kc:?}");

    let mut d = d;
    let e = d.decide(2049);
    assert!(matches!(e, Admission::Admitted), "decide only plans: {e:?}");
    // Random prompt rows and keys (the keys are handed over and dropped).
    let mut seed = 0x9e37_79b9_u32;
    let mut fill = |_: usize, rows: &mut [u8], keys: Option<&mut [u8]>| {
        for b in rows.iter_mut().chain(keys.into_iter().flatten()) {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            *b = (seed >> 24) as u8;
        }
        Ok(())
    };
    let err = d.admit_with(RequestId(1), 64, 2049, &mut fill).unwrap_err().to_string();
    assert!(err.contains("reserve_tokens") && err.contains("2049") && err.contains("top_k 2048"), "{err}");
    d.check().unwrap();
    assert_eq!(d.reserved(), Default::default(), "the refused request holds nothing");
    assert_eq!(d.admit_with(RequestId(1), 64, 2048, &mut fill).unwrap(), Admission::Admitted);
    let err = d.reserve(RequestId(1), 4000).unwrap_err().to_string();
    assert!(err.contains("tokens") && err.contains("4000"), "{err}");
    assert_eq!(d.reserve(RequestId(1), 2000).unwrap(), Admission::Admitted, "within what it holds");
    d.check().unwrap();
}
