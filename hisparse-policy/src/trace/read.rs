//! Reading a trace: a whole file or any reader, binary or JSON lines (told apart by the first
//! byte), decoded (with or without scores; a version-3 file's score parts skipped unread where
//! nothing reads them) or with a binary trace's positions left encoded ([`EncodedTrace`]).

use std::io::{BufRead, Read, Seek};
use std::path::Path;

use super::{EncodedTrace, TraceHeader, TraceReader, TraceRecord, binary, jsonl, parallel, skim};
use crate::error::{PolicyError, Result};

/// Reads a whole trace file, binary or JSON lines (told apart by the first byte), header first
/// (a file that is not a trace is refused before the rest is read), at most `max_bytes` of it
/// (a larger file is refused with [`PolicyError::TooLarge`] once its header is checked).
pub fn read_trace(path: &Path, max_bytes: u64) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let io = |e: std::io::Error| PolicyError::Io { path: path.display().to_string(), message: e.to_string() };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().ok().filter(std::fs::Metadata::is_file).map(|m| m.len());
    read_trace_from(file, size, max_bytes)
}

/// [`read_trace`] from any reader (a pipe too): the header is read and checked first; then a
/// `size` (when the input's length is known) above `max_bytes` is refused before anything
/// else is read, and an input that turns out longer than `max_bytes` is refused on the way.
pub fn read_trace_from(input: impl Read, size: Option<u64>, max_bytes: u64) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    read_trace_from_with(input, size, max_bytes, true)
}

/// [`read_trace_from`], keeping the records' scores and near-cut candidates only with
/// `keep_scores`: a replay whose policies and prefetchers read none skips decoding them (their
/// bytes are still delimited and checksummed; what they say — near-cut candidates unselected,
/// in order — is not checked), and the header returned says the trace has none.
pub fn read_trace_from_with(
    input: impl Read,
    size: Option<u64>,
    max_bytes: u64,
    keep_scores: bool,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let (mut input, first) = buffered(input)?;
    let too_large = |bytes: Option<u64>| PolicyError::TooLarge { bytes, limit: max_bytes };
    if size.is_some_and(|n| n > max_bytes) && first != Some(b'{') {
        // The header first: a file that is no trace is refused as such, not for its size.
        TraceReader::new(&mut input)?;
        return Err(too_large(size));
    }
    if first == Some(b'{') {
        let mut bounded = input.take(max_bytes);
        let read = jsonl::read(&mut bounded);
        if bounded.limit() == 0 && bounded.into_inner().fill_buf().is_ok_and(|b| !b.is_empty()) {
            return Err(too_large(size));
        }
        return match read {
            Ok((h, mut records)) if !keep_scores => {
                for r in &mut records {
                    (r.scores, r.near) = (None, None);
                }
                Ok((binary::without_scores(&h), records))
            }
            other => other,
        };
    }
    // Binary: decoded on every core.
    parallel::read_all(&binary_bytes(input, size, max_bytes)?, keep_scores)
}

/// A binary trace's bytes, the header checked as it is read, then the rest (sized up front):
/// at most `max_bytes` (more is refused with [`PolicyError::TooLarge`]).
fn binary_bytes(mut input: impl Read, size: Option<u64>, max_bytes: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    TraceReader::new(Tee { input: &mut input, copy: &mut bytes })?;
    if let Some(n) = size {
        bytes.reserve(usize::try_from(n).unwrap_or(0).saturating_sub(bytes.len()));
        advise_huge_pages(&bytes);
    }
    let room = max_bytes.saturating_sub(bytes.len() as u64);
    let mut rest = input.take(room.saturating_add(1));
    rest.read_to_end(&mut bytes).map_err(|e| PolicyError::Trace {
        what: "unreadable",
        offset: bytes.len() as u64,
        message: e.to_string(),
    })?;
    if bytes.len() as u64 > max_bytes {
        return Err(PolicyError::TooLarge { bytes: size, limit: max_bytes });
    }
    Ok(bytes)
}

/// An input error before any record, at byte `offset`.
fn unreadable(offset: u64) -> impl Fn(std::io::Error) -> PolicyError {
    move |e| PolicyError::Trace { what: "unreadable", offset, message: e.to_string() }
}

/// `input` buffered, and its first byte (`{` starts JSON lines; `None`: empty).
fn buffered<R: Read>(input: R) -> Result<(std::io::BufReader<R>, Option<u8>)> {
    let mut input = std::io::BufReader::new(input);
    let first = input.fill_buf().map_err(unreadable(0))?.first().copied();
    Ok((input, first))
}

/// [`read_trace_from_with`] from an input that can seek (a regular file) of `size` bytes: a
/// version-3 binary trace read without `keep_scores` has each record's score part skipped by a
/// seek — never read, its checksum not computed, only its length checked against the header —
/// so a replay that reads no scores reads a fraction of the file; every other input is read as
/// [`read_trace_from_with`] reads it.
pub fn read_trace_file_with<R: Read + Seek>(
    input: R,
    size: u64,
    max_bytes: u64,
    keep_scores: bool,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let (input, first) = buffered(input)?;
    if keep_scores || first == Some(b'{') {
        return read_trace_from_with(input, Some(size), max_bytes, keep_scores);
    }
    let reader = TraceReader::new(input)?;
    if size > max_bytes {
        return Err(PolicyError::TooLarge { bytes: Some(size), limit: max_bytes });
    }
    let h = reader.header();
    if reader.version() == 3 && (h.has_scores || h.score_margin > 0) {
        return skim::read_selections(reader, size);
    }
    let mut input = reader.into_input();
    input.rewind().map_err(unreadable(0))?;
    read_trace_from_with(input, Some(size), max_bytes, keep_scores)
}

