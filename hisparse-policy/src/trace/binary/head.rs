//! One record checked as [`record_at`](super::record_at) checks it, but for its positions: its
//! framing, checksum, fields, count and score part here; where its positions lie kept, to be
//! decoded and checked when they are read ([`EncodedTrace`](crate::trace::EncodedTrace)).

use super::decode::{check_score_bytes, decode_scores, fields, positions_into};
use super::{crc, err, u32_at, without_scores};
use crate::error::Result;
use crate::trace::{TraceHeader, TraceRecord};

/// How a record's positions must end (which error a decoder reports when they do not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::trace) enum PositionsEnd {
    /// At the end of a version-3 selection part.
    SelectionPart,
    /// At the end of a version-1 or 2 record's body (or where its score part begins).
    Body,
}

/// One record of an [`EncodedTrace`](crate::trace::EncodedTrace): its fields, and where its positions lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedRecord {
    /// The request's decode step.
    pub step: u32,
    /// Request id.
    pub request: u64,
    /// Layer.
    pub layer: u32,
    /// Tokens in the sequence.
    pub seq_len: u32,
    /// Positions selected (at most the header's `top_k`).
    pub count: u32,
    /// Where the record starts in the file (errors name it).
    pub(in crate::trace) start: u64,
    /// The file offset of the record's fields (errors inside them name it).
    pub(in crate::trace) base: u64,
    /// The fields and positions in the trace's bytes, up to where the positions must end.
    pub(in crate::trace) span: (usize, usize),
    pub(in crate::trace) end: PositionsEnd,
}

/// The record of `fields` (without positions) and `count` positions, whose fields begin at
/// `span.0` of the trace's bytes (byte `base` of the file) and whose positions end at `span.1`.
fn encoded(
    r: TraceRecord,
    count: usize,
    start: u64,
    base: u64,
    span: (usize, usize),
    end: PositionsEnd,
) -> EncodedRecord {
    EncodedRecord {
        step: r.step,
        request: r.request,
        layer: r.layer,
        seq_len: r.seq_len,
        // count <= top_k <= MAX_TOP_K (checked by `fields`).
        count: count as u32,
        start,
        base,
        span,
        end,
    }
}

/// A version-3 record read without its score part, as [`selection_at`](super::selection_at)
/// checks it but for its positions: `head` (`sel_len`, the selection part, its checksum) lies at
/// `at` in the bytes the trace keeps; `score_bytes` is the skipped score part's length.
pub(in crate::trace) fn selection_head_at(
    header: &TraceHeader,
    head: &[u8],
    score_bytes: u64,
    start: u64,
    at: usize,
) -> Result<EncodedRecord> {
    // The caller read `head` after check_split: it holds sel_len (>= 24), the part and its
    // checksum.
    let sel_len = u32_at(head, 0) as usize;
    let sel = &head[4..4 + sel_len];
    let base = start + 9;
    if crc(sel) != u32_at(head, 4 + sel_len) {
        return Err(err("corrupt record", base + sel_len as u64, "selection checksum mismatch"));
    }
    let (r, count) = fields(header, sel, |i| base + i as u64)?;
    check_score_bytes(header, count, score_bytes, start + 5 + head.len() as u64)?;
    r.check_head(&without_scores(header), start)?;
    Ok(encoded(r, count, start, base, (at + 4, at + 4 + sel_len), PositionsEnd::SelectionPart))
}

/// A record (`rec`: its bytes after its length, at `start + 5` of `bytes`, the whole file) of a
/// trace of `version`, as [`record_at`](super::record_at) without scores checks it but for its
/// positions. A version-1 or 2 record whose header has scores has its positions decoded here
/// once (into `scratch`), to find where its score part begins. A version-3 record's score part
/// (its own part, delimited by the record's split) has its structure checked with
/// `score_parts`; without, only its length, as a file's skimming reader checks a part it skips.
pub(in crate::trace) fn record_head_at(
    header: &TraceHeader,
    version: u16,
    rec: &[u8],
    start: u64,
    scratch: &mut Vec<u32>,
    score_parts: bool,
) -> Result<EncodedRecord> {
    let at0 = start as usize + 5;
    let (r, count, base, span, end) = if version == 3 {
        super::check_split(u32_at(rec, 0), rec.len() as u32, start)?;
        let sel_len = u32_at(rec, 0) as usize;
        let base = start + 9;
        if crc(&rec[4..4 + sel_len]) != u32_at(rec, 4 + sel_len) {
            return Err(err("corrupt record", base + sel_len as u64, "selection checksum mismatch"));
        }
        let (r, count) = fields(header, &rec[4..4 + sel_len], |i| base + i as u64)?;
        let part = &rec[8 + sel_len..rec.len() - 4];
        let part_at = start + 13 + sel_len as u64;
        if score_parts {
            decode_scores(header, part, count, false, |i| part_at + i as u64)?;
        } else {
            // Only its length, as the skimming reader checks a part it skips.
            check_score_bytes(header, count, part.len() as u64 + 4, part_at)?;
        }
        (r, count, base, (at0 + 4, at0 + 4 + sel_len), PositionsEnd::SelectionPart)
    } else {
        let body = &rec[..rec.len() - 4];
        if crc(body) != u32_at(rec, rec.len() - 4) {
            return Err(err("corrupt record", start, "record checksum mismatch"));
        }
        let at = |i: usize| start + 5 + i as u64;
        let (r, count) = fields(header, body, at)?;
        let mut end = body.len();
        if header.has_scores || header.score_margin > 0 {
            end = positions_into(body, count, at, scratch)?;
            decode_scores(header, &body[end..], count, false, |i| at(end + i))?;
        }
        (r, count, start + 5, (at0, at0 + end), PositionsEnd::Body)
    };
    r.check_head(&without_scores(header), start)?;
    Ok(encoded(r, count, start, base, span, end))
}

/// The positions of `r` (a record of the trace whose bytes are `bytes`) into `out`: decoded and
/// checked as the record's reader would have (they must end where the record says and stay
/// below its `seq_len`).
pub(in crate::trace) fn positions_of(bytes: &[u8], r: &EncodedRecord, out: &mut Vec<u32>) -> Result<()> {
    let b = bytes.get(r.span.0..r.span.1).unwrap_or_default();
    let at = |i: usize| r.base + i as u64;
    let end = positions_into(b, r.count as usize, at, out)?;
    if end != b.len() {
        return Err(match r.end {
            PositionsEnd::SelectionPart => {
                err("corrupt record", at(end), "bytes after the positions in the selection part")
            }
            PositionsEnd::Body => {
                err("corrupt record", at(end), format!("{} unexplained bytes at the end of the record", b.len() - end))
            }
        });
    }
    crate::trace::check_last_position(out, r.seq_len, r.start)
}
