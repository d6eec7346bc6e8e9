//! The binary trace format, versions 1 to 3: compact (positions delta-coded as LEB128 varints)
//! and checksummed (CRC-32 per record), read as a stream. The writer writes version 3 when the
//! records carry scores or near-cut candidates, version 2 when the header needs only a layer
//! structure, and version 1 otherwise, so a version-1 trace without scores reads and writes back
//! byte for byte.
//!
//! All integers are little-endian.
//!
//! **File header, 32 bytes**
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `HSPTRACE` |
//! | 8..10 | version, u16 = 1, 2 or 3 |
//! | 10..12 | flags, u16: bit 0 = records carry scores; bit 1 (versions 2 and 3) = records carry near-cut candidates; other bits 0 |
//! | 12..16 | top_k, u32 |
//! | 16..20 | layers, u32 |
//! | 20..24 | row_bytes, u32 (0: unknown) |
//! | 24..28 | version 1: 0; versions 2 and 3: score_margin, u32 (non-zero exactly when flag bit 1 is set) |
//! | 28..32 | CRC-32 of bytes 0..28 |
//!
//! **Layer table** (versions 2 and 3): `n` u32 (0: every layer full, else `layers`), then `n`
//! u32 — each layer's selection source — then the CRC-32 of those `4 + 4n` bytes.
//!
//! **Records**, each starting with a tag byte:
//!
//! * `0x01`, a selection: `len` u32 (bytes that follow, checksums included), then the
//!   selection part: `step` u32, `request` u64, `layer` u32, `seq_len` u32, `count` u32, and
//!   `count` varints (the first position, then for each next position its distance to the
//!   previous minus one); then the score part: if flag bit 0 is set, `count` f32 scores; if flag
//!   bit 1 is set, `near` u32 and `near` pairs of (position u32, score f32).
//!   Versions 1 and 2: the two parts, then the CRC-32 of both.
//!   Version 3: `sel_len` u32 (the selection part's bytes), the selection part, its CRC-32, then
//!   the score part and its own CRC-32 — so a reader that needs no scores reads and checks the
//!   selection part and skips the rest (most of the bytes), checking only its length.
//! * `0xFF`, the end: `records` u64 (how many selections came before), then the CRC-32 of
//!   those 8 bytes. Nothing may follow.
//!
//! A reader reports truncation, a bad checksum, a bad tag, an unknown version or flag, and any
//! record that breaks the rules of [`TraceRecord::check`](super::TraceRecord::check) as a
//! [`PolicyError::Trace`] naming the byte offset; it never panics.

use std::io::{Read, Write};

use super::{TraceHeader, TraceRecord};
use crate::error::{PolicyError, Result};

/// The file magic.
pub const MAGIC: &[u8; 8] = b"HSPTRACE";
/// The newest version this code writes and reads (it reads versions 1 and 2 too).
pub const VERSION: u16 = 3;
const FLAG_SCORES: u16 = 1;
const FLAG_NEAR: u16 = 2;
pub(super) const TAG_RECORD: u8 = 0x01;
const TAG_END: u8 = 0xFF;
/// Largest record payload a reader accepts (guards allocations against corrupt lengths).
pub(super) const MAX_PAYLOAD: u32 = 64 << 20;

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

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

