//! Structure-aware fuzz target: arbitrary records written with correct checksums
//! (`hisparse_policy::trace::raw`), so the fuzzer reaches the record decoder and the simulator
//! instead of stopping at a checksum. The reader must return exactly the positions the records
//! encode or an error, never panic; what it reads, the simulator must replay without panicking.
//! The reader that keeps positions encoded must decide as the whole reader does, and the
//! simulator must replay its trace as the decoded one.
#![no_main]

use arbitrary::Arbitrary;
use hisparse_policy::prefetch::BuiltinPrefetcher;
use hisparse_policy::trace::{
    TraceData, TraceHeader, TraceReader, TraceRecord, raw, read_trace_file_encoded, read_trace_from_with,
};
use hisparse_policy::{BuiltinPolicy, SimConfig, memory_estimate, simulate, simulate_encoded, simulate_with};
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
    let read = TraceReader::new(bytes.as_slice()).and_then(|r| r.collect::<Result<Vec<TraceRecord>, _>>());
    encoded_reads_alike(&bytes);
    let Ok(read) = read else {
        return;
    };
    for (a, b) in read.iter().zip(&records) {
        assert_eq!(
            Some(a.selected.clone()),
            raw::positions(&b.deltas),
            "decoded positions differ from the encoded ones"
        );
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
            policies: vec![BuiltinPolicy::Lru.into(), BuiltinPolicy::Belady.into()],
            prefetchers: [BuiltinPrefetcher::None, BuiltinPrefetcher::SharedIndex, BuiltinPrefetcher::AdjacentLayer]
                .map(Into::into)
                .to_vec(),
            buffer_sizes: vec![k, 2 * k],
            ..SimConfig::default()
        };
        if margin > 0 {
            cfg.policies.push(BuiltinPolicy::Score.into());
            cfg.prefetchers.push(BuiltinPrefetcher::NextStep.into());
        }
        if let Ok(rep) = simulate(&h, &read, &cfg, &|_| {}) {
            for x in &rep.results {
                assert!(x.swap.misses <= x.selected);
            }
        }
    }
});

/// The reader that keeps positions encoded takes a trace, once its positions are decoded, exactly
/// when the reader without scores does (what the scores say is checked by neither), and the
/// simulator replays what it read from the encoded positions as from the decoded ones.
fn encoded_reads_alike(bytes: &[u8]) {
    let size = bytes.len() as u64;
    let whole_ok = read_trace_from_with(bytes, Some(size), u64::MAX, false).is_ok();
    let encoded = match read_trace_file_encoded(std::io::Cursor::new(bytes), size, 32 << 20) {
        Ok(TraceData::Encoded(t)) => t,
        Ok(TraceData::Records(..)) => panic!("a binary trace read as records"),
        Err(_) => {
            assert!(!whole_ok, "a trace the whole reader reads was refused before its positions");
            return;
        }
    };
    let decoded = encoded.decode();
    assert_eq!(decoded.is_ok(), whole_ok, "the encoded reader decided otherwise: {decoded:?}");
    let Ok((h, records)) = decoded else {
        return;
    };
    if records.is_empty() || memory_estimate(&records).is_none_or(|b| b >= 32 << 20) {
        return;
    }
    let k = h.top_k as usize;
    let cfg = SimConfig {
        policies: vec![BuiltinPolicy::Lru.into(), BuiltinPolicy::Fifo.into()],
        buffer_sizes: vec![k, 2 * k + 1],
        ..SimConfig::default()
    };
    let json = |r: hisparse_policy::Result<hisparse_policy::SimReport>| r.map(|r| serde_json::to_string(&r).ok());
    let want = json(simulate_with(&h, &records, &cfg, &|_| {}, &|| false));
    assert_eq!(json(simulate_encoded(&encoded, &cfg, &|_| {}, &|| false)), want);
}
