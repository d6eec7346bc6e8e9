//! The real selections as trace records: an observer for [`Llama::teacher_forced`] that turns
//! every layer's selections into [`TraceRecord`]s (step by step, request ids as the batch's),
//! for the simulator and for trace files.
//!
//! [`Llama::teacher_forced`]: crate::Llama::teacher_forced

use hisparse_engine::{EmulatedDevice, KvGeometry, LayerView};
use hisparse_policy::trace::{TraceHeader, TraceRecord};

use crate::error::Result;

/// Collects the records of a run; `step` counts from 0 at the first decode step.
#[derive(Debug, Default)]
pub struct SelectionRecorder {
    /// The records so far.
    pub records: Vec<TraceRecord>,
    step: Option<u32>,
}

impl SelectionRecorder {
    /// The header of a trace of `geometry`'s selections (rows of `row_bytes`).
    pub fn header(geometry: &KvGeometry, row_bytes: usize) -> TraceHeader {
        TraceHeader {
            top_k: geometry.top_k as u32,
            layers: geometry.layers as u32,
            row_bytes: row_bytes as u32,
            ..TraceHeader::default()
        }
    }

    /// Records layer `layer`'s selections (a new step begins at layer 0).
    pub fn observe(&mut self, layer: usize, view: &LayerView<'_, EmulatedDevice>) -> Result<()> {
        if layer == 0 {
            self.step = Some(self.step.map_or(0, |s| s + 1));
        }
        let step = self.step.unwrap_or(0);
        for (i, (q, s)) in view.requests.iter().zip(view.spans).enumerate() {
            self.records.push(TraceRecord {
                step,
                request: i as u64,
                layer: layer as u32,
                seq_len: q.seq_len as u32,
                selected: view.selections[s.offset..s.end()].to_vec(),
                ..TraceRecord::default()
            });
        }
        Ok(())
    }
}
