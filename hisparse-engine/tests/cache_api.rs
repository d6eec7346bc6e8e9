//! The per-layer API ([`KvCache`], [`DecodeStep`]) driven as another engine would: caller-made
//! rows, keys and queries (functions of request, layer and position only), requests of
//! different lengths arriving between steps and waiting when the tiers are full, one aborted
//! mid-run. Resident and hisparse give bit-identical outputs for every online eviction policy
//! and prefetcher, with a slowed backup worker too; bad input is refused naming the field; nothing
//! leaks.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::scenario::{Digests, Req, expected, geometry, online_policies, prompt_rows, run_on};
use half::bf16;
use hisparse_engine::{EngineError, KvCache, LayerInputs, Prompt, Rows};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{Admission, KvGeometry, Mode, RequestId};
use hisparse_policy::PolicyConfig;
use hisparse_policy::prefetch::PREFETCHER_NAMES;

fn run(mode: Mode, shared: bool, policy: &str, prefetcher: &str, delay: Option<Duration>) -> (Digests, u64) {
    run_on(CpuBackend::new(), mode, shared, policy, prefetcher, delay)
}

fn cache(mode: Mode, g: &KvGeometry, policy: &str, prefetcher: &str, delay: Option<Duration>) -> KvCache<CpuBackend> {
    common::scenario::cache(CpuBackend::new(), mode, g, policy, prefetcher, delay)
}

#[test]
fn hisparse_equals_resident_through_the_api_for_every_policy() {
    let (resident, _) = run(Mode::Resident, false, "lru", "none", None);
    assert_eq!(resident.len(), expected());
    let distinct: std::collections::HashSet<u64> = resident.values().copied().collect();
    assert!(distinct.len() > resident.len() / 2, "outputs must differ between tokens");
    let policies = online_policies();
    assert!(policies.len() >= 8, "{policies:?}");
    for p in policies {
        let (hs, misses) = run(Mode::HiSparse, false, p, "none", None);
        assert!(misses > 0, "{p}: the scenario must miss");
        assert_eq!(hs, resident, "{p}: outputs differ from the resident baseline");
    }
}

#[test]
fn every_prefetcher_and_a_slow_backup_stay_lossless_through_the_api() {
    for shared in [false, true] {
        let (resident, _) = run(Mode::Resident, shared, "lru", "none", None);
        for f in PREFETCHER_NAMES {
            let (hs, _) = run(Mode::HiSparse, shared, "score", f, None);
            assert_eq!(hs, resident, "{f} (shared index: {shared})");
        }
        let (hs, _) = run(Mode::HiSparse, shared, "clock", "adjacent-layer", Some(Duration::from_millis(1)));
        assert_eq!(hs, resident, "slow backup (shared index: {shared})");
    }
}

#[test]
fn bad_inputs_are_refused_naming_the_field_and_leave_nothing() {
    let g = geometry(true); // layers 0 and 2 full, 1 and 3 shared
    let mut c = cache(Mode::HiSparse, &g, "lru", "none", None);
    let r = Req { id: 1, arrive: 0, prompt: 600, output: 4, abort_after: None };
    let (rows, keys) = prompt_rows(&c, &g, &r);
    let field = |e: EngineError| match e {
        EngineError::Input { field, .. } => field,
        other => panic!("not an input error: {other}"),
    };
    // A short KV row list, a short key buffer, a reservation below the prompt.
    let mut p = Prompt { tokens: 600, kv_rows: vec![Rows::Host(&rows[0])], index_keys: vec![] };
    assert_eq!(field(c.admit(RequestId(1), &p, 700).unwrap_err()), "prompt.kv_rows");
    p.kv_rows = rows.iter().map(|b| Rows::Host(b)).collect();
    p.index_keys = vec![Rows::Host(&keys[0]), Rows::Host(&keys[1][..100])];
    assert_eq!(field(c.admit(RequestId(1), &p, 700).unwrap_err()), "prompt.index_keys[1]");
    p.index_keys = keys.iter().map(|b| Rows::Host(b)).collect();
    assert_eq!(field(c.admit(RequestId(1), &p, 10).unwrap_err()), "reserve_tokens");
    c.check().unwrap();
    assert_eq!(c.reserved(), Default::default());
    assert_eq!(c.admit(RequestId(1), &p, 602).unwrap(), Admission::Admitted);
    assert!(matches!(c.admit(RequestId(1), &p, 602).unwrap_err(), EngineError::Request { id: 1, .. }));
    // Unknown or repeated requests in a batch.
    assert!(matches!(c.begin_step(&[RequestId(9)]).err().unwrap(), EngineError::Request { id: 9, .. }));
    assert!(matches!(c.begin_step(&[RequestId(1), RequestId(1)]).err().unwrap(), EngineError::Request { id: 1, .. }));

    let (kv_row, key) = c.layouts();
    let iq = vec![bf16::ONE; g.index_heads * g.index_dim];
    let iw = vec![1f32; g.index_heads];
    let aq = vec![bf16::ONE; g.q_heads * g.d_qk()];
    let (row, k) = (vec![1u8; kv_row.row_bytes()], vec![1u8; key.row_bytes()]);
    let (mut o, mut e) = (vec![0f32; g.q_heads * g.d_v()], vec![0f32; g.q_heads]);
    let ok = LayerInputs {
        index_queries: Some(&iq),
        index_weights: Some(&iw),
        new_index_keys: Some(&k),
        attention_queries: &aq,
        new_kv_rows: &row,
    };
    let mut s = c.begin_step(&[RequestId(1)]).unwrap();
    assert_eq!(field(s.layer(1, &ok, &mut o, &mut e).unwrap_err()), "layer");
    let short = vec![bf16::ONE; 3];
    assert_eq!(
        field(s.layer(0, &LayerInputs { attention_queries: &short, ..ok }, &mut o, &mut e).unwrap_err()),
        "attention_queries"
    );
    assert_eq!(
        field(s.layer(0, &LayerInputs { index_weights: None, ..ok }, &mut o, &mut e).unwrap_err()),
        "index_weights"
    );
    let mut small = vec![0f32; 2];
    assert_eq!(field(s.layer(0, &ok, &mut o, &mut small).unwrap_err()), "lse");
    s.layer(0, &ok, &mut o, &mut e).unwrap();
    // Layer 1 shares layer 0's index: it takes no index inputs.
    assert_eq!(field(s.layer(1, &ok, &mut o, &mut e).unwrap_err()), "index_queries");
    let shared = LayerInputs { index_queries: None, index_weights: None, new_index_keys: None, ..ok };
    s.layer(1, &shared, &mut o, &mut e).unwrap();
    // Ending early fails; the dropped step leaves its request broken: it can only be aborted.
    assert_eq!(field(s.end().unwrap_err()), "layer");
    let err = c.begin_step(&[RequestId(1)]).err().unwrap();
    assert!(err.to_string().contains("abort"), "{err}");
    c.abort(RequestId(1)).unwrap();
    c.check().unwrap();
    assert_eq!((c.device_bytes_in_use(), c.host_bytes_in_use()), (0, 0));
    assert_eq!(c.reserved(), Default::default());
}

