//! A version-3 binary trace read without its scores from a seekable input: each record's
//! selection part is read and checked, its score part skipped by a seek (only its length is
//! checked), so most of a scored trace's bytes are never read. Decoded (`read_selections`), the
//! selection parts are read a batch at a time into one reused buffer and each batch decoded on
//! every core (on the calling thread where there is one); the records and errors are those of the
//! whole-file reader without scores but for the skipped parts' checksums, which nothing here
//! computes. Or kept encoded (`read_encoded`): every selection part read into one buffer and
//! checked but for its positions.

use std::io::{BufReader, Read, Seek, SeekFrom};

use rayon::prelude::*;

use super::binary::{
    MAX_PAYLOAD, TAG_RECORD, TraceReader, check_split, err, read_exact, selection_at, selection_head_at, without_scores,
};
use super::{EncodedTrace, TraceHeader, TraceRecord};
use crate::error::Result;

/// Bytes of a record's head and selection part besides one per position: its tag, lengths,
/// fields, checksum, and the few positions that take two bytes.
const SELECTION_SLACK: usize = 256;

/// Bytes of selection parts decoded together, per thread.
const BATCH_BYTES_PER_THREAD: usize = 128 << 10;

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
    read_selections_in(reader, size, BATCH_BYTES_PER_THREAD * rayon::current_num_threads().max(1))
}

/// [`read_selections`] decoding at most about `batch` bytes of selection parts at a time.
fn read_selections_in<R: Read + Seek>(
    reader: TraceReader<BufReader<R>>,
    size: u64,
    batch: usize,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let header = reader.header().clone();
    let mut framer = Framer::new(reader, size)?;
    // Selection parts are framed into `buf` a batch at a time and the batch decoded on every
    // core; the buffer is then reused (never all of a long trace's parts at once, never copied
    // as it grows).
    let mut heads: Vec<Head> = Vec::new();
    let mut buf: Vec<u8> = Vec::with_capacity(batch.saturating_add(framer.capacity).min(64 << 20));
    let mut records: Vec<TraceRecord> = Vec::new();
    let framing = loop {
        // The records' framing, up to the first fault; the records before it are decoded
        // first, so that the first error in file order is reported, as the whole-file reader
        // reports it.
        let framed = framer.frame(&mut buf, &mut heads, batch);
        let decode = |h: &Head| selection_at(&header, &buf[h.span.0..h.span.1], h.score_bytes, h.start);
        // One thread: decoded here (handing a batch to the pool's only thread gains nothing).
        let decoded: Vec<Result<TraceRecord>> = if rayon::current_num_threads() > 1 {
            heads.par_iter().map(decode).collect()
        } else {
            heads.iter().map(decode).collect()
        };
        for r in decoded {
            records.push(r?);
        }
        buf.clear();
        heads.clear();
        match framed {
            Ok(None) => continue,
            Ok(Some(tag)) => break Ok(tag),
            Err(e) => break Err(e),
        }
    };
    framer.finish(framing?, records.len())?;
    Ok((without_scores(&header), records))
}

/// [`read_selections`] with the positions left encoded: every record's selection part read,
/// its checksum, fields and score part's length checked (by
/// [`selection_head_at`]), the end marker checked.
pub(super) fn read_encoded<R: Read + Seek>(reader: TraceReader<BufReader<R>>, size: u64) -> Result<EncodedTrace> {
    let header = reader.header().clone();
    let mut framer = Framer::new(reader, size)?;
    let (mut heads, mut bytes) = (Vec::new(), Vec::new());
    let framed = framer.frame(&mut bytes, &mut heads, usize::MAX);
    let records = heads
        .iter()
        .map(|h| selection_head_at(&header, &bytes[h.span.0..h.span.1], h.score_bytes, h.start, h.span.0))
        .collect::<Result<Vec<_>>>()?;
    let Some(tag) = framed? else {
        // Unreachable: an unbounded batch frames until something that is not a record.
        return Err(err("corrupt record", framer.off, "the framing stopped early"));
    };
    framer.finish(tag, records.len())?;
    Ok(EncodedTrace { header: without_scores(&header), stored: header, bytes, records })
}

/// Reads records' heads and selection parts, seeking past their score parts.
struct Framer<R> {
    input: BufReader<R>,
    header: TraceHeader,
    version: u16,
    /// The next record's offset.
    off: u64,
    size: u64,
    capacity: usize,
}

impl<R: Read + Seek> Framer<R> {
    fn new(reader: TraceReader<BufReader<R>>, size: u64) -> Result<Self> {
        let (header, version, off) = (reader.header().clone(), reader.version(), reader.offset());
        // A read buffer about one record's head and selection part long (a dense selection
        // takes a byte or so per position): each record then costs a seek and one read, of
        // little more than what it uses; a longer part is read past the buffer.
        let capacity = (header.top_k as usize + SELECTION_SLACK).clamp(1 << 10, 64 << 10);
        let mut inner = reader.into_input().into_inner();
        inner.seek(SeekFrom::Start(off)).map_err(|e| err("unreadable", off, e.to_string()))?;
        Ok(Self { input: BufReader::with_capacity(capacity, inner), header, version, off, size, capacity })
    }

