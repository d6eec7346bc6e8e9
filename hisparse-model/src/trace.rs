//! The real selections as trace records: an observer of a decode step's layers (through
//! [`Llama::teacher_forced`] or a [`ModelServer`]) that turns every layer's selections into
//! [`TraceRecord`]s, and, with a score margin, the oracle's scores of the selected positions and
//! of the candidates just below the cut (a scored trace, version 3: what `next-step` prefetch reads).
//!
//! [`Llama::teacher_forced`]: crate::Llama::teacher_forced
//! [`ModelServer`]: crate::ModelServer

use hisparse_engine::{EmulatedDevice, KvGeometry, LayerView, RequestId};
use hisparse_policy::trace::{MAX_TOP_K, TraceHeader, TraceRecord};

use crate::error::{ModelError, Result};

/// Collects the records of a run; `step` counts from 0 at the first decode step.
#[derive(Debug, Default)]
pub struct SelectionRecorder {
    /// The records so far.
    pub records: Vec<TraceRecord>,
    step: Option<u32>,
    margin: usize,
    batch: Option<Vec<RequestId>>,
}

impl SelectionRecorder {
    /// A recorder that also keeps the scores: the selected positions' and the `margin` best
    /// unselected ones' (0: selections only). A margin past what a trace holds
    /// ([`MAX_TOP_K`]) is refused.
    pub fn with_scores(margin: usize) -> Result<Self> {
        if margin > MAX_TOP_K as usize {
            return Err(ModelError::invalid("margin", margin, format!("a trace keeps at most {MAX_TOP_K} candidates")));
        }
        Ok(Self { margin, ..Self::default() })
    }

    /// The header of a trace of `geometry`'s selections (rows of `row_bytes`), with this
    /// recorder's scores.
    pub fn trace_header(&self, geometry: &KvGeometry, row_bytes: usize) -> TraceHeader {
        TraceHeader {
            has_scores: self.margin > 0,
            score_margin: self.margin as u32,
            ..Self::header(geometry, row_bytes)
        }
    }

    /// The header of a trace of `geometry`'s selections alone (rows of `row_bytes`).
    pub fn header(geometry: &KvGeometry, row_bytes: usize) -> TraceHeader {
        TraceHeader {
            top_k: geometry.top_k as u32,
            layers: geometry.layers as u32,
            row_bytes: row_bytes as u32,
            ..TraceHeader::default()
        }
    }

    /// Names the requests of the coming steps' batch (by default request `i` is the batch's
    /// `i`-th).
    pub fn set_batch(&mut self, batch: &[RequestId]) {
        self.batch = Some(batch.to_vec());
    }

    /// Records layer `layer`'s selections (a new step begins at layer 0).
    pub fn observe(&mut self, layer: usize, view: &LayerView<'_, EmulatedDevice>) -> Result<()> {
        if layer == 0 {
            self.step = Some(self.step.map_or(0, |s| s + 1));
        }
        let step = self.step.unwrap_or(0);
        for (i, (q, s)) in view.requests.iter().zip(view.spans).enumerate() {
            let request = match &self.batch {
                Some(b) => b.get(i).ok_or_else(|| ModelError::invalid("batch", b.len(), "shorter than the step's"))?.0,
                None => i as u64,
            };
            let mut r = TraceRecord {
                step,
                request,
                layer: layer as u32,
                seq_len: q.seq_len as u32,
                selected: view.selections[s.offset..s.end()].to_vec(),
                ..TraceRecord::default()
            };
            if self.margin > 0 {
                let all = view.scores.get(q.score_offset..q.score_offset + q.seq_len).ok_or_else(|| {
                    ModelError::invalid("scores", view.scores.len(), "shorter than the batch's positions")
                })?;
                r.set_scores(all, self.margin);
            }
            self.records.push(r);
        }
        Ok(())
    }
}
