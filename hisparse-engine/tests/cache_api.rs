//! The per-layer API ([`KvCache`], [`DecodeStep`]) driven as another engine would: caller-made
//! rows, keys and queries (functions of request, layer and position only), requests of
//! different lengths arriving between steps and waiting when the tiers are full, one aborted
//! mid-run. Resident and hisparse give bit-identical outputs for every online eviction policy
//! and prefetcher, with a slowed backup worker too; bad input is refused naming the field; nothing
//! leaks.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use half::bf16;
use hisparse_engine::{CacheConfig, EngineError, KvCache, LayerInputs, Prompt, Rows};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{Admission, IndexerLayout, KvGeometry, Mode, RequestId};
use hisparse_policy::PolicyConfig;
use hisparse_policy::policy::POLICY_NAMES;
use hisparse_policy::prefetch::{PREFETCHER_NAMES, make_prefetcher};

/// (request, token index, layer) → FNV of the output and LSE bits.
type Digests = BTreeMap<(u64, u32, u32), u64>;

fn unit(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn seed(id: u64, l: usize, p: usize, what: u64) -> u64 {
    ((id * 131 + l as u64) * 1_000_003 + p as u64) * 7 + what
}

fn digest(a: &[f32], b: &[f32]) -> u64 {
    a.iter().chain(b).fold(0xcbf2_9ce4_8422_2325, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3))
}

/// A request of the scenario: arrival step, prompt, output tokens, abort after this many tokens.
struct Req {
    id: u64,
    arrive: usize,
    prompt: usize,
    output: usize,
    abort_after: Option<usize>,
}

fn scenario() -> Vec<Req> {
    let r = |id, arrive, prompt, output, abort_after| Req { id, arrive, prompt, output, abort_after };
    vec![
        r(1, 0, 100, 12, None),
        r(2, 0, 700, 20, None),
        r(3, 2, 500, 30, None),
        r(4, 3, 1500, 16, Some(7)),
        r(5, 5, 300, 10, None),
        r(6, 9, 2000, 8, None),
    ]
}

fn geometry(shared: bool) -> KvGeometry {
    let g = KvGeometry::preset("cpu-small").unwrap();
    if shared { g.with_indexers(IndexerLayout::Every { first_full: 1, freq: 2 }) } else { g }
}

fn cache(mode: Mode, g: &KvGeometry, policy: &str, prefetcher: &str, delay: Option<Duration>) -> KvCache<CpuBackend> {
    let mut cfg = CacheConfig::new(g.clone(), mode, 24 << 20);
    cfg.hisparse.max_request_tokens = 4096;
    cfg.typical_tokens = 2048;
    cfg.backup_delay = delay;
    let p = hisparse_policy::policy::make(policy, &PolicyConfig { seed: 5, ..PolicyConfig::default() }).unwrap();
    let f = make_prefetcher(prefetcher, &cfg.hisparse.prefetch()).unwrap();
    KvCache::new(CpuBackend::new(), cfg, p, f).unwrap()
}

fn prompt_rows(c: &KvCache<CpuBackend>, g: &KvGeometry, r: &Req) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let (kv_row, key) = c.layouts();
    let rows = (0..g.layers)
        .map(|l| {
            let mut b = vec![0u8; r.prompt * kv_row.row_bytes()];
            for (p, row) in b.chunks_exact_mut(kv_row.row_bytes()).enumerate() {
                kv_row.encode(&unit(seed(r.id, l, p, 0), g.d_qk()), row).unwrap();
            }
            b
        })
        .collect();
    let keys = g
        .full_layers()
        .into_iter()
        .map(|l| {
            let mut b = vec![0u8; r.prompt * key.row_bytes()];
            for (p, row) in b.chunks_exact_mut(key.row_bytes()).enumerate() {
                key.encode(&unit(seed(r.id, l, p, 1), g.index_dim), row).unwrap();
            }
            b
        })
        .collect();
    (rows, keys)
}

