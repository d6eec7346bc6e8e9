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
//!
//! `write` holds the writer, `read` the record-by-record reader, `decode` the decoding and
//! checking of one record (shared with the whole-file and skimming readers beside this module),
//! `head` the same checks but for the positions, which an [`EncodedTrace`](super::EncodedTrace)
//! decodes when they are read.

use std::io::Read;

use super::TraceHeader;
use crate::error::{PolicyError, Result};

mod decode;
pub(in crate::trace) mod head;
mod read;
mod write;

pub(super) use decode::{check_split, record_at, selection_at};
pub(super) use head::{positions_of, record_head_at, selection_head_at};
pub use read::TraceReader;
pub use write::TraceWriter;

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

/// `header` as a trace read without its scores shows it: no scores, no near-cut candidates.
pub fn without_scores(header: &TraceHeader) -> TraceHeader {
    TraceHeader { has_scores: false, score_margin: 0, ..header.clone() }
}