/// The version a trace of `header` is written in: 3 when its records carry scores or near-cut
/// candidates, 2 when it has a layer structure, else 1.
pub fn version_of(header: &TraceHeader) -> u16 {
    if header.has_scores || header.score_margin > 0 {
        3
    } else if header.is_v2() {
        2
    } else {
        1
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

/// Reads a binary trace record by record (an iterator of `Result<TraceRecord>`).
pub struct TraceReader<R: Read> {
    input: R,
    header: TraceHeader,
    /// The file's version.
    version: u16,
    offset: u64,
    records: u64,
    done: bool,
    buf: Vec<u8>,
}

pub(super) fn err(what: &'static str, offset: u64, message: impl Into<String>) -> PolicyError {
    PolicyError::Trace { what, offset, message: message.into() }
}

/// Reads exactly `buf.len()` bytes at `offset`, or reports truncation.
pub(super) fn read_exact(input: &mut impl Read, buf: &mut [u8], offset: u64, what: &str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(err(
                    "truncated",
                    offset + got as u64,
                    format!("{what}: {} more bytes expected", buf.len() - got),
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err("unreadable", offset + got as u64, e.to_string())),
        }
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R) -> Result<Self> {
        let mut h = [0u8; 32];
        read_exact(&mut input, &mut h, 0, "file header")?;
        if &h[..8] != MAGIC {
            return Err(err(
                "not a trace",
                0,
                format!("magic {:?}, expected \"HSPTRACE\"", String::from_utf8_lossy(&h[..8])),
            ));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if !(1..=VERSION).contains(&version) {
            return Err(err(
                "unsupported version",
                8,
                format!("version {version}; this reader reads versions 1 to {VERSION}"),
            ));
        }
        let stored = u32_at(&h, 28);
        if crc(&h[..28]) != stored {
            return Err(err("corrupt header", 28, "header checksum mismatch"));
        }
        let flags = u16::from_le_bytes([h[10], h[11]]);
        let known = if version == 1 { FLAG_SCORES } else { FLAG_SCORES | FLAG_NEAR };
        if flags & !known != 0 {
            return Err(err(
                "unsupported flags",
                10,
                format!("flags {flags:#06x}; version {version} defines only {known:#06x}"),
            ));
        }
        let margin = u32_at(&h, 24);
        if (margin > 0) != (flags & FLAG_NEAR != 0) {
            let what = if version == 1 { "reserved field" } else { "score_margin" };
            return Err(err("corrupt header", 24, format!("{what} = {margin} with flags {flags:#06x}")));
        }
        let mut header = TraceHeader {
            top_k: u32_at(&h, 12),
            layers: u32_at(&h, 16),
            row_bytes: u32_at(&h, 20),
            has_scores: flags & FLAG_SCORES != 0,
            score_margin: margin,
            index_source: Vec::new(),
        };
        header.check(12)?;
        let mut offset = 32;
        if version >= 2 {
            let mut n = [0u8; 4];
            read_exact(&mut input, &mut n, 32, "layer table")?;
            let n = u32::from_le_bytes(n);
            if n != 0 && n != header.layers {
                return Err(err("corrupt header", 32, format!("{n} layer sources for {} layers", header.layers)));
            }
            // n <= layers <= MAX_LAYERS: a small table.
            let mut table = vec![0u8; 4 * n as usize + 4];
            read_exact(&mut input, &mut table, 36, "layer table")?;
            let body = [&n.to_le_bytes()[..], &table[..4 * n as usize]].concat();
            if crc(&body) != u32_at(&table, 4 * n as usize) {
                return Err(err("corrupt header", 36, "layer table checksum mismatch"));
            }
            header.index_source = (0..n as usize).map(|i| u32_at(&table, 4 * i)).collect();
            header.check(36)?;
            offset += 8 + 4 * u64::from(n);
        }
        Ok(Self { input, header, version, offset, records: 0, done: false, buf: Vec::new() })
    }

    /// The file's version (1 to [`VERSION`]).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The input, positioned at [`TraceReader::offset`].
    pub(super) fn into_input(self) -> R {
        self.input
    }

    /// The file header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Byte offset of the next unread byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn next_record(&mut self) -> Result<Option<TraceRecord>> {
        let start = self.offset;
        let mut tag = [0u8; 1];
        read_exact(&mut self.input, &mut tag, start, "record tag (a trace ends with an end marker)")?;
        match tag[0] {
            TAG_END => {
                let mut tail = [0u8; 12];
                read_exact(&mut self.input, &mut tail, start + 1, "end marker")?;
                let n = u64::from_le_bytes(tail[..8].try_into().unwrap_or_default());
                if crc(&tail[..8]) != u32_at(&tail, 8) {
                    return Err(err("corrupt end marker", start + 9, "checksum mismatch"));
                }
                if n != self.records {
                    return Err(err(
                        "corrupt end marker",
                        start + 1,
                        format!("says {n} records, {} were read", self.records),
                    ));
                }
                let mut extra = [0u8; 1];
                if self.input.read(&mut extra).map_err(|e| err("unreadable", start + 13, e.to_string()))? != 0 {
                    return Err(err("trailing bytes", start + 13, "bytes after the end marker"));
                }
                self.offset = start + 13;
                Ok(None)
            }
            TAG_RECORD => {
                let mut len = [0u8; 4];
                read_exact(&mut self.input, &mut len, start + 1, "record length")?;
                let len = u32::from_le_bytes(len);
                if !(28..=MAX_PAYLOAD).contains(&len) {
                    return Err(err("corrupt record", start + 1, format!("record length {len} out of range")));
                }
                self.buf.resize(len as usize, 0);
                read_exact(&mut self.input, &mut self.buf, start + 5, "record")?;
                let rec = record_at(&self.header, self.version, &self.buf, start, true)?;
                self.records += 1;
                self.offset = start + 5 + u64::from(len);
                Ok(Some(rec))
            }
            t => Err(err("corrupt record", start, format!("unknown tag {t:#04x}"))),
        }
    }

    /// A reader that continues `bytes` at `offset`, after `records` records (the parallel
    /// reader's tail).
    pub(super) fn resume(input: R, header: TraceHeader, version: u16, offset: u64, records: u64) -> Self {
        Self { input, header, version, offset, records, done: false, buf: Vec::new() }
    }
}

/// One record (`rec`: its `len` bytes, checksums included) of a trace of `version` starting at
/// `start`: checked and decoded; without `keep_scores` its scores and near-cut candidates are
/// delimited but not decoded (the record then fits [`without_scores`]`(header)`), and in
/// version 3 their checksum is not computed either.
pub(super) fn record_at(
    header: &TraceHeader,
    version: u16,
    rec: &[u8],
    start: u64,
    keep_scores: bool,
) -> Result<TraceRecord> {
    let at = |i: usize| start + 5 + i as u64;
    let (mut r, part, part_at) = if version == 3 {
        check_split(u32_at(rec, 0), rec.len() as u32, start)?;
        let sel_len = u32_at(rec, 0) as usize;
        let part = &rec[8 + sel_len..rec.len() - 4];
        if keep_scores && crc(part) != u32_at(rec, rec.len() - 4) {
            return Err(err("corrupt record", at(rec.len() - 4), "score checksum mismatch"));
        }
        (split_selection(header, rec, start)?, part, 8 + sel_len)
    } else {
        let body = &rec[..rec.len() - 4];
        if crc(body) != u32_at(rec, rec.len() - 4) {
            return Err(err("corrupt record", start, "record checksum mismatch"));
        }
        let (r, end) = decode_selection(header, body, at)?;
        (r, &body[end..], end)
    };
    (r.scores, r.near) = decode_scores(header, part, r.selected.len(), keep_scores, |i| at(part_at + i))?;
    // Delta coding makes the positions strictly ascending and `decode_selection` bounds their count.
    if keep_scores {
        r.check_decoded(header, start)?;
    } else {
        r.check_decoded(&without_scores(header), start)?;
    }
    Ok(r)
}

/// Checks that a version-3 record of `len` bytes (after its length) starting at `start` holds
/// `sel_len`, a selection part of `sel_len` bytes (its fields at least), its checksum, and the
/// score part's checksum.
pub(super) fn check_split(sel_len: u32, len: u32, start: u64) -> Result<()> {
    if sel_len < 24 || u64::from(sel_len) + 12 > u64::from(len) {
        return Err(err(
            "corrupt record",
            start + 5,
            format!("a selection part of {sel_len} bytes in a record of {len}"),
        ));
    }
    Ok(())
}

/// The record without scores in the selection part of a version-3 record (`rec`: `sel_len`,
/// the part, its checksum, and possibly more) starting at `start`: its length checked by
/// [`check_split`] before, its checksum and contents here (nothing may follow the positions).
fn split_selection(header: &TraceHeader, rec: &[u8], start: u64) -> Result<TraceRecord> {
    let sel_len = u32_at(rec, 0) as usize;
    let sel = &rec[4..4 + sel_len];
    let at = |i: usize| start + 9 + i as u64;
    if crc(sel) != u32_at(rec, 4 + sel_len) {
        return Err(err("corrupt record", at(sel_len), "selection checksum mismatch"));
    }
    let (r, end) = decode_selection(header, sel, at)?;
    if end != sel_len {
        return Err(err("corrupt record", at(end), "bytes after the positions in the selection part"));
    }
    Ok(r)
}

/// A version-3 record read without its score part (`head`: `sel_len`, the selection part and its
/// checksum; `score_bytes`: the length of the score part skipped, its checksum included):
/// checked and decoded as [`record_at`] without `keep_scores` does, the score part checked only
/// for a length the header allows.
pub(super) fn selection_at(header: &TraceHeader, head: &[u8], score_bytes: u64, start: u64) -> Result<TraceRecord> {
    // The caller read `head` after check_split: it holds sel_len, the part and its checksum.
    let r = split_selection(header, head, start)?;
    let count = r.selected.len() as u64;
    let fixed = 4 + if header.has_scores { 4 * count } else { 0 } + if header.score_margin > 0 { 4 } else { 0 };
    let near = score_bytes.checked_sub(fixed);
    let fits = match near {
        Some(n) if header.score_margin > 0 => n % 8 == 0 && n / 8 <= u64::from(header.score_margin),
        Some(n) => n == 0,
        None => false,
    };
    if !fits {
        return Err(err(
            "corrupt record",
            start + 5 + head.len() as u64,
            format!("a score part of {score_bytes} bytes for {count} positions"),
        ));
    }
    r.check_decoded(&without_scores(header), start)?;
    Ok(r)
}

/// `header` as a trace read without its scores shows it: no scores, no near-cut candidates.
pub fn without_scores(header: &TraceHeader) -> TraceHeader {
    TraceHeader { has_scores: false, score_margin: 0, ..header.clone() }
}

/// The positions of a selection part from byte 24: `count` delta-coded varints; returns them
/// and the index after the last.
fn positions(b: &[u8], count: usize, at: impl Fn(usize) -> u64) -> Result<(Vec<u32>, usize)> {
    let mut selected = Vec::with_capacity(count);
    let mut i = 24;
    // The first position is stored as is; each next one as its distance to the last, minus 1.
    let mut next = 0u64;
    while selected.len() < count {
        // Eight one-byte varints at once (a dense selection's distances are mostly below 128):
        // taken whole when none of them has a continuation bit and the last position fits in
        // 32 bits; otherwise the next varint is read alone below, with its exact error.
        if count - selected.len() >= 8
            && let Some(&chunk) = b.get(i..).and_then(|r| r.first_chunk::<8>())
        {
            let w = u64::from_le_bytes(chunk);
            if w & 0x8080_8080_8080_8080 == 0 {
                let mut run = [0u64; 8];
                let mut p = next;
                for (k, out) in run.iter_mut().enumerate() {
                    p += (w >> (8 * k)) & 0x7f;
                    *out = p;
                    p += 1;
                }
                if run[7] <= u64::from(u32::MAX) {
                    // Each below 2^32 (ascending, the last checked).
                    selected.extend(run.iter().map(|&q| q as u32));
                    next = p;
                    i += 8;
                    continue;
                }
            }
        }
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = *b.get(i).ok_or_else(|| err("corrupt record", at(i), "positions run past the record"))?;
            i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err(err("corrupt record", at(i), "varint longer than 5 bytes"));
            }
        }
        let p = next + v;
        let p = u32::try_from(p).map_err(|_| err("corrupt record", at(i), format!("position {p} above 2^32")))?;
        selected.push(p);
        next = u64::from(p) + 1;
    }
    Ok((selected, i))
}

