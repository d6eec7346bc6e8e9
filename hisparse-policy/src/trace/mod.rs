//! Traces of top-k selections: what a serving engine selected, per step, request and layer,
//! optionally with the indexer scores of the selected tokens and of the candidates ranked just
//! below the cut. The simulator replays them under any policy, prefetcher and buffer size.
//!
//! Version 2 (what this crate writes) adds to version 1 (still read) the model's layer
//! structure — which layers share another layer's selection (IndexShare) — and the near-cut
//! candidates (`near`: up to `score_margin` positions ranked below the cut, with their scores),
//! which next-step prefetch and score-aware policies use.
//!
//! Two forms, read by the same [`read_trace`]:
//!
//! * **binary** (`.hstrace`, compact, checksummed; specified byte by byte in [`binary`]),
//! * **JSON lines** (small, hand-written traces; specified in [`jsonl`]).
//!
//! Traces captured from another engine come in through [`import`] (a `[steps, layers, top_k]`
//! tensor of selected positions per request, safetensors or `.npy`).
//!
//! ```
//! use hisparse_policy::trace::{TraceHeader, TraceRecord, TraceWriter, TraceReader};
//! let header = TraceHeader { top_k: 2, layers: 1, row_bytes: 656, ..TraceHeader::default() };
//! let mut w = TraceWriter::new(Vec::new(), header.clone())?;
//! w.write(&TraceRecord { step: 1, request: 7, layer: 0, seq_len: 10, selected: vec![3, 9], ..TraceRecord::default() })?;
//! let bytes = w.finish()?;
//! let mut r = TraceReader::new(bytes.as_slice())?;
//! assert_eq!(r.next().unwrap()?.selected, vec![3, 9]);
//! assert!(r.next().is_none());
//! # Ok::<(), hisparse_policy::PolicyError>(())
//! ```

pub mod binary;
mod encoded;
pub mod import;
pub mod jsonl;
mod overlap;
pub mod parallel;
pub mod raw;
mod read;
mod skim;

pub use binary::{TraceReader, TraceWriter};
pub use encoded::{EncodedRecord, EncodedTrace, RecordHead};
pub use overlap::selection_overlap;
pub use read::{
    TraceData, read_trace, read_trace_described, read_trace_file_encoded, read_trace_file_with, read_trace_from,
    read_trace_from_encoded, read_trace_from_with,
};

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// What a whole trace shares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Most tokens a record may select.
    pub top_k: u32,
    /// Layers (records' `layer` is below this).
    pub layers: u32,
    /// Bytes of one KV row, for bytes-moved figures (0: unknown).
    pub row_bytes: u32,
    /// Whether every record carries the scores of its selected tokens.
    pub has_scores: bool,
    /// Most near-cut candidates a record may carry (0: records carry none). Version 2.
    #[serde(default)]
    pub score_margin: u32,
    /// Per layer, the layer whose selection it uses: itself for a layer that runs its own
    /// top-k (full), an earlier full layer for one that shares it (IndexShare). Empty: every
    /// layer is full. Version 2.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_source: Vec<u32>,
}

