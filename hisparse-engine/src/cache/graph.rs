//! A step's remaining layers as one captured launch sequence: [`DecodeStep::run_captured`]
//! replays the sequence kept under a key, or captures it (recorded, not run) from the caller's
//! own loop over [`DecodeStep::layer`] — which may launch the caller's work between layers, such
//! as a model's GEMMs — and then replays it. The key is the caller's: the launch print of the
//! step's first layer (`Backend::launch_print`), which covers every buffer and value the later
//! layers share, with [`DecodeStep::generation`] and whatever of its own the caller's launches
//! read by address. The backup's stream is rejoined inside the capture, so the sequence is
//! complete when it ends.
//!
//! Invariant: a replayed sequence does what launching the layers would: the layers' host-side
//! bookkeeping runs on capture and is recorded as done on replay ([`DeviceSwapIn::note_replayed`]).
//!
//! [`DeviceSwapIn::note_replayed`]: hisparse_kernels::DeviceSwapIn::note_replayed

use hisparse_kernels::{Backend, DeviceSwapIn, KernelStage, RowBackup};

use super::step::DecodeStep;
use crate::error::Result;
use crate::metrics::StepMetrics;

/// What [`DecodeStep::run_captured`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Captured {
    /// The sequence kept under the key was replayed.
    Replayed,
    /// The layers were captured under the key, then replayed.
    CapturedAndReplayed,
    /// Nothing ran: the backend cannot capture, or the capture failed (the error is in the
    /// log); the caller launches the layers itself.
    NotCaptured,
}

impl<B: Backend> DecodeStep<'_, B>
where
    B::Memory: Clone,
{
    /// Runs layers `self.next_layer()..end` as the launch sequence kept under `key`, capturing
    /// it first from `launch` when none is kept (see the module documentation). `launch` must
    /// call [`DecodeStep::layer`] for exactly those layers, in order, and may launch its own
    /// work, but must not read the backend's memory back (a capture records, it does not run).
    pub fn run_captured<F>(&mut self, key: u64, end: usize, mut launch: F) -> Result<Captured>
    where
        F: FnMut(&mut Self) -> Result<()>,
    {
        let (start, layers) = (self.next_layer, self.cache.cfg.geometry.layers);
        if end > layers || end < start {
            return Err(crate::error::EngineError::Input {
                field: "end".into(),
                value: end.to_string(),
                reason: format!("the layers to run are {start}..{layers}"),
            });
        }
        // Prefetches queued on other streams before the sequence are waited for first (a
        // capture can wait only on work recorded inside it).
        if let Some(s) = self.cache.swap.as_mut() {
            s.settle()?;
        }
        if self.replay(key)? {
            self.note_replayed(end);
            return Ok(Captured::Replayed);
        }
        if !self.cache.backend.begin_capture()? {
            return Ok(Captured::NotCaptured);
        }
        let before: StepMetrics = self.metrics.clone();
        let launched = launch(self).and_then(|()| {
            if self.next_layer != end {
                return Err(crate::error::EngineError::Input {
                    field: "launch".into(),
                    value: self.next_layer.to_string(),
                    reason: format!("the captured loop must run layers {start}..{end}"),
                });
            }
            // The backup's and the prefetches' streams rejoin inside the capture (a capture
            // must end joined).
            if let Some(s) = self.cache.swap.as_mut() {
                s.settle()?;
            }
            match self.cache.backup.as_mut() {
                Some(bk) => Ok(bk.join()?),
                None => Ok(()),
            }
        });
        let ended = self.cache.backend.end_capture(key).map_err(Into::into);
        if let Err(e) = launched.and(ended) {
            tracing::warn!("launch graph: capture failed ({e}); the layers run one by one");
            // Nothing ran: the layers are the caller's to launch again.
            self.next_layer = start;
            self.metrics = before;
            self.failed = false;
            return Ok(Captured::NotCaptured);
        }
        self.metrics.graph_captures += 1;
        if self.replay(key)? {
            self.note_replayed(end);
            return Ok(Captured::CapturedAndReplayed);
        }
        tracing::warn!("launch graph: the capture kept nothing; the layers run one by one");
        self.next_layer = start;
        self.metrics = before;
        Ok(Captured::NotCaptured)
    }

    /// Replays what the backend keeps under `key`, timed as the graph stage.
    fn replay(&mut self, key: u64) -> Result<bool> {
        let t = std::time::Instant::now();
        let backend = &self.cache.backend;
        backend.mark_stage(KernelStage::Graph, true)?;
        let r = backend.replay(key)?;
        backend.mark_stage(KernelStage::Graph, false)?;
        if r {
            self.metrics.stages.graph += t.elapsed().as_secs_f64();
        }
        Ok(r)
    }

    fn note_replayed(&mut self, end: usize) {
        self.next_layer = end;
        self.viewed = None;
        self.metrics.graph_replays += 1;
        if let Some(s) = self.cache.swap.as_mut() {
            s.note_replayed(end);
        }
    }
}
