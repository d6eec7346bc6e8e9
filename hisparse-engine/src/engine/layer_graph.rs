//! The device path's layer loop, with launch graphs: layer 0 is launched as usual (it also
//! refreshes the step's small arrays on the device) and its launch print, with the generation
//! of the per-layer input buffers, keys the launch sequence of layers 1..L. When the key is
//! the previous step's, that sequence is replayed as one captured graph; otherwise it is
//! captured now (recorded, not run) and then replayed. Layers differ from layer 0 only in their
//! own buffers (pools, inputs), which stay where they are, so equal keys mean the same work.
//!
//! Graphs are off for steps that read the device between layers (trace, dump-step, a batch
//! mixing requests shorter than top-k), and for the rest of the engine's life after a capture
//! fails (the layers then run eagerly, and a warning says why).

use hisparse_kernels::{Backend, DeviceSwapIn, KernelStage};

use super::Engine;
use super::step::{StepBatch, StepReport};
use crate::error::Result;

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Every layer of the step on the device path.
    pub(super) fn layers_device(&mut self, sb: &mut StepBatch<B::Memory>, rep: &mut StepReport) -> Result<()> {
        let layers = self.cfg.geometry.layers;
        let mut inputs = std::mem::take(&mut sb.inputs);
        let staged = self.stage_step_inputs(&mut inputs, &mut rep.metrics);
        sb.inputs = inputs;
        staged?;
        let graphs = self.cfg.launch_graphs
            && !self.graphs_failed
            && self.trace.is_none()
            && !self.capture_next
            && sb.long.len() == sb.reqs.len()
            && layers > 2;
        self.cache.backend.launch_print();
        self.launch_layer_device(0, sb, &mut rep.metrics)?;
        self.after_layer_device(0, sb, rep, true)?;
        let key = self.cache.backend.launch_print() ^ sb.inputs.generation.rotate_left(32) ^ layers as u64;
        let replayed = graphs && self.replay_or_capture(key, sb, rep)?;
        if !replayed {
            for l in 1..layers {
                self.launch_layer_device(l, sb, &mut rep.metrics)?;
                self.after_layer_device(l, sb, rep, true)?;
            }
            return self.pregenerate(&mut sb.inputs);
        }
        // The kernels run: meanwhile, the next step's inputs.
        self.pregenerate(&mut sb.inputs)?;
        rep.metrics.graph_replays += 1;
        if let Some(d) = self.dswap.as_mut() {
            d.note_replayed(layers);
        }
        // Every layer's outputs survive the replay where digests keep them per layer.
        let kept = !sb.layer_out.is_empty();
        for l in 1..layers {
            self.after_layer_device(l, sb, rep, kept || l + 1 == layers)?;
        }
        Ok(())
    }

    /// Replays the launches of layers 1..L kept under `key`, capturing them first when none
    /// are; `false` when nothing ran (the backend cannot capture, or the capture failed: graphs
    /// are then off for good and the caller launches the layers).
    fn replay_or_capture(&mut self, key: u64, sb: &mut StepBatch<B::Memory>, rep: &mut StepReport) -> Result<bool> {
        if replay_timed(&self.cache.backend, key)? {
            return Ok(true);
        }
        if !self.cache.backend.begin_capture()? {
            self.graphs_failed = true;
            return Ok(false);
        }
        let launched =
            (1..self.cfg.geometry.layers).try_for_each(|l| self.launch_layer_device(l, sb, &mut rep.metrics));
        let ended = self.cache.backend.end_capture(key).map_err(Into::into);
        if let Err(e) = launched.and(ended) {
            tracing::warn!("launch graph: capture failed ({e}); layers run one by one from now on");
            self.graphs_failed = true;
            return Ok(false);
        }
        rep.metrics.graph_captures += 1;
        if replay_timed(&self.cache.backend, key)? {
            return Ok(true);
        }
        tracing::warn!("launch graph: the capture kept nothing; layers run one by one from now on");
        self.graphs_failed = true;
        Ok(false)
    }
}

/// Replays what `backend` keeps under `key`, timed as the graph stage.
fn replay_timed<B: Backend>(backend: &B, key: u64) -> Result<bool> {
    backend.mark_stage(KernelStage::Graph, true)?;
    let r = backend.replay(key)?;
    backend.mark_stage(KernelStage::Graph, false)?;
    Ok(r)
}
