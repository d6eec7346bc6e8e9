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
}

#[derive(Arbitrary, Debug)]
struct Input {
    top_k: u16,
    layers: u8,
    scores: bool,
    records: Vec<Rec>,
    end_off: u8,
}

fuzz_target!(|inp: Input| {
    let header = raw::RawHeader {
        version: 1,
        flags: u16::from(inp.scores),
        top_k: u32::from(inp.top_k),
        layers: u32::from(inp.layers),
        row_bytes: 656,
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
    let h = TraceHeader { top_k: header.top_k, layers: header.layers, row_bytes: 656, has_scores: inp.scores };
    if !read.is_empty() && memory_estimate(&read).is_some_and(|b| b < 32 << 20) {
        let k = header.top_k as usize;
        let cfg = SimConfig { policies: vec!["lru".into(), "belady".into()], buffer_sizes: vec![k, 2 * k], seed: 0, row_bytes: 0 };
        if let Ok(rep) = simulate(&h, &read, &cfg, &|_| {}) {
            for x in &rep.results {
                assert!(x.misses <= x.selected);
            }
        }
    }
});
