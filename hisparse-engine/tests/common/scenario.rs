//! The per-layer API's scenario, on any backend: caller-made rows, keys and queries (functions
//! of request, layer and position only) handed over in the backend's memory, requests of
//! different lengths arriving between steps and waiting when the tiers are full, one aborted
//! mid-run. Every attention output's digest is returned.
#![allow(clippy::unwrap_used, dead_code)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::Duration;

use half::bf16;
use hisparse_engine::{CacheConfig, KvCache, LayerInputs, Prompt, Rows};
use hisparse_kernels::Backend;
use hisparse_memory::{Admission, DeviceMemory, IndexerLayout, KvGeometry, Mode, RequestId};
use hisparse_policy::PolicyConfig;
use hisparse_policy::policy::POLICY_NAMES;
use hisparse_policy::prefetch::make_prefetcher;

/// (request, token index, layer) → FNV of the output and LSE bits.
pub type Digests = BTreeMap<(u64, u32, u32), u64>;

pub fn unit(seed: u64, n: usize) -> Vec<f32> {
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

pub fn seed(id: u64, l: usize, p: usize, what: u64) -> u64 {
    ((id * 131 + l as u64) * 1_000_003 + p as u64) * 7 + what
}

pub fn digest(a: &[f32], b: &[f32]) -> u64 {
    a.iter().chain(b).fold(0xcbf2_9ce4_8422_2325, |h, x| (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3))
}

/// A request of the scenario: arrival step, prompt, output tokens, abort after this many tokens.
#[derive(Clone, Debug)]
pub struct Req {
    pub id: u64,
    pub arrive: usize,
    pub prompt: usize,
    pub output: usize,
    pub abort_after: Option<usize>,
}

impl Req {
    pub fn new(id: u64, arrive: usize, prompt: usize, output: usize, abort_after: Option<usize>) -> Self {
        Self { id, arrive, prompt, output, abort_after }
    }
}

pub fn scenario() -> Vec<Req> {
    let r = Req::new;
    vec![
        r(1, 0, 100, 12, None),
        r(2, 0, 700, 20, None),
        r(3, 2, 500, 30, None),
        r(4, 3, 1500, 16, Some(7)),
        r(5, 5, 300, 10, None),
        r(6, 9, 2000, 8, None),
    ]
}

/// Four requests of 1,000 positions that fill a small shared pool, then two more: hybrid
/// placement must demote requests on the device to seat others, and promote them back.
#[allow(dead_code)] // used by some of the test crates that share this module
pub fn squeeze() -> Vec<Req> {
    let r = Req::new;
    vec![
        r(1, 0, 1000, 12, None),
        r(2, 0, 1000, 20, None),
        r(3, 1, 1000, 30, None),
        r(4, 2, 1000, 16, None),
        r(5, 3, 600, 10, Some(5)),
        r(6, 6, 1200, 8, None),
    ]
}

pub fn geometry(shared: bool) -> KvGeometry {
    let g = KvGeometry::preset("cpu-small").unwrap();
    if shared { g.with_indexers(IndexerLayout::Every { first_full: 1, freq: 2 }) } else { g }
}

pub fn cache<B: Backend>(
    backend: B,
    mode: Mode,
    g: &KvGeometry,
    policy: &str,
    prefetcher: &str,
    delay: Option<Duration>,
) -> KvCache<B>
where
    B::Memory: Clone,
{
    let mut cfg = config(mode, g, 24 << 20);
    cfg.backup_delay = delay;
    cache_with(backend, cfg, policy, prefetcher)
}

/// The scenario's cache config for `mode` over `budget` bytes of device memory.
pub fn config(mode: Mode, g: &KvGeometry, budget: u64) -> CacheConfig {
    let mut cfg = CacheConfig::new(g.clone(), mode, budget);
    cfg.hisparse.max_request_tokens = 4096;
    cfg.typical_tokens = 2048;
    cfg
}

/// A cache of `cfg` with the eviction policy and the prefetcher named `policy` and `prefetcher`.
pub fn cache_with<B: Backend>(backend: B, cfg: CacheConfig, policy: &str, prefetcher: &str) -> KvCache<B>
where
    B::Memory: Clone,
{
    let choice = hisparse_policy::PolicyChoice::parse(policy).unwrap();
    let p = hisparse_policy::Eviction::from_parts(choice, &PolicyConfig { seed: 5, ..PolicyConfig::default() })
        .make_online()
        .unwrap();
    let f = make_prefetcher(prefetcher, &cfg.hisparse.prefetch.parts().1).unwrap();
    KvCache::new(backend, cfg, p, f).unwrap()
}

pub fn prompt_rows<B: Backend>(c: &KvCache<B>, g: &KvGeometry, r: &Req) -> (Vec<Vec<u8>>, Vec<Vec<u8>>)
where
    B::Memory: Clone,
{
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

/// Runs the scenario through the API on `backend`; returns every digest and the hisparse
/// misses.
pub fn run_on<B: Backend>(
    backend: B,
    mode: Mode,
    shared: bool,
    policy: &str,
    prefetcher: &str,
    delay: Option<Duration>,
) -> (Digests, u64)
where
    B::Memory: Clone,
{
    let g = geometry(shared);
    let mut c = cache(backend, mode, &g, policy, prefetcher, delay);
    run_requests(&mut c, &g, &scenario())
}

/// Runs `reqs` through the API on cache `c` (admission in arrival order, the first that must
/// wait holding back the rest); returns every digest and the hisparse misses. The cache ends
/// empty.
pub fn run_requests<B: Backend>(c: &mut KvCache<B>, g: &KvGeometry, reqs: &[Req]) -> (Digests, u64)
where
    B::Memory: Clone,
{
    let (kv_row, key) = c.layouts();
    let (mut waiting, mut running, mut out) = (Vec::new(), Vec::<(usize, usize)>::new(), Digests::new());
    let mut misses = 0;
    let (mut step, mut done) = (0, 0);
    while done < reqs.len() {
        waiting.extend((0..reqs.len()).filter(|&i| reqs[i].arrive == step));
        // Admission in arrival order; the first that must wait holds back the rest.
        while let Some(&i) = waiting.first() {
            let r = &reqs[i];
            let (rows, keys) = prompt_rows(c, g, r);
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
                // The model's tensors, in the backend's memory.
                let mem = s.cache().backend().memory().clone();
                let (iq, iw, keys) = (mem.upload(&iq).unwrap(), mem.upload(&iw).unwrap(), mem.upload(&keys).unwrap());
                let (aq, rows) = (mem.upload(&aq).unwrap(), mem.upload(&rows).unwrap());
                let inputs = LayerInputs {
                    index_queries: full.then_some(&iq),
                    index_weights: full.then_some(&iw),
                    new_index_keys: full.then_some(&keys),
                    attention_queries: &aq,
                    new_kv_rows: &rows,
                };
                let mut od = mem.alloc_zeroed::<f32>(n * g.q_heads * g.d_v()).unwrap();
                let mut ed = mem.alloc_zeroed::<f32>(n * g.q_heads).unwrap();
                s.layer(l, &inputs, &mut od, &mut ed).unwrap();
                let (o, e) = (mem.download(&od).unwrap(), mem.download(&ed).unwrap());
                let (po, pe) = (g.q_heads * g.d_v(), g.q_heads);
                for (j, &(i, t)) in running.iter().enumerate() {
                    let d = digest(&o[j * po..(j + 1) * po], &e[j * pe..(j + 1) * pe]);
                    assert!(out.insert((reqs[i].id, t as u32, l as u32), d).is_none());
                }
            }
            let m = s.end().unwrap();
            assert_eq!(m.tokens, n);
            misses += m.swap.misses;
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

pub fn expected() -> usize {
    scenario().iter().map(|r| r.abort_after.unwrap_or(r.output) * 4).sum()
}

pub fn online_policies() -> Vec<&'static str> {
    POLICY_NAMES
        .iter()
        .copied()
        .filter(|p| !hisparse_policy::policy::make(p, &PolicyConfig::default()).unwrap().needs_future())
        .collect()
}
