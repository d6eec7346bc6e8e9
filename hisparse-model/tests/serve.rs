//! `ModelServer` on the tiny model: requests beyond a device budget wait and then run, hisparse
//! generates sparse resident's tokens (and a request's tokens do not depend on its batch),
//! everything held is returned, a request that can never fit is rejected whole, bad requests are
//! refused by name, and a recorded trace carries the oracle's scores and the batch's ids.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{text_tokens, tiny};
use hisparse_engine::{CpuBackend, KvCache, KvRowFormat, RequestId};
use hisparse_model::{
    AttentionKind, Llama, ModelServer, PrefillOut, SelectionRecorder, ServeOutcome, ServeRequest, StepToken,
    cache_config, cache_config_within,
};
use hisparse_policy::trace::{TraceReader, TraceWriter};

const TOP_K: usize = 16;

fn cache(m: &Llama, kind: AttentionKind, budget: Option<u64>) -> KvCache<CpuBackend> {
    let cfg = match budget {
        Some(b) => cache_config_within(m.config(), kind, TOP_K, 2 * TOP_K, 200, KvRowFormat::Bf16, 8, b).unwrap(),
        None => cache_config(m.config(), kind, TOP_K, 2 * TOP_K, 200, KvRowFormat::Bf16, 8).unwrap(),
    };
    KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
}

fn prompts(m: &Llama, ids: &[u32]) -> Vec<PrefillOut> {
    let (kv, key) = cache(m, AttentionKind::SparseResident, None).layouts();
    vec![m.prefill(&ids[..120], kv, key).unwrap(), m.prefill(&ids[40..150], kv, key).unwrap()]
}

/// Every request's tokens and every step's logits (by id).
type Served = (Vec<Vec<u32>>, Vec<Vec<Vec<f32>>>);

/// Serves `n` requests (output 6 + i % 3) to the end; returns what each one generated and the
/// most requests that ran at once.
fn serve(m: &Llama, ps: &[PrefillOut], c: KvCache<CpuBackend>, n: u64) -> (Served, usize) {
    let mut s = ModelServer::new(m, ps, c);
    s.keep_logits(true);
    let mut logits = vec![Vec::new(); n as usize];
    for i in 0..n {
        s.submit(ServeRequest { id: RequestId(i), prompt: i as usize % 2, output: 6 + i as usize % 3 }).unwrap();
    }
    let mut most = 0;
    while !s.is_idle() {
        let st = s.step().unwrap();
        most = most.max(st.metrics.running);
        for (id, l) in st.logits {
            logits[id.0 as usize].push(l);
        }
        assert_eq!(st.metrics.tokens, st.metrics.running);
    }
    assert_eq!((s.cache().device_bytes_in_use(), s.cache().host_bytes_in_use()), (0, 0));
    s.cache().check().unwrap();
    let mut out = vec![Vec::new(); n as usize];
    for (id, o) in s.outcomes() {
        match o {
            ServeOutcome::Finished { tokens } => out[id.0 as usize] = tokens.clone(),
            ServeOutcome::Rejected { reason } => panic!("request {} rejected: {reason}", id.0),
        }
    }
    ((out, logits), most)
}

