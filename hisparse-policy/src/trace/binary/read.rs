//! The binary trace reader: the header and layer table checked, then records one at a time
//! (an iterator), the end marker and the absence of trailing bytes checked.

use std::io::Read;

use super::{
    FLAG_NEAR, FLAG_SCORES, MAGIC, MAX_PAYLOAD, TAG_END, TAG_RECORD, VERSION, crc, err, read_exact, record_at, u32_at,
};
use crate::error::Result;
use crate::trace::{TraceHeader, TraceRecord};

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
    pub(in crate::trace) fn into_input(self) -> R {
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
    pub(in crate::trace) fn resume(input: R, header: TraceHeader, version: u16, offset: u64, records: u64) -> Self {
        Self { input, header, version, offset, records, done: false, buf: Vec::new() }
    }
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
