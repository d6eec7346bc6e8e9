//! Shared by the lossless tests (CPU and CUDA): the requests, the engine config, and a run that
//! returns every attention digest.
#![allow(clippy::unwrap_used, dead_code)] // tests: a failed unwrap is a failed test

pub mod scenario;

use std::collections::BTreeMap;
use std::time::Duration;

use hisparse_engine::{Engine, EngineConfig, Outcome, RequestSpec};
use hisparse_kernels::Backend;
use hisparse_memory::{KvGeometry, Mode, RequestId};

pub type Digests = BTreeMap<(u64, u32, u32), u64>;

pub fn requests() -> Vec<RequestSpec> {
    // top_k 256, buffer 512: a short prompt (selects everything), one on the fast path with a real
    // top-k, one that crosses from the fast path into the policy, and two cold ones.
    [(100, 12), (300, 20), (500, 30), (700, 16), (1500, 10)]
        .iter()
        .enumerate()
        .map(|(i, &(prompt_tokens, output_tokens))| RequestSpec {
            id: RequestId(i as u64 + 10),
            prompt_tokens,
            output_tokens,
        })
        .collect()
}

pub fn config(mode: Mode, policy: &str) -> EngineConfig {
    let mut c = EngineConfig::new(KvGeometry::preset("cpu-small").unwrap(), mode, 64 << 20);
    c.cache.hisparse.eviction = policy.parse().unwrap();
    c.cache.hisparse.max_request_tokens = 4096;
    c.cache.typical_tokens = 2048;
    c.capture_digests = true;
    c
}

/// The prefetchers the GPU tests run a fill form under, each with its HiSparse config (`clock`,
/// launch graphs; IndexShare layers for `shared-index`).
pub fn prefetcher_configs() -> Vec<(&'static str, EngineConfig)> {
    [("none", false), ("adjacent-layer", false), ("shared-index", true)]
        .into_iter()
        .map(|(prefetcher, share)| {
            let mut c = config(Mode::HiSparse, "clock");
            c.cache.hisparse.prefetch = prefetcher.parse().unwrap();
            if share {
                c.cache.geometry =
                    c.cache.geometry.with_indexers(hisparse_memory::IndexerLayout::Every { first_full: 1, freq: 2 });
            }
            (prefetcher, c)
        })
        .collect()
}

/// Runs the requests (arriving two at a time) on `backend` and returns every digest.
pub fn run_on<B: Backend>(backend: B, cfg: EngineConfig, swap_policies: &[&str], delay: Option<Duration>) -> Digests
where
    B::Memory: Clone,
{
    run_counted(backend, cfg, swap_policies, delay).0
}

/// What one step counted: hits, misses, launch graphs captured and replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCounts {
    pub hits: u64,
    pub misses: u64,
    pub captures: u64,
    pub replays: u64,
    /// Inputs generated during the previous step.
    pub ahead: bool,
    /// Rows prefetched, and of those used by a selection and evicted unused.
    pub prefetched: u64,
    pub prefetch_useful: u64,
    pub prefetch_wasted: u64,
}

/// [`run_on`], also returning every step's counts.
pub fn run_counted<B: Backend>(
    backend: B,
    mut cfg: EngineConfig,
    swap_policies: &[&str],
    delay: Option<Duration>,
) -> (Digests, Vec<StepCounts>)
where
    B::Memory: Clone,
{
    let mut counts = Vec::new();
    cfg.cache.backup_delay = delay;
    let mut e = Engine::new(backend, cfg).unwrap();
    let reqs = requests();
    let mut digests = Digests::new();
    let mut step = 0;
    let mut next = 0;
    while next < reqs.len() || !e.is_idle() {
        if step % 3 == 0 {
            for r in reqs.iter().skip(next).take(2) {
                e.submit(*r).unwrap();
            }
            next = (next + 2).min(reqs.len());
        }
        if step > 0 && step % 7 == 0 && !swap_policies.is_empty() {
            let p = swap_policies[(step / 7) % swap_policies.len()];
            e.runtime().set_policy(p.parse::<hisparse_policy::Eviction>().unwrap().with_seed(5)).unwrap();
            // The batch cap changes too: 2 requests, then no cap, then 3.
            let mut c = e.runtime().get();
            c.max_running = [2, 0, 3][(step / 7) % 3];
            e.runtime().set(c).unwrap();
        }
        let rep = e.step().unwrap();
        let m = &rep.metrics;
        counts.push(StepCounts {
            hits: m.swap.hits,
            misses: m.swap.misses,
            captures: m.graph_captures,
            replays: m.graph_replays,
            ahead: m.inputs_ahead,
            prefetched: m.swap.prefetched,
            prefetch_useful: m.swap.prefetch_useful,
            prefetch_wasted: m.swap.prefetch_wasted,
        });
        for (id, tok, layer, d) in rep.digests {
            assert!(digests.insert((id.0, tok, layer), d).is_none(), "digest recorded twice");
        }
        step += 1;
        assert!(step < 500, "the engine does not finish");
    }
    assert!(e.outcomes().iter().all(|(_, o)| matches!(o, Outcome::Finished { .. })), "{:?}", e.outcomes());
    e.check_pools().unwrap();
    (digests, counts)
}

pub fn expected_count() -> usize {
    requests().iter().map(|r| r.output_tokens * 4).sum()
}