/// The fields and positions at the start of `b` (`at`: a byte's offset in the file); returns
/// the record without scores and the index after its positions.
fn decode_selection(header: &TraceHeader, b: &[u8], at: impl Fn(usize) -> u64) -> Result<(TraceRecord, usize)> {
    if b.len() < 24 {
        return Err(err("corrupt record", at(0), format!("{} bytes, too short for a record's fields", b.len())));
    }
    let count = u32_at(b, 20) as usize;
    if count > header.top_k as usize {
        return Err(err("corrupt record", at(20), format!("{count} positions, top_k is {}", header.top_k)));
    }
    let (selected, end) = positions(b, count, &at)?;
    let r = TraceRecord {
        step: u32_at(b, 0),
        request: u64::from_le_bytes(b[4..12].try_into().unwrap_or_default()),
        layer: u32_at(b, 12),
        seq_len: u32_at(b, 16),
        selected,
        scores: None,
        near: None,
    };
    Ok((r, end))
}

/// Near-cut candidates as decoded: (position, score) pairs.
type Near = Vec<(u32, f32)>;

/// The score part `b` of a record of `count` positions (scores, then near-cut candidates, as
/// the header says), which it must fill exactly; decoded only with `keep_scores`.
fn decode_scores(
    header: &TraceHeader,
    b: &[u8],
    count: usize,
    keep_scores: bool,
    at: impl Fn(usize) -> u64,
) -> Result<(Option<Vec<f32>>, Option<Near>)> {
    let mut i = 0;
    let f32_at = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let scores = if header.has_scores {
        let end = i + 4 * count;
        let s = b.get(i..end).ok_or_else(|| err("corrupt record", at(i), "scores run past the record"))?;
        i = end;
        keep_scores.then(|| s.chunks_exact(4).map(f32_at).collect())
    } else {
        None
    };
    let near = if header.score_margin > 0 {
        let n = b
            .get(i..i + 4)
            .map(|c| u32_at(c, 0))
            .ok_or_else(|| err("corrupt record", at(i), "near-cut count runs past the record"))?;
        if n > header.score_margin {
            return Err(err(
                "corrupt record",
                at(i),
                format!("{n} near-cut candidates, score_margin is {}", header.score_margin),
            ));
        }
        i += 4;
        let end = i + 8 * n as usize;
        let s = b.get(i..end).ok_or_else(|| err("corrupt record", at(i), "near-cut candidates run past the record"))?;
        i = end;
        keep_scores.then(|| s.chunks_exact(8).map(|c| (u32_at(c, 0), f32_at(&c[4..]))).collect())
    } else {
        None
    };
    if i != b.len() {
        return Err(err(
            "corrupt record",
            at(i),
            format!("{} unexplained bytes at the end of the record", b.len() - i),
        ));
    }
    Ok((scores, near))
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<TraceRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
