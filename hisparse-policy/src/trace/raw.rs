//! Raw binary traces for testing readers: any header and any records, written with correct
//! checksums and no checks at all, so that fuzzers and property tests reach the decoder and the
//! simulator with hostile but well-formed input (absurd lengths, unsorted or duplicate positions,
//! out-of-range tokens) rather than stopping at a checksum.

use super::binary::MAGIC;

/// A header as raw fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawHeader {
    /// Format version (readers read 1 to 3; version 3 records are written split in two parts).
    pub version: u16,
    /// Flags (bit 0: records carry scores; bit 1: near-cut candidates).
    pub flags: u16,
    /// Declared top-k.
    pub top_k: u32,
    /// Declared layers.
    pub layers: u32,
    /// Declared row bytes.
    pub row_bytes: u32,
    /// Bytes 24..28 (versions 2 and 3: the score margin).
    pub margin: u32,
    /// The layer table of versions 2 and 3 as written (`None`: no table, as version 1 has none).
    pub layer_table: Option<Vec<u32>>,
}

/// A selection record as raw fields.
#[derive(Clone, Debug, PartialEq)]
pub struct RawRecord {
    /// Step.
    pub step: u32,
    /// Request id.
    pub request: u64,
    /// Layer.
    pub layer: u32,
    /// Sequence length.
    pub seq_len: u32,
    /// The declared position count (need not match `deltas`).
    pub count: u32,
    /// Varint values as written: the first position, then each distance minus one.
    pub deltas: Vec<u32>,
    /// Scores written after the positions.
    pub scores: Vec<f32>,
    /// Near-cut candidates written after the scores (`None`: no count at all), with the
    /// declared count.
    pub near: Option<(u32, Vec<(u32, f32)>)>,
    /// Bytes appended before the (last) checksum.
    pub trailing: Vec<u8>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The bytes of a trace with `header`, `records` and an end marker declaring `end_count`
/// records; every checksum correct.
pub fn encode(header: &RawHeader, records: &[RawRecord], end_count: u64) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&header.version.to_le_bytes());
    b.extend_from_slice(&header.flags.to_le_bytes());
    for v in [header.top_k, header.layers, header.row_bytes, header.margin] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let c = crc32fast::hash(&b);
    b.extend_from_slice(&c.to_le_bytes());
    if let Some(table) = &header.layer_table {
        let mut t = (table.len() as u32).to_le_bytes().to_vec();
        for v in table {
            t.extend_from_slice(&v.to_le_bytes());
        }
        let c = crc32fast::hash(&t);
        b.extend_from_slice(&t);
        b.extend_from_slice(&c.to_le_bytes());
    }
    let split = header.version == 3;
    for r in records {
        let mut p = Vec::new();
        if split {
            p.extend_from_slice(&[0; 4]);
        }
        p.extend_from_slice(&r.step.to_le_bytes());
        p.extend_from_slice(&r.request.to_le_bytes());
        p.extend_from_slice(&r.layer.to_le_bytes());
        p.extend_from_slice(&r.seq_len.to_le_bytes());
        p.extend_from_slice(&r.count.to_le_bytes());
        for &d in &r.deltas {
            put_varint(&mut p, d);
        }
        let mut part = 0;
        if split {
            let sel_len = (p.len() - 4) as u32;
            p[..4].copy_from_slice(&sel_len.to_le_bytes());
            let c = crc32fast::hash(&p[4..]);
            p.extend_from_slice(&c.to_le_bytes());
            part = p.len();
        }
        for s in &r.scores {
            p.extend_from_slice(&s.to_le_bytes());
        }
        if let Some((count, near)) = &r.near {
            p.extend_from_slice(&count.to_le_bytes());
            for (pos, s) in near {
                p.extend_from_slice(&pos.to_le_bytes());
                p.extend_from_slice(&s.to_le_bytes());
            }
        }
        p.extend_from_slice(&r.trailing);
        let c = crc32fast::hash(&p[part..]);
        p.extend_from_slice(&c.to_le_bytes());
        b.push(0x01);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(&p);
    }
    let n = end_count.to_le_bytes();
    b.push(0xFF);
    b.extend_from_slice(&n);
    b.extend_from_slice(&crc32fast::hash(&n).to_le_bytes());
    b
}

/// The positions `deltas` decode to (first, then each previous + delta + 1), `None` past 2^32.
pub fn positions(deltas: &[u32]) -> Option<Vec<u32>> {
    let mut out = Vec::with_capacity(deltas.len());
    let mut prev: Option<u32> = None;
    for &d in deltas {
        let p = match prev {
            None => d,
            Some(q) => q.checked_add(d)?.checked_add(1)?,
        };
        out.push(p);
        prev = Some(p);
    }
    Some(out)
}
