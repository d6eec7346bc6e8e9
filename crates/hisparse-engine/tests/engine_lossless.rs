//! The hierarchy is lossless: for the same requests, the resident and hisparse modes produce
//! bit-identical attention outputs over many steps — requests of different lengths joining and
//! leaving, every online policy, a policy swapped mid-run, and a slow backup worker.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::Duration;

use hisparse_engine::{Engine, EngineConfig, Outcome, RequestSpec};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{KvGeometry, Mode, RequestId};

type Digests = BTreeMap<(u64, u32, u32), u64>;

fn requests() -> Vec<RequestSpec> {
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

fn config(mode: Mode, policy: &str) -> EngineConfig {
    let mut c = EngineConfig::new(KvGeometry::preset("cpu-small").unwrap(), mode, 64 << 20);
    c.hisparse.eviction_policy = policy.into();
    c.hisparse.max_request_tokens = 4096;
    c.typical_tokens = 2048;
    c.capture_digests = true;
    c
}

/// Runs the requests (arriving two at a time) and returns every digest.
fn run(mut cfg: EngineConfig, swap_policies: &[&str], delay: Option<Duration>) -> Digests {
    cfg.backup_delay = delay;
    let mut e = Engine::new(CpuBackend::new(), cfg).unwrap();
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
            e.runtime().set_policy(p, 5).unwrap();
            // The batch cap changes too: 2 requests, then no cap, then 3.
            let mut c = e.runtime().get();
            c.max_running = [2, 0, 3][(step / 7) % 3];
            e.runtime().set(c).unwrap();
        }
        let rep = e.step().unwrap();
        for (id, tok, layer, d) in rep.digests {
            assert!(digests.insert((id.0, tok, layer), d).is_none(), "digest recorded twice");
        }
        step += 1;
        assert!(step < 500, "the engine does not finish");
    }
    assert!(e.outcomes().iter().all(|(_, o)| matches!(o, Outcome::Finished { .. })), "{:?}", e.outcomes());
    e.check_pools().unwrap();
    digests
}

fn expected_count() -> usize {
    requests().iter().map(|r| r.output_tokens * 4).sum()
}

#[test]
fn hisparse_equals_resident_for_every_policy() {
    let resident = run(config(Mode::Resident, "lru"), &[], None);
    assert_eq!(resident.len(), expected_count());
    for policy in ["lru", "fifo", "random", "clock"] {
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
