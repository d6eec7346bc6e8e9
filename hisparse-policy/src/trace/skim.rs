//! A version-3 binary trace read without its scores from a seekable input: each record's
//! selection part is read and checked, its score part skipped by a seek (only its length is
//! checked), so most of a scored trace's bytes are never read. The selection parts are decoded
//! on every core. The records and errors are those of the whole-file reader without scores but
//! for the skipped parts' checksums, which nothing here computes.

use std::io::{BufReader, Read, Seek, SeekFrom};

use rayon::prelude::*;

use super::binary::{MAX_PAYLOAD, TAG_RECORD, TraceReader, check_split, err, read_exact, selection_at, without_scores};
use super::{TraceHeader, TraceRecord};
use crate::error::Result;

/// Bytes of a record's head and selection part besides one per position: its tag, lengths,
/// fields, checksum, and the few positions that take two bytes.
const SELECTION_SLACK: usize = 256;

/// A record's selection part as read: where the record starts, its head (`sel_len`, the part,
/// its checksum) in the shared buffer, and the score part's length skipped.
struct Head {
    start: u64,
    span: (usize, usize),
    score_bytes: u64,
}

/// Reads the version-3 trace `input` whose header `reader` has read (of `size` bytes in all,
/// within `max_bytes`): every record's selection, the end marker checked; the header returned
/// says the trace has no scores.
pub(super) fn read_selections<R: Read + Seek>(
    reader: TraceReader<BufReader<R>>,
    size: u64,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let (header, version, mut off) = (reader.header().clone(), reader.version(), reader.offset());
    // A read buffer about one record's head and selection part long (a dense selection takes
    // a byte or so per position): each record then costs a seek and one read, of little more
    // than what it uses; a longer part is read past the buffer.
    let capacity = (header.top_k as usize + SELECTION_SLACK).clamp(1 << 10, 64 << 10);
    let mut inner = reader.into_input().into_inner();
    inner.seek(SeekFrom::Start(off)).map_err(|e| err("unreadable", off, e.to_string()))?;
    let mut input = BufReader::with_capacity(capacity, inner);
    let mut heads: Vec<Head> = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    // The records' framing, up to the first fault; the records before it are decoded first,
    // so that the first error in file order is reported, as the whole-file reader reports it.
    let mut frame = || -> Result<u8> {
        loop {
            // Read as the whole-file reader reads them, so that every error is the one it gives.
            let mut tag = [0u8; 1];
            read_exact(&mut input, &mut tag, off, "record tag (a trace ends with an end marker)")?;
            if tag[0] != TAG_RECORD {
                return Ok(tag[0]);
            }
            let mut len = [0u8; 4];
            read_exact(&mut input, &mut len, off + 1, "record length")?;
            let len = u32::from_le_bytes(len);
            if !(28..=MAX_PAYLOAD).contains(&len) {
                return Err(err("corrupt record", off + 1, format!("record length {len} out of range")));
            }
            let left = size.saturating_sub(off + 5);
            if u64::from(len) > left {
                return Err(err("truncated", size, format!("record: {} more bytes expected", u64::from(len) - left)));
            }
            let mut sel_len = [0u8; 4];
            read_exact(&mut input, &mut sel_len, off + 5, "record")?;
            let sel_len = u32::from_le_bytes(sel_len);
            check_split(sel_len, len, off)?;
            // The score part with its checksum: what is left of the record (at least 4 bytes).
            let score_bytes = len - sel_len - 8;
            let at = buf.len();
            buf.extend_from_slice(&sel_len.to_le_bytes());
            // sel_len < len <= MAX_PAYLOAD: a bounded read.
            buf.resize(at + 8 + sel_len as usize, 0);
            read_exact(&mut input, &mut buf[at + 4..], off + 9, "record")?;
            input
                .seek_relative(i64::from(score_bytes))
                .map_err(|e| err("unreadable", off + 13 + u64::from(sel_len), e.to_string()))?;
            heads.push(Head { start: off, span: (at, buf.len()), score_bytes: u64::from(score_bytes) });
            off += 5 + u64::from(len);
        }
    };
    let framing = frame();
    let decoded: Vec<Result<TraceRecord>> =
        heads.par_iter().map(|h| selection_at(&header, &buf[h.span.0..h.span.1], h.score_bytes, h.start)).collect();
    let records = decoded.into_iter().collect::<Result<Vec<_>>>()?;
    let last_tag = framing?;
    // What follows the records (its tag was read above) as the whole-file reader checks it:
    // the end marker, or an error.
    let tag = [last_tag];
    let tail = (&tag[..]).chain(input);
    let mut rest = TraceReader::resume(tail, header.clone(), version, off, records.len() as u64);
    match rest.next() {
        None => Ok((without_scores(&header), records)),
        Some(Err(e)) => Err(e),
        Some(Ok(_)) => Err(err("corrupt record", off, "a record after the selections")),
    }
}
