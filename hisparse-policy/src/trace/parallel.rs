//! A binary trace held in memory, decoded on every core: one serial pass finds the records'
//! boundaries (tag and length only), rayon checks and decodes them, and the reader proper reads
//! what follows (the end marker, or the first record the pass could not delimit). The records
//! and the first error are the ones [`TraceReader`] gives, reading byte by byte. Or the same
//! checks but for the positions, which stay encoded ([`encode_all`]).

use rayon::prelude::*;

use super::binary::{MAX_PAYLOAD, TAG_RECORD, TraceReader, record_at, record_head_at, without_scores};
use super::{EncodedRecord, EncodedTrace, TraceHeader, TraceRecord};
use crate::error::Result;

/// The header and every record of the binary trace `bytes`; without `keep_scores` the records'
/// scores and near-cut candidates are delimited and checksummed but not decoded, and the header
/// says the trace has none ([`without_scores`]).
pub fn read_all(bytes: &[u8], keep_scores: bool) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let (reader, spans) = frame(bytes)?;
    let (header, version) = (reader.header().clone(), reader.version());
    let decoded: Vec<Result<TraceRecord>> = spans
        .par_iter()
        .map(|&(start, end)| record_at(&header, version, &bytes[start + 5..end], start as u64, keep_scores))
        .collect();
    // The first error in file order, as the reader would meet it.
    let records = decoded.into_iter().collect::<Result<Vec<_>>>()?;
    finish(bytes, reader, &spans)?;
    Ok((if keep_scores { header } else { without_scores(&header) }, records))
}

/// [`read_all`] without scores, the positions left encoded: each record checked as `read_all`
/// checks it but for its positions (decoded here only where a score part follows them, to find
/// where that part begins), the trace's bytes kept. A version-3 record's score part has its
/// structure checked with `score_parts`, and is not read without.
pub fn encode_all(bytes: Vec<u8>, score_parts: bool) -> Result<EncodedTrace> {
    let (reader, spans) = frame(&bytes)?;
    let (header, version) = (reader.header().clone(), reader.version());
    let heads: Vec<Result<EncodedRecord>> = spans
        .par_iter()
        .map_init(Vec::new, |scratch, &(start, end)| {
            record_head_at(&header, version, &bytes[start + 5..end], start as u64, scratch, score_parts)
        })
        .collect();
    let records = heads.into_iter().collect::<Result<Vec<_>>>()?;
    finish(&bytes, reader, &spans)?;
    Ok(EncodedTrace { header: without_scores(&header), stored: header, bytes, records })
}

/// Where a record lies in a trace's bytes: from its tag to its end.
type Span = (usize, usize);

/// The header read, and every record's span up to the first thing that is not a whole record.
fn frame(bytes: &[u8]) -> Result<(TraceReader<&[u8]>, Vec<Span>)> {
    let reader = TraceReader::new(bytes)?;
    let mut off = usize::try_from(reader.offset()).unwrap_or(usize::MAX);
    let mut spans: Vec<(usize, usize)> = Vec::new();
    while bytes.get(off) == Some(&TAG_RECORD) {
        let Some(len) = bytes.get(off + 1..off + 5).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else {
            break;
        };
        let end = off + 5 + len as usize;
        if !(28..=MAX_PAYLOAD).contains(&len) || end > bytes.len() {
            break;
        }
        spans.push((off, end));
        off = end;
    }
    Ok((reader, spans))
}

/// What follows the records of `spans` (the end marker, or the error the reader reports there).
fn finish(bytes: &[u8], reader: TraceReader<&[u8]>, spans: &[Span]) -> Result<()> {
    let off = spans.last().map_or(usize::try_from(reader.offset()).unwrap_or(usize::MAX), |s| s.1);
    let tail = bytes.get(off..).unwrap_or_default();
    let (header, version) = (reader.header().clone(), reader.version());
    let mut rest = TraceReader::resume(tail, header, version, off as u64, spans.len() as u64);
    match rest.next() {
        None => Ok(()),
        Some(Err(e)) => Err(e),
        // Unreachable: the pass above stops only before something that is not a whole record.
        Some(Ok(_)) => Err(crate::error::PolicyError::Trace {
            what: "corrupt record",
            offset: off as u64,
            message: "a record the boundary pass missed".into(),
        }),
    }
}
