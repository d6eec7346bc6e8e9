//! Prefetch on the host path through each request's [`PrefetchQueue`]: before a layer's
//! swap-in, the nominations made for it earlier this step are applied; after its selection, the
//! prefetcher nominates; after the last layer, next-step nominations are applied.

use hisparse_kernels::Backend;
use hisparse_memory::DeviceMemory;
use hisparse_policy::EvictionPolicy;
use hisparse_policy::prefetch::When;

use super::Engine;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;
use crate::prefetch_queue::{PrefetchTarget, StepView};

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    fn view(&self, i: usize) -> StepView {
        let r = &self.running[i];
        StepView {
            step: r.generated as u32 + 1,
            seq_len: r.seq_len + 1,
            buffer_slots: self.cfg.hisparse.device_buffer_size,
        }
    }

    /// Applies running request `i`'s pending nominations `when` for layer `l` (all layers at the
    /// end of a step), copying the rows they bring in.
    pub(super) fn apply_prefetch(
        &mut self,
        i: usize,
        l: Option<usize>,
        when: When,
        policy: &dyn EvictionPolicy,
        scores: Option<&[f32]>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let view = self.view(i);
        let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
        let r = &mut self.running[i];
        let to = PrefetchTarget { id: r.spec.id, swap: &mut r.swap, host, device: &mut self.device };
        let c = r.prefetch.apply(l, when, policy, view, scores, to)?;
        m.bytes_h2d += c.bytes;
        m.bytes_h2d_prefetch += c.bytes;
        m.prefetched += c.rows;
        m.prefetch_wasted += c.wasted;
        Ok(())
    }

    /// Asks the prefetcher after running request `i`'s layer-`l` selection `sel` (`scores`: its
    /// indexer scores this step) and queues the nominations.
    pub(super) fn nominate(&mut self, i: usize, l: usize, sel: &[u32], scores: Option<&[f32]>) {
        let view = self.view(i);
        let (g, budget) = (&self.cfg.geometry, self.cfg.hisparse.prefetch_budget);
        self.running[i].prefetch.nominate(self.prefetcher.as_ref(), g, budget, view, l, sel, scores);
    }

    /// After the last layer: every running request's next-step nominations (host path).
    pub(super) fn prefetch_next_step(
        &mut self,
        policy: &dyn EvictionPolicy,
        sb: &super::step::StepBatch<B::Memory>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        if self.cfg.mode != hisparse_memory::Mode::HiSparse || self.prefetcher.name() == "none" {
            return Ok(());
        }
        // Scores of the last full layer, for score-aware policies' hooks.
        let scores = if policy.needs_scores() { Some(self.backend.memory().download(&sb.scores)?) } else { None };
        for i in 0..self.running.len() {
            let off = sb.reqs[i].score_offset;
            let own = scores.as_ref().and_then(|s| s.get(off..off + sb.reqs[i].seq_len));
            self.apply_prefetch(i, None, When::NextStep, policy, own, m)?;
            self.running[i].prefetch.end_step();
        }
        Ok(())
    }
}
