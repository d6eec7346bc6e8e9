//! The real model as the engine's client (`LlamaDecoder`) on the tiny model: requests beyond a
//! device budget wait and then run, hisparse generates sparse resident's tokens (and a
//! request's tokens do not depend on its batch), everything held is returned, a request that can
//! never fit is rejected whole, bad requests are refused by name, and the engine's scored trace
//! carries the oracle's scores and the requests' ids.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{Sink, text_tokens, tiny};
use hisparse_engine::{CacheConfig, CpuBackend, Engine, EngineConfig, KvCache, KvRowFormat, Outcome, RequestId};
use hisparse_model::{AttentionKind, Llama, LlamaDecoder, PrefillOut, StepToken, cache_config, cache_config_within};
use hisparse_policy::trace::TraceReader;

const TOP_K: usize = 16;

fn config(m: &Llama, kind: AttentionKind, budget: Option<u64>) -> CacheConfig {
    match budget {
        Some(b) => cache_config_within(m.config(), kind, TOP_K, 2 * TOP_K, 200, KvRowFormat::Bf16, 8, b).unwrap(),
        None => cache_config(m.config(), kind, TOP_K, 2 * TOP_K, 200, KvRowFormat::Bf16, 8).unwrap(),
    }
}

fn engine<'a>(m: &'a Llama, ps: &'a [PrefillOut], cache: CacheConfig) -> Engine<CpuBackend, LlamaDecoder<'a>> {
    Engine::with_model(CpuBackend::new(), EngineConfig::with_cache(cache), LlamaDecoder::new(m, ps)).unwrap()
}

fn prompts(m: &Llama, ids: &[u32]) -> Vec<PrefillOut> {
    let (kv, key) = KvCache::with_named_policies(CpuBackend::new(), config(m, AttentionKind::SparseResident, None))
        .unwrap()
        .layouts();
    vec![m.prefill(&ids[..120], kv, key).unwrap(), m.prefill(&ids[40..150], kv, key).unwrap()]
}

/// Every request's tokens and every step's logits (by id).
type Served = (Vec<Vec<u32>>, Vec<Vec<Vec<f32>>>);

/// Serves `n` requests (output 6 + i % 3) to the end; returns what each one generated and the
/// most requests that ran at once.
fn serve(m: &Llama, ps: &[PrefillOut], cache: CacheConfig, n: u64) -> (Served, usize) {
    let mut e = engine(m, ps, cache);
    e.model_mut().keep_logits(true);
    let mut logits = vec![Vec::new(); n as usize];
    for i in 0..n {
        let spec = e.model_mut().request(RequestId(i), i as usize % 2, 6 + i as usize % 3).unwrap();
        e.submit(spec).unwrap();
    }
    let mut most = 0;
    while !e.is_idle() {
        let st = e.step().unwrap();
        most = most.max(st.metrics.running);
        for (id, l) in e.model_mut().take_logits() {
            logits[id.0 as usize].push(l);
        }
        assert_eq!(st.metrics.tokens, st.metrics.running);
        assert_eq!(st.latencies.len(), st.metrics.tokens);
    }
    assert_eq!((e.cache().device_bytes_in_use(), e.cache().host_bytes_in_use()), (0, 0));
    e.check_pools().unwrap();
    assert!(e.outcomes().iter().all(|(_, o)| matches!(o, Outcome::Finished { .. })), "{:?}", e.outcomes());
    let mut out = vec![Vec::new(); n as usize];
    for (id, tokens) in e.model().finished() {
        out[id.0 as usize] = tokens.clone();
    }
    ((out, logits), most)
}