    /// Frames records into `buf` (each `sel_len`, selection part and checksum) and `heads`
    /// until `buf` holds `batch` bytes (then `None`) or something other than a record follows
    /// (its tag).
    fn frame(&mut self, buf: &mut Vec<u8>, heads: &mut Vec<Head>, batch: usize) -> Result<Option<u8>> {
        let (input, off, size) = (&mut self.input, &mut self.off, self.size);
        while buf.len() < batch {
            // Read as the whole-file reader reads them, so that every error is the one it gives.
            let mut tag = [0u8; 1];
            read_exact(input, &mut tag, *off, "record tag (a trace ends with an end marker)")?;
            if tag[0] != TAG_RECORD {
                return Ok(Some(tag[0]));
            }
            let mut len = [0u8; 4];
            read_exact(input, &mut len, *off + 1, "record length")?;
            let len = u32::from_le_bytes(len);
            if !(28..=MAX_PAYLOAD).contains(&len) {
                return Err(err("corrupt record", *off + 1, format!("record length {len} out of range")));
            }
            let left = size.saturating_sub(*off + 5);
            if u64::from(len) > left {
                return Err(err("truncated", size, format!("record: {} more bytes expected", u64::from(len) - left)));
            }
            let mut sel_len = [0u8; 4];
            read_exact(input, &mut sel_len, *off + 5, "record")?;
            let sel_len = u32::from_le_bytes(sel_len);
            check_split(sel_len, len, *off)?;
            // The score part with its checksum: what is left of the record (at least 4 bytes).
            let score_bytes = len - sel_len - 8;
            let at = buf.len();
            buf.extend_from_slice(&sel_len.to_le_bytes());
            // sel_len < len <= MAX_PAYLOAD: a bounded read.
            buf.resize(at + 8 + sel_len as usize, 0);
            read_exact(input, &mut buf[at + 4..], *off + 9, "record")?;
            input
                .seek_relative(i64::from(score_bytes))
                .map_err(|e| err("unreadable", *off + 13 + u64::from(sel_len), e.to_string()))?;
            heads.push(Head { start: *off, span: (at, buf.len()), score_bytes: u64::from(score_bytes) });
            *off += 5 + u64::from(len);
        }
        Ok(None)
    }

    /// What follows `records` records (its tag `last_tag` read by [`Framer::frame`]) as the
    /// whole-file reader checks it: the end marker, or an error.
    fn finish(self, last_tag: u8, records: usize) -> Result<()> {
        let tag = [last_tag];
        let tail = (&tag[..]).chain(self.input);
        let mut rest = TraceReader::resume(tail, self.header, self.version, self.off, records as u64);
        match rest.next() {
            None => Ok(()),
            Some(Err(e)) => Err(e),
            Some(Ok(_)) => Err(err("corrupt record", self.off, "a record after the selections")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::trace::TraceWriter;

    /// A scored version-3 trace of 24 records over two layers (positions, scores, near-cut
    /// candidates below the cut).
    fn scored() -> Vec<u8> {
        let header = TraceHeader {
            top_k: 40,
            layers: 2,
            row_bytes: 656,
            has_scores: true,
            score_margin: 3,
            ..TraceHeader::default()
        };
        let mut w = TraceWriter::new(Vec::new(), header).unwrap();
        for step in 1..=12u32 {
            for layer in 0..2u32 {
                let seq_len = 300 + step;
                let selected: Vec<u32> = (0..30 + step % 7)
                    .map(|i| (i * 7 + step * 3 + layer) % seq_len)
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                let scores = selected.iter().map(|&p| 1.0 + p as f32 / 100.0).collect();
                let near = (0..seq_len)
                    .rev()
                    .filter(|p| selected.binary_search(p).is_err())
                    .take((step % 4) as usize)
                    .enumerate()
                    .map(|(j, p)| (p, -1.0 - j as f32))
                    .collect();
                w.write(&TraceRecord {
                    step,
                    request: 1,
                    layer,
                    seq_len,
                    selected,
                    scores: Some(scores),
                    near: Some(near),
                })
                .unwrap();
            }
        }
        w.finish().unwrap()
    }

    fn read(bytes: &[u8], batch: usize) -> std::result::Result<(TraceHeader, Vec<TraceRecord>), String> {
        let reader = TraceReader::new(BufReader::new(Cursor::new(bytes))).map_err(|e| format!("{e:?}"))?;
        read_selections_in(reader, bytes.len() as u64, batch).map_err(|e| format!("{e:?}"))
    }

    /// Whatever the batch (one record each, a few, all at once), the same records, and on a
    /// changed byte or a cut file the same first error.
    #[test]
    fn any_batch_reads_the_same_records_and_errors() {
        let good = scored();
        let whole = read(&good, usize::MAX).unwrap();
        assert_eq!(whole.1.len(), 24);
        for batch in [1, 200, 1000] {
            assert_eq!(read(&good, batch), Ok(whole.clone()), "batch {batch}");
        }
        let start = TraceReader::new(Cursor::new(&good[..])).unwrap().offset() as usize;
        let mut faults = 0;
        for at in (start..good.len()).step_by(5) {
            let mut bad = good.clone();
            bad[at] ^= 0x5a;
            let all = read(&bad, usize::MAX);
            faults += usize::from(all.is_err());
            for batch in [1, 200] {
                assert_eq!(read(&bad, batch), all, "byte {at}, batch {batch}");
            }
        }
        for cut in (start..good.len()).step_by(11) {
            let all = read(&good[..cut], usize::MAX);
            assert!(all.is_err(), "cut at {cut}");
            assert_eq!(read(&good[..cut], 1), all, "cut at {cut}");
        }
        assert!(faults > 100, "changed bytes were met: {faults}");
    }
}
