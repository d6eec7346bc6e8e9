//! Structure-aware fuzz target: arbitrary records written with correct checksums
//! (`hisparse_policy::trace::raw`), so the fuzzer reaches the record decoder and the simulator
//! instead of stopping at a checksum. The reader must return exactly the positions the records
//! encode or an error, never panic; what it reads, the simulator must replay without panicking.
#![no_main]

use arbitrary::Arbitrary;
use hisparse_policy::trace::{TraceHeader, TraceReader, TraceRecord, raw};
use hisparse_policy::{SimConfig, memory_estimate, simulate};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Rec {
    step: u32,
    request: u8,
    layer: u8,
    seq_len: u32,
    count: Option<u16>,
    deltas: Vec<u16>,
    huge: Option<u32>,
    /// Near-cut candidates (version 2): positions and scores as raw bits.
    near: Vec<(u16, u32)>,
    near_count: Option<u8>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    top_k: u16,
    layers: u8,
    scores: bool,
    /// Version 2 with this score margin and layer table (entries taken modulo the layer count).
    v2: Option<(u8, Vec<u8>)>,
    records: Vec<Rec>,
    end_off: u8,
}

fuzz_target!(|inp: Input| {
    let layers = u32::from(inp.layers);
    let (version, margin, layer_table) = match &inp.v2 {
        None => (1, 0, None),
        Some((m, t)) => {
            let table = if t.is_empty() {
                Vec::new()
            } else {
                (0..layers).map(|l| u32::from(t[l as usize % t.len()]) % layers.max(1)).collect()
            };
            (2, u32::from(*m), Some(table))
        }
    };
    let header = raw::RawHeader {
        version,
        flags: u16::from(inp.scores) | if margin > 0 { 2 } else { 0 },
        top_k: u32::from(inp.top_k),
        layers,
        row_bytes: 656,
        margin,
        layer_table: layer_table.clone(),
    };
    let records: Vec<raw::RawRecord> = inp
        .records
        .iter()
        .take(16)
        .map(|r| {
            let mut deltas: Vec<u32> = r.deltas.iter().take(64).map(|&d| u32::from(d)).collect();
            if let Some(h) = r.huge {
                deltas.push(h);
            }
            raw::RawRecord {
                step: r.step,
                request: u64::from(r.request),
                layer: u32::from(r.layer),
                seq_len: r.seq_len,
                count: r.count.map_or(deltas.len() as u32, u32::from),
                scores: if inp.scores { vec![1.0; deltas.len()] } else { Vec::new() },
                near: (margin > 0).then(|| {
                    let near: Vec<(u32, f32)> =
                        r.near.iter().take(8).map(|&(p, s)| (u32::from(p), f32::from_bits(s))).collect();
                    (r.near_count.map_or(near.len() as u32, u32::from), near)
                }),
                deltas,
                trailing: Vec::new(),
            }
        })
        .collect();
    let end = records.len() as u64 + u64::from(inp.end_off % 2);
    let bytes = raw::encode(&header, &records, end);
    let Ok(read) = TraceReader::new(bytes.as_slice()).and_then(|r| r.collect::<Result<Vec<TraceRecord>, _>>()) else {
        return;
    };
    for (a, b) in read.iter().zip(&records) {
        assert_eq!(Some(a.selected.clone()), raw::positions(&b.deltas), "decoded positions differ from the encoded ones");
    }
    let h = TraceHeader {
        top_k: header.top_k,
        layers: header.layers,
        row_bytes: 656,
        has_scores: inp.scores,
        score_margin: margin,
        index_source: layer_table.unwrap_or_default(),
    };
    if !read.is_empty() && memory_estimate(&read).is_some_and(|b| b < 32 << 20) {
        let k = header.top_k as usize;
        let mut cfg = SimConfig {
            policies: vec!["lru".into(), "belady".into()],
            prefetchers: vec!["none".into(), "shared-index".into(), "adjacent-layer".into()],
            buffer_sizes: vec![k, 2 * k],
            ..SimConfig::default()
        };
        if margin > 0 {
            cfg.policies.push("score".into());
            cfg.prefetchers.push("next-step".into());
        }
        if let Ok(rep) = simulate(&h, &read, &cfg, &|_| {}) {
            for x in &rep.results {
                assert!(x.misses <= x.selected);
            }
        }
    }
});
