//! Traces of top-k selections: what a serving engine selected, per step, request and layer,
//! optionally with the indexer scores of the selected tokens. The simulator replays them under
//! any policy and buffer size.
//!
//! Two forms, read by the same [`read_trace`]:
//!
//! * **binary** (`.hstrace`, compact, checksummed; specified byte by byte in [`binary`]),
//! * **JSON lines** (small, hand-written traces; specified in [`jsonl`]).
//!
//! ```
//! use hisparse_policy::trace::{TraceHeader, TraceRecord, TraceWriter, TraceReader};
//! let header = TraceHeader { top_k: 2, layers: 1, row_bytes: 656, has_scores: false };
//! let mut w = TraceWriter::new(Vec::new(), header)?;
//! w.write(&TraceRecord { step: 1, request: 7, layer: 0, seq_len: 10, selected: vec![3, 9], scores: None })?;
//! let bytes = w.finish()?;
//! let mut r = TraceReader::new(bytes.as_slice())?;
//! assert_eq!(r.next().unwrap()?.selected, vec![3, 9]);
//! assert!(r.next().is_none());
//! # Ok::<(), hisparse_policy::PolicyError>(())
//! ```

pub mod binary;
pub mod jsonl;
pub mod raw;

pub use binary::{TraceReader, TraceWriter};

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// What a whole trace shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Most tokens a record may select.
    pub top_k: u32,
    /// Layers (records' `layer` is below this).
    pub layers: u32,
    /// Bytes of one KV row, for bytes-moved figures (0: unknown).
    pub row_bytes: u32,
    /// Whether every record carries the scores of its selected tokens.
    pub has_scores: bool,
}

/// One (step, request, layer) selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// The request's decode step.
    pub step: u32,
    /// Request id.
    pub request: u64,
    /// Layer.
    pub layer: u32,
    /// Tokens in the sequence (the newest is `seq_len - 1`).
    pub seq_len: u32,
    /// Selected positions, strictly ascending, each below `seq_len`.
    pub selected: Vec<u32>,
    /// Indexer scores of the selected positions (same order), when the header says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores: Option<Vec<f32>>,
}

/// Largest `top_k` a trace may declare (real models select 2048).
pub const MAX_TOP_K: u32 = 1 << 20;
/// Most layers a trace may declare (real models have under 100).
pub const MAX_LAYERS: u32 = 1 << 12;

impl TraceHeader {
    /// Checks the header's counts (`at`: where it starts, for the error): `top_k` in
    /// `1..=MAX_TOP_K` and `layers` in `1..=MAX_LAYERS`.
    pub fn check(&self, at: u64) -> Result<()> {
        if !(1..=MAX_TOP_K).contains(&self.top_k) {
            return Err(PolicyError::Trace {
                what: "corrupt header",
                offset: at,
                message: format!("top_k = {}, expected 1..={MAX_TOP_K}", self.top_k),
            });
        }
        if !(1..=MAX_LAYERS).contains(&self.layers) {
            return Err(PolicyError::Trace {
                what: "corrupt header",
                offset: at,
                message: format!("layers = {}, expected 1..={MAX_LAYERS}", self.layers),
            });
        }
        Ok(())
    }
}

impl TraceRecord {
    /// Checks the record against `header`; `at` is where it starts, for the error.
    pub fn check(&self, header: &TraceHeader, at: u64) -> Result<()> {
        let bad = |message: String| Err(PolicyError::Trace { what: "corrupt record", offset: at, message });
        if self.layer >= header.layers {
            return bad(format!("layer {} of a {}-layer trace", self.layer, header.layers));
        }
        if self.seq_len == 0 {
            return bad("seq_len 0: a sequence holds at least its newest token".into());
        }
        if self.selected.len() > header.top_k as usize {
            return bad(format!("{} selected positions, top_k is {}", self.selected.len(), header.top_k));
        }
        if let Some(w) = self.selected.windows(2).find(|w| w[0] >= w[1]) {
            return bad(format!("positions not strictly ascending ({} then {})", w[0], w[1]));
        }
        if let Some(&p) = self.selected.last().filter(|&&p| p >= self.seq_len) {
            return bad(format!("position {p} of a sequence of {} tokens", self.seq_len));
        }
        match (&self.scores, header.has_scores) {
            (Some(s), true) if s.len() == self.selected.len() => Ok(()),
            (None, false) => Ok(()),
            (s, _) => bad(format!(
                "scores {} but the header says has_scores = {}",
                s.as_ref().map_or("absent".to_string(), |s| format!("for {} positions", s.len())),
                header.has_scores
            )),
        }
    }
}

/// Reads a whole trace file, binary or JSON lines (told apart by the first byte).
pub fn read_trace(path: &Path) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let io = |e: std::io::Error| PolicyError::Io { path: path.display().to_string(), message: e.to_string() };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = std::io::BufReader::new(file);
    let first = {
        use std::io::BufRead;
        reader.fill_buf().map_err(io)?.first().copied()
    };
    if first == Some(b'{') {
        jsonl::read(reader)
    } else {
        let mut r = TraceReader::new(reader)?;
        let header = *r.header();
        let records = r.by_ref().collect::<Result<Vec<_>>>()?;
        Ok((header, records))
    }
}