#[test]
fn reservations_bound_a_request_and_grow_on_demand() {
    let g = geometry(false);
    let mut c = cache(Mode::HiSparse, &g, "lru", "none", None);
    let r = Req { id: 3, arrive: 0, prompt: 64, output: 1, abort_after: None };
    let (rows, keys) = prompt_rows(&c, &g, &r);
    let p = Prompt {
        tokens: 64,
        kv_rows: rows.iter().map(|b| Rows::Host(b)).collect(),
        index_keys: keys.iter().map(|b| Rows::Host(b)).collect(),
    };
    // Exactly the prompt: no room to decode until the reservation grows.
    assert_eq!(c.admit(RequestId(3), &p, 64).unwrap(), Admission::Admitted);
    let err = c.begin_step(&[RequestId(3)]).err().unwrap();
    assert!(err.to_string().contains("reserve"), "{err}");
    let before = c.reserved();
    assert_eq!(c.reserve(RequestId(3), 64 + 100).unwrap(), Admission::Admitted);
    assert!(c.reserved().host_pages > before.host_pages);
    // More than the host tier could ever hold: refused, keeping what it held.
    let held = c.reserved();
    assert!(matches!(c.reserve(RequestId(3), 1 << 30).unwrap(), Admission::Rejected { .. }));
    assert_eq!(c.reserved(), held);
    // The capacity query agrees with admission.
    assert!(matches!(c.decide(1 << 30), Admission::Rejected { .. }));
    assert_eq!(c.decide(100), Admission::Admitted);
    drop(c.begin_step(&[RequestId(3)]).unwrap()); // dropped before its layers: broken
    assert_eq!(c.abort(RequestId(3)).unwrap(), 0);
    c.check().unwrap();
    assert_eq!(c.reserved(), Default::default());
}

#[test]
fn a_policy_chosen_by_the_caller_is_used() {
    // A policy object made here, not looked up by name at each step: swapping it between steps
    // stays lossless.
    let g = geometry(false);
    let mut c = cache(Mode::HiSparse, &g, "lru", "none", None);
    let clock: Arc<dyn hisparse_policy::EvictionPolicy> =
        hisparse_policy::policy::make("clock", &PolicyConfig::default()).unwrap();
    c.set_policy(hisparse_policy::OnlinePolicy::new(Arc::clone(&clock)).unwrap()).unwrap();
    assert_eq!(c.policy().name(), "clock");
    // A policy object carries no description: the config keeps the last one.
    assert_eq!(c.config().hisparse.eviction, hisparse_policy::Eviction::Lru);
    // One made from a description is what the config then says.
    c.set_policy(hisparse_policy::Eviction::Mq { queues: 3, lifetime: 2 }.make_online().unwrap()).unwrap();
    assert_eq!(c.config().hisparse.eviction, hisparse_policy::Eviction::Mq { queues: 3, lifetime: 2 });
    // An offline policy cannot even be made into one the cache takes.
    let belady = hisparse_policy::policy::make("belady", &PolicyConfig::default()).unwrap();
    assert!(hisparse_policy::OnlinePolicy::new(belady).is_err(), "an offline policy needs the future");
}