/// One (step, request, layer) selection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// The candidates ranked just below the cut, best first: `(position, score)`, at most the
    /// header's `score_margin`, none selected, scores not increasing. Present when the header's
    /// `score_margin > 0`. Version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near: Option<Vec<(u32, f32)>>,
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
        if self.score_margin > MAX_TOP_K {
            return Err(PolicyError::Trace {
                what: "corrupt header",
                offset: at,
                message: format!("score_margin = {}, expected 0..={MAX_TOP_K}", self.score_margin),
            });
        }
        if !self.index_source.is_empty() {
            if self.index_source.len() != self.layers as usize {
                return Err(PolicyError::Trace {
                    what: "corrupt header",
                    offset: at,
                    message: format!("{} layer sources for {} layers", self.index_source.len(), self.layers),
                });
            }
            for (l, &s) in self.index_source.iter().enumerate() {
                if s as usize > l || self.index_source[s as usize] != s {
                    return Err(PolicyError::Trace {
                        what: "corrupt header",
                        offset: at,
                        message: format!(
                            "layer {l} takes its selection from layer {s}, which is not an earlier full layer"
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The layer whose selection `layer` uses (itself when full).
    pub fn source_of(&self, layer: u32) -> u32 {
        self.index_source.get(layer as usize).copied().unwrap_or(layer)
    }

    /// Whether the header needs version 2 or later (layer structure or near-cut candidates).
    pub fn is_v2(&self) -> bool {
        self.score_margin > 0 || !self.index_source.is_empty()
    }
}

impl TraceRecord {
    /// Sets `scores` (the selected positions', in their order) and `near` (the `margin` best
    /// unselected positions with their scores, best first, ties to the lower position) from
    /// `all`, the scores of every position of the sequence.
    pub fn set_scores(&mut self, all: &[f32], margin: usize) {
        let score = |t: u32| all.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY);
        self.scores = Some(self.selected.iter().map(|&t| score(t)).collect());
        let near = crate::prefetch::near_cut(all, &self.selected, margin);
        self.near = Some(near.into_iter().map(|t| (t, score(t))).collect());
    }

    /// Checks the record against `header`; `at` is where it starts, for the error.
    pub fn check(&self, header: &TraceHeader, at: u64) -> Result<()> {
        let bad = |message: String| Err(PolicyError::Trace { what: "corrupt record", offset: at, message });
        self.check_head(header, at)?;
        if self.selected.len() > header.top_k as usize {
            return bad(format!("{} selected positions, top_k is {}", self.selected.len(), header.top_k));
        }
        // Branch-free over the whole list (it vectorises); the culprit is looked for only then.
        if !self.selected.windows(2).fold(true, |ok, w| ok & (w[0] < w[1]))
            && let Some(w) = self.selected.windows(2).find(|w| w[0] >= w[1])
        {
            return bad(format!("positions not strictly ascending ({} then {})", w[0], w[1]));
        }
        self.check_tail(header, at)
    }

    /// [`check`](Self::check) for a record whose positions are known to be strictly ascending
    /// and at most `top_k` (the binary reader's, by construction).
    pub(crate) fn check_decoded(&self, header: &TraceHeader, at: u64) -> Result<()> {
        self.check_head(header, at)?;
        self.check_tail(header, at)
    }

    fn check_head(&self, header: &TraceHeader, at: u64) -> Result<()> {
        let bad = |message: String| Err(PolicyError::Trace { what: "corrupt record", offset: at, message });
        if self.layer >= header.layers {
            return bad(format!("layer {} of a {}-layer trace", self.layer, header.layers));
        }
        if self.seq_len == 0 {
            return bad("seq_len 0: a sequence holds at least its newest token".into());
        }
        Ok(())
    }

    fn check_tail(&self, header: &TraceHeader, at: u64) -> Result<()> {
        let bad = |message: String| Err(PolicyError::Trace { what: "corrupt record", offset: at, message });
        check_last_position(&self.selected, self.seq_len, at)?;
        match (&self.scores, header.has_scores) {
            (Some(s), true) if s.len() == self.selected.len() => {}
            (None, false) => {}
            (s, _) => {
                return bad(format!(
                    "scores {} but the header says has_scores = {}",
                    s.as_ref().map_or("absent".to_string(), |s| format!("for {} positions", s.len())),
                    header.has_scores
                ));
            }
        }
        match (&self.near, header.score_margin) {
            (None, 0) => Ok(()),
            (Some(near), m) if m > 0 => self.check_near(near, m, at),
            (n, m) => bad(format!(
                "near-cut candidates {} but the header says score_margin = {m}",
                if n.is_some() { "present" } else { "absent" }
            )),
        }
    }

    fn check_near(&self, near: &[(u32, f32)], margin: u32, at: u64) -> Result<()> {
        let bad = |message: String| Err(PolicyError::Trace { what: "corrupt record", offset: at, message });
        if near.len() > margin as usize {
            return bad(format!("{} near-cut candidates, score_margin is {margin}", near.len()));
        }
        let mut seen: Vec<u32> = Vec::with_capacity(near.len());
        for (i, &(p, s)) in near.iter().enumerate() {
            if p >= self.seq_len {
                return bad(format!("near-cut position {p} of a sequence of {} tokens", self.seq_len));
            }
            if self.selected.binary_search(&p).is_ok() {
                return bad(format!("near-cut position {p} is also selected"));
            }
            if s.is_nan() {
                return bad(format!("near-cut position {p} has a NaN score"));
            }
            if i > 0 && s > near[i - 1].1 {
                return bad(format!("near-cut scores must not increase ({} then {s})", near[i - 1].1));
            }
            seen.push(p);
        }
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("near-cut position {} repeated", w[0]));
        }
        Ok(())
    }
}

/// Checks that the last of `selected` (ascending) is below `seq_len`, for a record at `at`.
pub(crate) fn check_last_position(selected: &[u32], seq_len: u32, at: u64) -> Result<()> {
    match selected.last() {
        Some(&p) if p >= seq_len => Err(PolicyError::Trace {
            what: "corrupt record",
            offset: at,
            message: format!("position {p} of a sequence of {seq_len} tokens"),
        }),
        _ => Ok(()),
    }
}

/// Bytes of decoded records a byte of a binary trace can become at most (a one-byte position
/// decodes to four; a record's fields and vectors stay below that per byte of its encoding):
/// what a caller multiplies a trace's size by to size the memory reading it takes.
pub const DECODED_PER_TRACE_BYTE: u64 = 4;