/// Runs the scenario through the API; returns every digest and the hisparse misses.
fn run(mode: Mode, shared: bool, policy: &str, prefetcher: &str, delay: Option<Duration>) -> (Digests, u64) {
    let g = geometry(shared);
    let mut c = cache(mode, &g, policy, prefetcher, delay);
    let (kv_row, key) = c.layouts();
    let reqs = scenario();
    let (mut waiting, mut running, mut out) = (Vec::new(), Vec::<(usize, usize)>::new(), Digests::new());
    let mut misses = 0;
    let (mut step, mut done) = (0, 0);
    while done < reqs.len() {
        waiting.extend((0..reqs.len()).filter(|&i| reqs[i].arrive == step));
        // Admission in arrival order; the first that must wait holds back the rest.
        while let Some(&i) = waiting.first() {
            let r = &reqs[i];
            let (rows, keys) = prompt_rows(&c, &g, r);
            let prompt = Prompt {
                tokens: r.prompt,
                kv_rows: rows.iter().map(|b| Rows::Host(b)).collect(),
                index_keys: keys.iter().map(|b| Rows::Host(b)).collect(),
            };
            match c.admit(RequestId(r.id), &prompt, r.prompt + r.output).unwrap() {
                Admission::Admitted => {
                    waiting.remove(0);
                    running.push((i, 0));
                }
                Admission::Wait { .. } => break,
                Admission::Rejected { reason } => panic!("request {} rejected: {reason}", r.id),
            }
        }
        let batch: Vec<RequestId> = running.iter().map(|&(i, _)| RequestId(reqs[i].id)).collect();
        let n = batch.len();
        if n > 0 {
            let mut s = c.begin_step(&batch).unwrap();
            for l in 0..g.layers {
                let full = g.is_full(l);
                let (mut iq, mut iw, mut keys, mut aq, mut rows) = (vec![], vec![], vec![], vec![], vec![]);
                for &(i, t) in &running {
                    let (id, p) = (reqs[i].id, reqs[i].prompt + t);
                    iq.extend(unit(seed(id, l, p, 2), g.index_heads * g.index_dim).into_iter().map(bf16::from_f32));
                    iw.extend(unit(seed(id, l, p, 3), g.index_heads).into_iter().map(|x| x.abs() + 0.05));
                    aq.extend(unit(seed(id, l, p, 4), g.q_heads * g.d_qk()).into_iter().map(bf16::from_f32));
                    let mut row = vec![0u8; kv_row.row_bytes()];
                    kv_row.encode(&unit(seed(id, l, p, 0), g.d_qk()), &mut row).unwrap();
                    rows.extend(row);
                    let mut k = vec![0u8; key.row_bytes()];
                    key.encode(&unit(seed(id, l, p, 1), g.index_dim), &mut k).unwrap();
                    keys.extend(k);
                }
                let inputs = LayerInputs {
                    index_queries: full.then_some(&iq),
                    index_weights: full.then_some(&iw),
                    new_index_keys: full.then_some(&keys),
                    attention_queries: &aq,
                    new_kv_rows: &rows,
                };
                let (mut o, mut e) = (vec![0f32; n * g.q_heads * g.d_v()], vec![0f32; n * g.q_heads]);
                s.layer(l, &inputs, &mut o, &mut e).unwrap();
                let (po, pe) = (g.q_heads * g.d_v(), g.q_heads);
                for (j, &(i, t)) in running.iter().enumerate() {
                    let d = digest(&o[j * po..(j + 1) * po], &e[j * pe..(j + 1) * pe]);
                    assert!(out.insert((reqs[i].id, t as u32, l as u32), d).is_none());
                }
            }
            let m = s.end().unwrap();
            assert_eq!(m.tokens, n);
            misses += m.misses;
        }
        // Finished and aborted requests leave; the cache holds exactly the rest.
        running.iter_mut().for_each(|x| x.1 += 1);
        let mut kept = Vec::new();
        for (i, t) in running.drain(..) {
            let r = &reqs[i];
            if t >= r.output || r.abort_after == Some(t) {
                if r.abort_after == Some(t) {
                    c.abort(RequestId(r.id)).unwrap();
                } else {
                    assert_eq!(c.free(RequestId(r.id)).unwrap(), t as u32);
                }
                done += 1;
            } else {
                kept.push((i, t));
            }
        }
        running = kept;
        c.check().unwrap();
        step += 1;
        assert!(step < 400, "the scenario does not finish");
    }
    assert_eq!(c.reserved(), Default::default());
    assert_eq!((c.device_bytes_in_use(), c.host_bytes_in_use()), (0, 0));
    (out, misses)
}

fn expected() -> usize {
    scenario().iter().map(|r| r.abort_after.unwrap_or(r.output) * 4).sum()
}

fn online_policies() -> Vec<&'static str> {
    POLICY_NAMES
        .iter()
        .copied()
        .filter(|p| !hisparse_policy::policy::make(p, &PolicyConfig::default()).unwrap().needs_future())
        .collect()
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
    c.set_policy(Arc::clone(&clock)).unwrap();
    assert_eq!(c.policy().name(), "clock");
    let belady = hisparse_policy::policy::make("belady", &PolicyConfig::default()).unwrap();
    assert!(c.set_policy(belady).is_err(), "an offline policy needs the future");
}
