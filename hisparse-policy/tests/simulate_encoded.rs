//! The simulator over a trace whose positions stay encoded ([`simulate_encoded`]) reports what
//! the simulator over the decoded trace reports: in one pass per stream for stamp policies
//! without prefetch, and by decoding the trace for the rest; a fault met while decoding stops it.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};

use hisparse_policy::policy::BuiltinPolicy;
use hisparse_policy::prefetch::BuiltinPrefetcher;
use hisparse_policy::synth::{SynthConfig, synth_header, synth_trace};
use hisparse_policy::trace::{EncodedTrace, TraceData, TraceRecord, TraceWriter, read_trace_file_encoded};
use hisparse_policy::{PolicyError, SimConfig, memory_estimate_encoded, replays, simulate_encoded, simulate_with};

/// A synthetic trace written in binary (version 3 with scores and near-cut candidates, else 1).
fn trace_bytes(seed: u64, scored: bool) -> Vec<u8> {
    let cfg = SynthConfig {
        requests: 3,
        layers: 2,
        steps: 40,
        prompt_tokens: 600 + 37 * seed as usize,
        top_k: 64,
        rho: [0.5, 0.9, 0.99][seed as usize % 3],
        scores: scored,
        score_margin: if scored { 16 } else { 0 },
        seed,
        ..SynthConfig::default()
    };
    let mut w = TraceWriter::new(Vec::new(), synth_header(&cfg, 656)).unwrap();
    synth_trace(&cfg, |r| w.write(&r)).unwrap();
    w.finish().unwrap()
}

fn encoded(bytes: &[u8]) -> EncodedTrace {
    match read_trace_file_encoded(Cursor::new(bytes), bytes.len() as u64, u64::MAX).unwrap() {
        TraceData::Encoded(t) => t,
        TraceData::Records(..) => panic!("a binary trace read as records"),
    }
}

fn json(r: &hisparse_policy::SimReport) -> serde_json::Value {
    serde_json::to_value(r).unwrap()
}

#[test]
fn the_encoded_replay_reports_what_the_decoded_one_reports() {
    let configs = [
        // One pass per stream: stamp policies, no prefetch, with and without a warm-up.
        (vec![BuiltinPolicy::Lru], vec![], 0),
        (vec![BuiltinPolicy::Lru, BuiltinPolicy::Fifo], vec![], 5),
        (vec![BuiltinPolicy::Fifo], vec![BuiltinPrefetcher::None], 0),
        (vec![BuiltinPolicy::Fifo, BuiltinPolicy::Lru], vec![BuiltinPrefetcher::None, BuiltinPrefetcher::None], 1),
        // Decoded first: a policy without a stamp rule, or a prefetcher.
        (vec![BuiltinPolicy::Lru, BuiltinPolicy::Belady, BuiltinPolicy::Random], vec![], 3),
        (vec![BuiltinPolicy::Lru], vec![BuiltinPrefetcher::AdjacentLayer], 0),
    ];
    let mut misses = 0;
    for seed in 1..5u64 {
        for scored in [false, true] {
            let bytes = trace_bytes(seed, scored);
            let t = encoded(&bytes);
            let (h, records) =
                hisparse_policy::trace::read_trace_file_with(Cursor::new(&bytes), bytes.len() as u64, u64::MAX, false)
                    .unwrap();
            assert_eq!(t.header(), &h);
            for (policies, prefetchers, warmup) in &configs {
                let cfg = SimConfig {
                    policies: policies.iter().map(|&p| p.into()).collect(),
                    prefetchers: prefetchers.iter().map(|&p| p.into()).collect(),
                    buffer_sizes: vec![64, 100, 256],
                    warmup_steps: *warmup,
                    ..SimConfig::default()
                };
                let want = simulate_with(&h, &records, &cfg, &|_| {}, &|| false).unwrap();
                let last = AtomicU64::new(0);
                // Threads report as they finish, in any order: the largest report is the total.
                let got = simulate_encoded(
                    &t,
                    &cfg,
                    &|n| {
                        last.fetch_max(n, Ordering::Relaxed);
                    },
                    &|| false,
                )
                .unwrap();
                assert_eq!(json(&got), json(&want), "seed {seed} scored {scored} {policies:?} {prefetchers:?}");
                assert_eq!(last.load(Ordering::Relaxed), replays(t.records(), &cfg), "progress ends at the replays");
                assert!(memory_estimate_encoded(&t, &cfg).is_some_and(|b| b > 0));
                misses += got.results.iter().map(|r| r.swap.misses).sum::<u64>();
            }
        }
    }
    assert!(misses > 10_000, "the traces miss: {misses}");
}

/// A record whose checksum is right but whose last position is past its sequence: the encoded
/// read takes the trace, the replay that decodes it stops with the reader's error.
#[test]
fn a_fault_in_positions_stops_the_replay_with_the_readers_error() {
    let header = hisparse_policy::trace::TraceHeader { top_k: 8, layers: 1, row_bytes: 656, ..Default::default() };
    let records: Vec<hisparse_policy::trace::raw::RawRecord> = (1..=6u32)
        .map(|step| hisparse_policy::trace::raw::RawRecord {
            step,
            request: 1,
            layer: 0,
            seq_len: 30 + step,
            count: 3,
            // Record 4's last position (49) is past its sequence (34 tokens).
            deltas: vec![2, 5, if step == 4 { 40 } else { 20 }],
            scores: vec![],
            near: None,
            trailing: vec![],
        })
        .collect();
    let raw_header = hisparse_policy::trace::raw::RawHeader {
        version: 1,
        flags: 0,
        top_k: header.top_k,
        layers: 1,
        row_bytes: 656,
        margin: 0,
        layer_table: None,
    };
    let bytes = hisparse_policy::trace::raw::encode(&raw_header, &records, 6);
    let want = hisparse_policy::trace::read_trace_from(bytes.as_slice(), None, u64::MAX).unwrap_err();
    let t = encoded(&bytes);
    assert_eq!(t.records().len(), 6);
    for policies in [vec![BuiltinPolicy::Lru], vec![BuiltinPolicy::Belady]] {
        let cfg = SimConfig {
            policies: policies.iter().map(|&p| p.into()).collect(),
            buffer_sizes: vec![8],
            ..SimConfig::default()
        };
        let got = simulate_encoded(&t, &cfg, &|_| {}, &|| false).unwrap_err();
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{policies:?}");
        assert!(matches!(got, PolicyError::Trace { what: "corrupt record", .. }));
    }
    let cfg = SimConfig { policies: vec![BuiltinPolicy::Lru.into()], buffer_sizes: vec![8], ..SimConfig::default() };
    assert!(matches!(simulate_encoded(&t, &cfg, &|_| {}, &|| true), Err(PolicyError::Cancelled)));
    // A buffer below top_k is refused as the decoded simulator refuses it.
    let small = SimConfig { buffer_sizes: vec![4], ..cfg };
    let decoded: Vec<TraceRecord> = vec![];
    let want = simulate_with(&header, &decoded, &small, &|_| {}, &|| false).unwrap_err();
    assert_eq!(simulate_encoded(&t, &small, &|_| {}, &|| false).unwrap_err(), want);
}