/// A trace as [`read_trace_file_encoded`] reads it, without scores.
#[derive(Clone, Debug)]
pub enum TraceData {
    /// A binary trace, its positions still encoded.
    Encoded(EncodedTrace),
    /// A JSON-lines trace, decoded (that form keeps no encoding).
    Records(TraceHeader, Vec<TraceRecord>),
}

impl TraceData {
    /// The header (without scores).
    pub fn header(&self) -> &TraceHeader {
        match self {
            Self::Encoded(t) => t.header(),
            Self::Records(h, _) => h,
        }
    }
}

/// [`read_trace_file_with`] without scores, a binary trace's positions left encoded
/// ([`EncodedTrace`]): its framing, checksums, fields and score parts' lengths are checked here,
/// its positions as they are decoded. A version-3 trace's score parts are skipped unread.
pub fn read_trace_file_encoded<R: Read + Seek>(input: R, size: u64, max_bytes: u64) -> Result<TraceData> {
    let (input, first) = buffered(input)?;
    if first == Some(b'{') {
        let (h, r) = read_trace_from_with(input, Some(size), max_bytes, false)?;
        return Ok(TraceData::Records(h, r));
    }
    let reader = TraceReader::new(input)?;
    if size > max_bytes {
        return Err(PolicyError::TooLarge { bytes: Some(size), limit: max_bytes });
    }
    if reader.version() == 3 {
        return skim::read_encoded(reader, size).map(TraceData::Encoded);
    }
    let mut input = reader.into_input();
    input.rewind().map_err(unreadable(0))?;
    parallel::encode_all(binary_bytes(input, Some(size), max_bytes)?, true).map(TraceData::Encoded)
}

/// [`read_trace_file_encoded`] from any reader (a pipe too): a binary trace read whole (a
/// version-3 trace's score parts read and delimited, not decoded) with its positions left
/// encoded; JSON lines decoded. `size` and `max_bytes` as [`read_trace_from`] takes them.
pub fn read_trace_from_encoded(input: impl Read, size: Option<u64>, max_bytes: u64) -> Result<TraceData> {
    let (mut input, first) = buffered(input)?;
    if first == Some(b'{') {
        let (h, r) = read_trace_from_with(input, size, max_bytes, false)?;
        return Ok(TraceData::Records(h, r));
    }
    if size.is_some_and(|n| n > max_bytes) {
        // The header first: a file that is no trace is refused as such, not for its size.
        TraceReader::new(&mut input)?;
        return Err(PolicyError::TooLarge { bytes: size, limit: max_bytes });
    }
    parallel::encode_all(binary_bytes(input, size, max_bytes)?, true).map(TraceData::Encoded)
}

/// A trace described without its scores, from a file (`size` given: a version-3 trace's score
/// parts skipped unread) or a stream (read whole, score parts delimited, never checksummed): the
/// header as stored (its scores' flags as written) and the records without scores, positions
/// left encoded where binary. A damaged score part gets the same verdict either way: none, as no
/// score is read; JSON lines are decoded whole, their scores with them.
pub fn read_trace_described<R: Read + Seek>(
    input: R,
    size: Option<u64>,
    max_bytes: u64,
) -> Result<(TraceHeader, TraceData)> {
    let (input, first) = buffered(input)?;
    if first == Some(b'{') {
        let (h, r) = read_trace_from_with(input, size, max_bytes, true)?;
        return Ok((h.clone(), TraceData::Records(h, r)));
    }
    let read = match size {
        Some(n) => read_trace_file_encoded(input, n, max_bytes)?,
        // A stream is read whole; its version-3 score parts are delimited but not read, as a
        // file's are skipped (one verdict either way).
        None => parallel::encode_all(binary_bytes(input, None, max_bytes)?, false).map(TraceData::Encoded)?,
    };
    let stored = match &read {
        TraceData::Encoded(t) => t.stored_header().clone(),
        TraceData::Records(h, _) => h.clone(),
    };
    Ok((stored, read))
}

/// Asks Linux to back `buf`'s spare capacity with huge pages (where transparent huge pages are
/// on `madvise`): a trace of tens of MB is then read into a few hundred faults, not thousands.
#[cfg(target_os = "linux")]
#[allow(clippy::ptr_arg)] // the spare capacity is what is advised: a slice would not show it
fn advise_huge_pages(buf: &Vec<u8>) {
    const PAGE: usize = 4096;
    let base = buf.as_ptr() as usize;
    let (start, end) = (base.div_ceil(PAGE) * PAGE, (base + buf.capacity()) / PAGE * PAGE);
    if end > start {
        // SAFETY: [start, end) is page-aligned and inside `buf`'s allocation (its capacity); the
        // advice changes how the kernel backs those pages, never their contents or who owns them.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
#[allow(clippy::ptr_arg)] // as the Linux form
fn advise_huge_pages(_buf: &Vec<u8>) {}

/// A reader that keeps a copy of what it reads.
struct Tee<'a, R> {
    input: R,
    copy: &'a mut Vec<u8>,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.copy.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}
