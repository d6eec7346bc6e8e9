//! Serving behaviour through the engine: requests of different prompt and output lengths in one
//! batch, arriving between steps, one aborted mid-run (waiting or decoding) with everything it
//! held returned and the others' outputs unchanged; every token's latency measured from its
//! request's arrival (the first) or its previous token; the bounded queue.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::{Digests, config, requests};
use hisparse_engine::{Engine, EngineError, LatencySummary, Outcome, TokenLatency};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{Mode, RequestId};

/// Runs the common requests (two arriving every third step), aborting `abort` after
/// `after` steps; returns the digests and every token's latency.
fn run(mode: Mode, abort: Option<(u64, usize)>) -> (Digests, Vec<TokenLatency>) {
    let mut e = Engine::new(CpuBackend::new(), config(mode, "lru")).unwrap();
    let reqs = requests();
    let (mut digests, mut lat) = (Digests::new(), Vec::new());
    let (mut step, mut next) = (0, 0);
    while next < reqs.len() || !e.is_idle() {
        if step % 3 == 0 {
            for r in reqs.iter().skip(next).take(2) {
                e.submit(*r).unwrap();
            }
            next = (next + 2).min(reqs.len());
        }
        if let Some((id, after)) = abort
            && step == after
        {
            e.abort(RequestId(id)).unwrap();
            e.check_pools().unwrap();
        }
        let rep = e.step().unwrap();
        assert_eq!(rep.latencies.len(), rep.metrics.tokens, "one latency per decoded token");
        for (id, tok, layer, d) in rep.digests {
            digests.insert((id.0, tok, layer), d);
        }
        lat.extend(rep.latencies);
        step += 1;
        assert!(step < 500);
    }
    e.check_pools().unwrap();
    assert_eq!((e.cache().device_bytes_in_use(), e.cache().host_bytes_in_use()), (0, 0));
    if let Some((id, _)) = abort {
        assert!(e.outcomes().contains(&(RequestId(id), Outcome::Aborted)), "{:?}", e.outcomes());
    }
    (digests, lat)
}

#[test]
fn an_abort_mid_run_returns_everything_and_changes_no_other_output() {
    let full = run(Mode::Resident, None).0;
    // Request 12 (500 prompt tokens, 30 output) decodes from step 3: abort it at step 9.
    for mode in [Mode::Resident, Mode::HiSparse] {
        let (cut, _) = run(mode, Some((12, 9)));
        let left: Digests = full.iter().filter(|(k, _)| k.0 != 12).map(|(k, v)| (*k, *v)).collect();
        let kept: Digests = cut.iter().filter(|(k, _)| k.0 != 12).map(|(k, v)| (*k, *v)).collect();
        assert_eq!(kept, left, "{mode}: the other requests' outputs changed");
        let of_12 = cut.keys().filter(|k| k.0 == 12).map(|k| k.1).max().unwrap();
        assert!(of_12 < 29, "{mode}: request 12 decoded {of_12} tokens after its abort");
        // Its tokens before the abort are the full run's.
        assert!(cut.iter().filter(|(k, _)| k.0 == 12).all(|(k, v)| full.get(k) == Some(v)));
    }
    // A request still waiting can be aborted too (request 13 arrives at step 3, aborted before
    // that step admits it): it never decodes.
    let (cut, _) = run(Mode::HiSparse, Some((13, 3)));
    assert!(cut.keys().all(|k| k.0 != 13));
}

#[test]
fn token_latencies_count_from_arrival_then_from_the_previous_token() {
    let (_, lat) = run(Mode::HiSparse, None);
    let n: usize = requests().iter().map(|r| r.output_tokens).sum();
    assert_eq!(lat.len(), n, "a latency for every token");
    for r in requests() {
        let mut toks: Vec<u32> = lat.iter().filter(|t| t.request == r.id).map(|t| t.token).collect();
        toks.sort_unstable();
        assert_eq!(toks, (0..r.output_tokens as u32).collect::<Vec<_>>(), "request {}", r.id);
    }
    let s = LatencySummary::of(&lat);
    assert_eq!(s.first_decode.count, requests().len());
    assert!(s.per_token.p50 > 0.0 && s.per_token.p50 <= s.per_token.p99 && s.per_token.p99 <= s.per_token.max);
    // A request that arrived 200 ms before it was submitted waits at least that long.
    let mut e = Engine::new(CpuBackend::new(), config(Mode::HiSparse, "lru")).unwrap();
    let r = requests()[0];
    e.submit_arrived(r, Instant::now() - Duration::from_millis(200)).unwrap();
    let first = e.step().unwrap().latencies;
    assert_eq!(first.len(), 1);
    assert!(first[0].token == 0 && first[0].seconds >= 0.2, "{first:?}");
    let second = e.step().unwrap().latencies;
    assert!(second[0].token == 1 && second[0].seconds < 0.2, "{second:?}");
    assert!(matches!(e.abort(RequestId(999)).unwrap_err(), EngineError::Request { id: 999, .. }));
}