#[test]
fn the_host_tier_holds_the_prompt_and_each_new_row() {
    let g = geometry(false);
    let mut c = cache(Mode::HiSparse, &g, "lru", "none", Some(Duration::from_millis(1)));
    let r = Req { id: 1, arrive: 0, prompt: 300, output: 4, abort_after: None };
    let (rows, keys) = prompt_rows(&c, &g, &r);
    let p = Prompt {
        tokens: 300,
        kv_rows: rows.iter().map(|b| Rows::Host(b)).collect(),
        index_keys: keys.iter().map(|b| Rows::Host(b)).collect(),
    };
    assert_eq!(c.admit(RequestId(1), &p, 310).unwrap(), Admission::Admitted);
    let (kv_row, key) = c.layouts();
    let rb = kv_row.row_bytes();
    let mut got = vec![0u8; rb];
    for (l, layer_rows) in rows.iter().enumerate() {
        for pos in [0, 1, 150, 299] {
            c.read_host_row(RequestId(1), l, pos, &mut got).unwrap();
            assert_eq!(got, layer_rows[pos * rb..(pos + 1) * rb], "layer {l}, position {pos}");
        }
    }
    // One step with a distinct new row per layer (the backup slowed): each lands at position 300.
    let iq = vec![bf16::ONE; g.index_heads * g.index_dim];
    let iw = vec![1f32; g.index_heads];
    let aq = vec![bf16::ONE; g.q_heads * g.d_qk()];
    let k = vec![1u8; key.row_bytes()];
    let (mut o, mut e) = (vec![0f32; g.q_heads * g.d_v()], vec![0f32; g.q_heads]);
    let new: Vec<Vec<u8>> = (0..g.layers)
        .map(|l| {
            let mut row = vec![0u8; rb];
            kv_row
                .encode(&common::scenario::unit(common::scenario::seed(1, l, 300, 0) ^ 7, g.d_qk()), &mut row)
                .unwrap();
            row
        })
        .collect();
    let mut s = c.begin_step(&[RequestId(1)]).unwrap();
    for (l, row) in new.iter().enumerate() {
        let inputs = LayerInputs {
            index_queries: Some(&iq),
            index_weights: Some(&iw),
            new_index_keys: Some(&k),
            attention_queries: &aq,
            new_kv_rows: row,
        };
        s.layer(l, &inputs, &mut o, &mut e).unwrap();
    }
    s.end().unwrap();
    for (l, row) in new.iter().enumerate() {
        c.read_host_row(RequestId(1), l, 300, &mut got).unwrap();
        assert_eq!(&got, row, "layer {l}: the step's new row");
    }
    // Past the request's positions, an unknown request, a resident cache: refused.
    let err = c.read_host_row(RequestId(1), 0, 301, &mut got).unwrap_err();
    assert!(matches!(&err, EngineError::Input { field, .. } if field == "position"), "{err}");
    assert!(matches!(c.read_host_row(RequestId(2), 0, 0, &mut got).unwrap_err(), EngineError::Request { id: 2, .. }));
    let mut resident = cache(Mode::Resident, &g, "lru", "none", None);
    assert_eq!(resident.admit(RequestId(1), &p, 310).unwrap(), Admission::Admitted);
    let err = resident.read_host_row(RequestId(1), 0, 0, &mut got).unwrap_err();
    assert!(matches!(err, EngineError::Config { field: "mode", .. }), "{err}");
}

#[test]
fn a_policy_the_miss_fill_cannot_run_is_refused_keeping_the_one_in_use() {
    let g = geometry(false);
    let mut cfg = hisparse_engine::CacheConfig::new(g.clone(), Mode::HiSparse, 24 << 20);
    cfg.hisparse.max_request_tokens = 4096;
    let backend = CpuBackend::new().with_miss_fill(hisparse_engine::MissFill::Deferred).unwrap();
    let mut c = KvCache::with_named_policies(backend, cfg.clone()).unwrap();
    let score = hisparse_policy::Eviction::Score.make_online().unwrap();
    let e = c.set_policy(score).unwrap_err().to_string();
    assert!(e.contains("miss_fill") && e.contains("score"), "{e}");
    assert_eq!((c.policy().name(), &c.config().hisparse.eviction), ("lru", &hisparse_policy::Eviction::Lru));
    // The backend's form refuses such a policy when the cache is made, as well.
    cfg.hisparse.eviction = hisparse_policy::Eviction::Score;
    let backend = CpuBackend::new().with_miss_fill(hisparse_engine::MissFill::Deferred).unwrap();
    let e = KvCache::with_named_policies(backend, cfg).err().expect("refused").to_string();
    assert!(e.contains("miss_fill") && e.contains("score"), "{e}");
}
