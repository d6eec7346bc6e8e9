//! One record's bytes decoded and checked: its checksums, its selection part (positions
//! delta-coded as varints), its score part (scores and near-cut candidates), or the selection
//! part alone with the score part's length checked.

use super::{crc, err, u32_at, without_scores};
use crate::error::Result;
use crate::trace::{TraceHeader, TraceRecord};

/// One record (`rec`: its `len` bytes, checksums included) of a trace of `version` starting at
/// `start`: checked and decoded; without `keep_scores` its scores and near-cut candidates are
/// delimited but not decoded (the record then fits [`without_scores`]`(header)`), and in
/// version 3 their checksum is not computed either.
pub(in crate::trace) fn record_at(
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
pub(in crate::trace) fn check_split(sel_len: u32, len: u32, start: u64) -> Result<()> {
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
pub(in crate::trace) fn selection_at(
    header: &TraceHeader,
    head: &[u8],
    score_bytes: u64,
    start: u64,
) -> Result<TraceRecord> {
    // The caller read `head` after check_split: it holds sel_len, the part and its checksum.
    let r = split_selection(header, head, start)?;
    check_score_bytes(header, r.selected.len(), score_bytes, start + 5 + head.len() as u64)?;
    r.check_decoded(&without_scores(header), start)?;
    Ok(r)
}

/// Checks that a skipped score part of `score_bytes` (its checksum included) starting at `at`
/// is as long as the header allows for `count` positions.
pub(super) fn check_score_bytes(header: &TraceHeader, count: usize, score_bytes: u64, at: u64) -> Result<()> {
    let count = count as u64;
    let fixed = 4 + if header.has_scores { 4 * count } else { 0 } + if header.score_margin > 0 { 4 } else { 0 };
    let near = score_bytes.checked_sub(fixed);
    let fits = match near {
        Some(n) if header.score_margin > 0 => n % 8 == 0 && n / 8 <= u64::from(header.score_margin),
        Some(n) => n == 0,
        None => false,
    };
    if !fits {
        return Err(err("corrupt record", at, format!("a score part of {score_bytes} bytes for {count} positions")));
    }
    Ok(())
}

/// The positions of a selection part from byte 24: `count` delta-coded varints; returns them
/// and the index after the last.
fn positions(b: &[u8], count: usize, at: impl Fn(usize) -> u64) -> Result<(Vec<u32>, usize)> {
    let mut selected = Vec::with_capacity(count);
    let end = positions_into(b, count, at, &mut selected)?;
    Ok((selected, end))
}

/// [`positions`] into `selected` (cleared first); returns the index after the last.
pub(in crate::trace) fn positions_into(
    b: &[u8],
    count: usize,
    at: impl Fn(usize) -> u64,
    selected: &mut Vec<u32>,
) -> Result<usize> {
    selected.clear();
    selected.reserve(count);
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
    Ok(i)
}

/// The fields and positions at the start of `b` (`at`: a byte's offset in the file); returns
/// the record without scores and the index after its positions.
fn decode_selection(header: &TraceHeader, b: &[u8], at: impl Fn(usize) -> u64) -> Result<(TraceRecord, usize)> {
    let (mut r, count) = fields(header, b, &at)?;
    let end;
    (r.selected, end) = positions(b, count, &at)?;
    Ok((r, end))
}

/// The fields at the start of `b`: the record without positions, and the count of its
/// positions, checked against `top_k`.
pub(super) fn fields(header: &TraceHeader, b: &[u8], at: impl Fn(usize) -> u64) -> Result<(TraceRecord, usize)> {
    if b.len() < 24 {
        return Err(err("corrupt record", at(0), format!("{} bytes, too short for a record's fields", b.len())));
    }
    let count = u32_at(b, 20) as usize;
    if count > header.top_k as usize {
        return Err(err("corrupt record", at(20), format!("{count} positions, top_k is {}", header.top_k)));
    }
    let r = TraceRecord {
        step: u32_at(b, 0),
        request: u64::from_le_bytes(b[4..12].try_into().unwrap_or_default()),
        layer: u32_at(b, 12),
        seq_len: u32_at(b, 16),
        selected: Vec::new(),
        scores: None,
        near: None,
    };
    Ok((r, count))
}

/// Near-cut candidates as decoded: (position, score) pairs.
type Near = Vec<(u32, f32)>;

/// The score part `b` of a record of `count` positions (scores, then near-cut candidates, as
/// the header says), which it must fill exactly; decoded only with `keep_scores`.
pub(super) fn decode_scores(
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