#[test]
fn requests_beyond_the_budget_wait_and_hisparse_generates_residents_tokens() {
    let (dir, m) = tiny("serve", 11);
    let ps = prompts(&m, &text_tokens(&m, 200));
    // A device budget of about two whole requests: resident runs two at a time, hisparse
    // (hot buffers of 2 x top-k, the keys) more.
    let g = cache(&m, AttentionKind::SparseResident, None).config().geometry.clone();
    let per_token = g.kv_bytes_per_token().unwrap() + g.index_bytes_per_token().unwrap();
    let two = (per_token * 200 * 5 / 2) as u64;
    let (resident, r_most) = serve(&m, &ps, cache(&m, AttentionKind::SparseResident, Some(two)), 7);
    let (hisparse, h_most) = serve(&m, &ps, cache(&m, AttentionKind::HiSparse, Some(two)), 7);
    assert!((1..7).contains(&r_most), "resident ran {r_most} at once");
    assert!(h_most > r_most, "hisparse ran {h_most} at once, resident {r_most}");
    // Bit for bit, every step of every request.
    assert_eq!(hisparse, resident);
    let (tokens, logits) = resident;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!((t.len(), logits[i].len()), (7 + i % 3, 6 + i % 3), "request {i}");
    }
    // A request's logits do not depend on its batch: request 4 decoded alone, step by step.
    let mut c = cache(&m, AttentionKind::SparseResident, None);
    let id = RequestId(99);
    m.admit(&mut c, id, &ps[0], 200).unwrap();
    let mut token = hisparse_model::argmax(&ps[0].logits);
    for (s, batched) in logits[4].iter().enumerate() {
        let d = m.decode_step(&mut c, &[StepToken { id, token }]).unwrap();
        assert!(d.logits == *batched, "step {s}");
        token = hisparse_model::argmax(&d.logits);
    }
    // The requests of the two prompts differ: the comparisons above could fail.
    assert!(logits[0][0] != logits[1][0]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_request_that_never_fits_is_rejected_whole_and_bad_requests_are_refused() {
    let (dir, m) = tiny("serve-bad", 12);
    let ps = prompts(&m, &text_tokens(&m, 200));
    let mut s = ModelServer::new(&m, &ps, cache(&m, AttentionKind::SparseResident, Some(4096)));
    s.submit(ServeRequest { id: RequestId(0), prompt: 0, output: 4 }).unwrap();
    let st = s.step().unwrap();
    assert_eq!((st.metrics.running, st.metrics.rejected), (0, 1));
    assert!(s.is_idle());
    assert!(matches!(&s.outcomes()[0].1, ServeOutcome::Rejected { .. }), "{:?}", s.outcomes());
    assert_eq!(s.cache().device_bytes_in_use(), 0);
    let bad = [
        (ServeRequest { id: RequestId(1), prompt: 2, output: 4 }, "prompt"),
        (ServeRequest { id: RequestId(0), prompt: 0, output: 4 }, "id"),
        (ServeRequest { id: RequestId(1), prompt: 0, output: 0 }, "output"),
        (ServeRequest { id: RequestId(1), prompt: 0, output: 1 << 20 }, "output"),
    ];
    for (r, field) in bad {
        let e = s.submit(r).unwrap_err().to_string();
        assert!(e.starts_with(field), "{r:?}: {e}");
    }
    assert!(s.is_idle(), "a refused request is not queued");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_served_trace_names_the_requests_and_carries_the_oracles_scores() {
    let (dir, m) = tiny("serve-trace", 13);
    let ps = prompts(&m, &text_tokens(&m, 200));
    let c = cache(&m, AttentionKind::HiSparse, None);
    let header =
        SelectionRecorder::with_scores(8).unwrap().trace_header(&c.config().geometry, c.layouts().0.row_bytes());
    let mut s = ModelServer::new(&m, &ps, c);
    s.record(SelectionRecorder::with_scores(8).unwrap());
    for (id, output) in [(5u64, 3usize), (9, 5)] {
        s.submit(ServeRequest { id: RequestId(id), prompt: id as usize % 2, output }).unwrap();
    }
    while !s.is_idle() {
        s.step().unwrap();
    }
    let rec = s.take_recorder().unwrap();
    let layers = m.config().layers;
    assert_eq!(rec.records.len(), (3 + 5) * layers);
    assert!(header.has_scores && header.score_margin == 8);
    for r in &rec.records {
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
    // It writes and reads back as a trace.
    let mut bytes = Vec::new();
    let mut w = TraceWriter::new(&mut bytes, header).unwrap();
    for r in &rec.records {
        w.write(r).unwrap();
    }
    w.finish().unwrap();
    let back: Vec<_> = TraceReader::new(bytes.as_slice()).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(back, rec.records);
    std::fs::remove_dir_all(dir).unwrap();
}
