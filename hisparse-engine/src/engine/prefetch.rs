//! Prefetch on the host path, in the order `hisparse_policy::prefetch` writes down (the
//! simulator's): before a layer's swap-in, the nominations made for it earlier this step are
//! applied; after its selection, the prefetcher nominates; after the last layer, next-step
//! nominations are applied. Rows brought in are copied host → device like misses, off the
//! critical path of the layer they serve.

use hisparse_kernels::Backend;
use hisparse_memory::DeviceMemory;
use hisparse_policy::prefetch::{Candidates, LayerSelection, Nomination, When, budget_rows};
use hisparse_policy::{EvictionPolicy, PrefetchPlan, StepCtx, SwapInputs, copy_rows};

use super::Engine;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;

/// A nomination waiting for its target.
#[derive(Clone, Debug)]
pub(crate) struct Pending {
    target: usize,
    when: When,
    candidates: Vec<u32>,
    budget: usize,
}

/// The `n` best positions of `scores` outside `selected` (ascending), best first.
fn near_cut(scores: &[f32], selected: &[u32], n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..scores.len() as u32).filter(|t| selected.binary_search(t).is_err()).collect();
    let by = |a: &u32, b: &u32| scores[*b as usize].total_cmp(&scores[*a as usize]).then(a.cmp(b));
    let n = n.min(order.len());
    if n > 0 && n < order.len() {
        order.select_nth_unstable_by(n - 1, by);
    }
    order.truncate(n);
    order.sort_unstable_by(by);
    order
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
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
        let r = &mut self.running[i];
        if r.prefetch.is_empty() {
            return Ok(());
        }
        let (due, rest): (Vec<Pending>, Vec<Pending>) =
            r.prefetch.drain(..).partition(|p| p.when == when && l.is_none_or(|l| p.target == l));
        r.prefetch = rest;
        let (id, n) = (r.spec.id, r.seq_len + 1);
        let mut plan = PrefetchPlan::default();
        for p in due {
            let r = &mut self.running[i];
            // Protected: the candidates, and at the step's end the target's selection this step.
            let mut protect = p.candidates.clone();
            if when == When::NextStep {
                protect.extend(r.selections.get(p.target).into_iter().flatten());
            }
            protect.sort_unstable();
            protect.dedup();
            let ctx = StepCtx {
                step: r.generated as u32 + 1,
                layer: p.target as u32,
                request: id.0,
                buffer_slots: self.cfg.hisparse.device_buffer_size as u32,
                seed: policy.seed(),
            };
            let inputs = SwapInputs { next_use: None, scores };
            r.swap[p.target].prefetch(policy, &p.candidates, n, &ctx, &protect, p.budget, inputs, &mut plan)?;
            let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
            let bytes = copy_rows(&plan.fills, host, &mut self.device, id, p.target)?;
            m.bytes_h2d += bytes as u64;
            m.bytes_h2d_prefetch += bytes as u64;
            m.prefetched += plan.fills.len() as u64;
            m.prefetch_wasted += plan.wasted as u64;
        }
        Ok(())
    }

    /// Asks the prefetcher after running request `i`'s layer-`l` selection `sel` (`scores`: its
    /// indexer scores this step, for prefetchers that rank near-cut candidates) and queues the
    /// nominations.
    pub(super) fn nominate(&mut self, i: usize, l: usize, sel: &[u32], scores: Option<&[f32]>) {
        if self.prefetcher.name() == "none" {
            return;
        }
        let g = &self.cfg.geometry;
        let budget = budget_rows(self.cfg.hisparse.prefetch_budget, g.top_k);
        let near = match scores {
            Some(s) if self.prefetcher.needs_near() => near_cut(s, sel, budget),
            _ => Vec::new(),
        };
        let sources: Vec<u32> = (0..g.layers).map(|x| g.index_source(x) as u32).collect();
        let r = &mut self.running[i];
        if r.selections.len() != g.layers {
            r.selections.resize(g.layers, Vec::new());
        }
        r.selections[l].clear();
        r.selections[l].extend_from_slice(sel);
        let view = LayerSelection {
            layer: l as u32,
            layers: g.layers as u32,
            step: r.generated as u32 + 1,
            seq_len: r.seq_len + 1,
            top_k: g.top_k,
            selected: sel,
            near: &near,
            index_source: &sources,
        };
        let mut noms: Vec<Nomination> = Vec::new();
        self.prefetcher.nominate(&view, &mut noms);
        for n in noms {
            let target = n.target as usize;
            if target >= g.layers || (n.when == When::ThisStep && target <= l) {
                continue;
            }
            let candidates = match n.candidates {
                Candidates::Selection => sel.to_vec(),
                Candidates::Near => near.clone(),
            };
            self.running[i].prefetch.push(Pending { target, when: n.when, candidates, budget: n.budget });
        }
    }
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
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
            // This-step nominations never served (a target past the last layer) are dropped.
            self.running[i].prefetch.retain(|p| p.when == When::NextStep);
        }
        Ok(())
    }
}
