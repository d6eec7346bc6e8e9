//! The binary trace writer: the header and layer table, then each record checked and encoded
//! (positions delta-coded as varints, per-part checksums from version 3), then the end marker.

use std::io::Write;

use super::{FLAG_NEAR, FLAG_SCORES, MAGIC, MAX_PAYLOAD, TAG_END, TAG_RECORD, crc, version_of};
use crate::error::{PolicyError, Result};
use crate::trace::{TraceHeader, TraceRecord};

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes a binary trace.
pub struct TraceWriter<W: Write> {
    out: W,
    header: TraceHeader,
    records: u64,
    offset: u64,
    buf: Vec<u8>,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace on `out` (the header is written at once).
    pub fn new(mut out: W, header: TraceHeader) -> Result<Self> {
        header.check(0)?;
        let h = header_bytes(&header);
        out.write_all(&h).map_err(write_err)?;
        let offset = h.len() as u64;
        Ok(Self { out, header, records: 0, offset, buf: Vec::new() })
    }

    /// Appends one record (checked first; nothing is written for a bad one).
    pub fn write(&mut self, rec: &TraceRecord) -> Result<()> {
        rec.check(&self.header, self.offset)?;
        let split = version_of(&self.header) == 3;
        let b = &mut self.buf;
        b.clear();
        if split {
            // `sel_len`, set once the selection part is written.
            b.extend_from_slice(&[0; 4]);
        }
        b.extend_from_slice(&rec.step.to_le_bytes());
        b.extend_from_slice(&rec.request.to_le_bytes());
        b.extend_from_slice(&rec.layer.to_le_bytes());
        b.extend_from_slice(&rec.seq_len.to_le_bytes());
        // count <= top_k, a u32 (checked above).
        b.extend_from_slice(&(rec.selected.len() as u32).to_le_bytes());
        let mut prev: Option<u32> = None;
        for &p in &rec.selected {
            put_varint(b, prev.map_or(p, |q| p - q - 1));
            prev = Some(p);
        }
        let mut part = 0;
        if split {
            // At most 24 + 5 * top_k bytes, below MAX_PAYLOAD (a u32).
            let sel_len = (b.len() - 4) as u32;
            b[..4].copy_from_slice(&sel_len.to_le_bytes());
            let c = crc(&b[4..]);
            b.extend_from_slice(&c.to_le_bytes());
            part = b.len();
        }
        for s in rec.scores.iter().flatten() {
            b.extend_from_slice(&s.to_le_bytes());
        }
        if let Some(near) = &rec.near {
            // near.len() <= score_margin <= MAX_TOP_K, a u32 (checked above).
            b.extend_from_slice(&(near.len() as u32).to_le_bytes());
            for &(p, s) in near {
                b.extend_from_slice(&p.to_le_bytes());
                b.extend_from_slice(&s.to_le_bytes());
            }
        }
        let c = crc(&b[part..]);
        b.extend_from_slice(&c.to_le_bytes());
        let len = u32::try_from(b.len()).ok().filter(|&l| l <= MAX_PAYLOAD).ok_or_else(|| PolicyError::Invalid {
            field: "selected",
            value: rec.selected.len().to_string(),
            reason: "record too large".into(),
        })?;
        self.out.write_all(&[TAG_RECORD]).map_err(write_err)?;
        self.out.write_all(&len.to_le_bytes()).map_err(write_err)?;
        self.out.write_all(b).map_err(write_err)?;
        self.records += 1;
        self.offset += 5 + u64::from(len);
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the end marker and returns the sink.
    pub fn finish(mut self) -> Result<W> {
        let n = self.records.to_le_bytes();
        self.out.write_all(&[TAG_END]).map_err(write_err)?;
        self.out.write_all(&n).map_err(write_err)?;
        self.out.write_all(&crc(&n).to_le_bytes()).map_err(write_err)?;
        self.out.flush().map_err(write_err)?;
        Ok(self.out)
    }
}

/// The header (and, from version 2, the layer table) as written.
fn header_bytes(header: &TraceHeader) -> Vec<u8> {
    let version = version_of(header);
    let v2 = version > 1;
    let mut h = Vec::with_capacity(40);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&version.to_le_bytes());
    let flags = u16::from(header.has_scores) * FLAG_SCORES + u16::from(header.score_margin > 0) * FLAG_NEAR;
    h.extend_from_slice(&flags.to_le_bytes());
    for v in [header.top_k, header.layers, header.row_bytes, header.score_margin] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    let c = crc(&h);
    h.extend_from_slice(&c.to_le_bytes());
    if v2 {
        let start = h.len();
        // index_source.len() is 0 or layers <= MAX_LAYERS (checked by the caller).
        h.extend_from_slice(&(header.index_source.len() as u32).to_le_bytes());
        for &s in &header.index_source {
            h.extend_from_slice(&s.to_le_bytes());
        }
        let c = crc(&h[start..]);
        h.extend_from_slice(&c.to_le_bytes());
    }
    h
}

fn write_err(e: std::io::Error) -> PolicyError {
    PolicyError::Io { path: "trace".into(), message: e.to_string() }
}