#[test]
fn requests_beyond_the_budget_wait_and_hisparse_generates_residents_tokens() {
    let (dir, m) = tiny("engine-client", 11);
    let ps = prompts(&m, &text_tokens(&m, 200));
    // A device budget of about two whole requests: resident runs two at a time, hisparse
    // (hot buffers of 2 x top-k, the keys) more.
    let g = config(&m, AttentionKind::SparseResident, None).geometry;
    let per_token = g.kv_bytes_per_token().unwrap() + g.index_bytes_per_token().unwrap();
    let two = (per_token * 200 * 5 / 2) as u64;
    let (resident, r_most) = serve(&m, &ps, config(&m, AttentionKind::SparseResident, Some(two)), 7);
    let (hisparse, h_most) = serve(&m, &ps, config(&m, AttentionKind::HiSparse, Some(two)), 7);
    assert!((1..7).contains(&r_most), "resident ran {r_most} at once");
    assert!(h_most > r_most, "hisparse ran {h_most} at once, resident {r_most}");
    // Bit for bit, every step of every request.
    assert_eq!(hisparse, resident);
    let (tokens, logits) = resident;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!((t.len(), logits[i].len()), (7 + i % 3, 6 + i % 3), "request {i}");
    }
    // A request's logits do not depend on its batch: request 4 decoded alone, step by step,
    // through the cache's own API.
    let mut c =
        KvCache::with_named_policies(CpuBackend::new(), config(&m, AttentionKind::SparseResident, None)).unwrap();
    let id = RequestId(99);
    m.admit(&mut c, id, &ps[0], 200).unwrap();
    let mut token = hisparse_model::argmax(&ps[0].logits);
    for (s, batched) in logits[4].iter().enumerate() {
        let d = m.decode_step(&mut c, &[StepToken { id, token }]).unwrap();
        assert!(d.logits == *batched, "step {s}");
        token = hisparse_model::argmax(&d.logits);
        assert_eq!(token, tokens[4][s + 1], "step {s}");
    }
    // The requests of the two prompts differ: the comparisons above could fail.
    assert!(logits[0][0] != logits[1][0]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_request_that_never_fits_is_rejected_whole_and_bad_requests_are_refused() {
    let (dir, m) = tiny("engine-client-bad", 12);
    let ps = prompts(&m, &text_tokens(&m, 200));
    let mut e = engine(&m, &ps, config(&m, AttentionKind::SparseResident, Some(4096)));
    let spec = e.model_mut().request(RequestId(0), 0, 4).unwrap();
    e.submit(spec).unwrap();
    let st = e.step().unwrap();
    assert_eq!((st.metrics.running, st.metrics.rejected), (0, 1));
    assert!(e.is_idle());
    assert!(matches!(&e.outcomes()[0].1, Outcome::Rejected { .. }), "{:?}", e.outcomes());
    assert_eq!(e.cache().device_bytes_in_use(), 0);
    let bad = [((1, 2, 4), "prompt"), ((0, 0, 4), "id"), ((1, 0, 0), "output"), ((1, 0, 1 << 20), "output")];
    for ((id, prompt, output), field) in bad {
        let err = e.model_mut().request(RequestId(id), prompt, output).unwrap_err().to_string();
        assert!(err.starts_with(field), "{id} {prompt} {output}: {err}");
    }
    // A request the decoder did not make is refused at admission, naming it; nothing is held.
    let mut e = engine(&m, &ps, config(&m, AttentionKind::SparseResident, None));
    e.submit(hisparse_engine::RequestSpec { id: RequestId(7), prompt_tokens: 120, output_tokens: 2 }).unwrap();
    let err = e.step().unwrap_err().to_string();
    assert!(err.contains("request 7") && err.contains("LlamaDecoder::request"), "{err}");
    assert_eq!(e.cache().device_bytes_in_use(), 0);
    drop(e);
    // The caller's stop, seen by the model before a step, is the engine's stop.
    let mut stopped = m;
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    stopped.set_stop(hisparse_engine::StopFlag::new(flag.clone()));
    let mut e = engine(&stopped, &ps, config(&stopped, AttentionKind::HiSparse, None));
    let spec = e.model_mut().request(RequestId(0), 0, 4).unwrap();
    e.submit(spec).unwrap();
    e.step().unwrap();
    flag.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(e.step().unwrap_err(), hisparse_engine::EngineError::Stopped);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_engines_trace_of_the_real_model_names_the_requests_and_carries_the_oracles_scores() {
    let (dir, m) = tiny("engine-client-trace", 13);
    let ps = prompts(&m, &text_tokens(&m, 200));
    let mut e = engine(&m, &ps, config(&m, AttentionKind::HiSparse, None));
    let sink = Sink::default();
    assert!(e.record_trace(Box::new(sink.clone()), (1 << 20) + 1).unwrap_err().to_string().contains("score_margin"));
    e.record_trace(Box::new(sink.clone()), 8).unwrap();
    for (id, output) in [(5u64, 3usize), (9, 5)] {
        let spec = e.model_mut().request(RequestId(id), id as usize % 2, output).unwrap();
        e.submit(spec).unwrap();
    }
    while !e.is_idle() {
        e.step().unwrap();
    }
    e.finish_trace().unwrap();
    let bytes = sink.0.lock().unwrap().clone();
    let reader = TraceReader::new(bytes.as_slice()).unwrap();
    let header = reader.header().clone();
    let records: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
    let layers = m.config().layers;
    assert_eq!(records.len(), (3 + 5) * layers);
    assert!(header.has_scores && header.score_margin == 8);
    for r in &records {
        assert!(r.request == 5 || r.request == 9, "{}", r.request);
        let (scores, near) = (r.scores.as_ref().unwrap(), r.near.as_ref().unwrap());
        assert_eq!((scores.len(), near.len()), (TOP_K, 8));
        // The candidates just below the cut score at most what was selected (the newest
        // position, always kept, aside).
        let newest = r.seq_len - 1;
        let lowest = r.selected.iter().zip(scores).filter(|(t, _)| **t != newest).map(|(_, &s)| s);
        let lowest = lowest.fold(f32::INFINITY, f32::min);
        assert!(near.iter().all(|&(t, s)| s <= lowest && !r.selected.contains(&t)), "{near:?} vs {lowest}");
        assert!(near.windows(2).all(|w| w[0].1 >= w[1].1));
    }
    std::fs::remove_dir_all(dir).unwrap();
}
