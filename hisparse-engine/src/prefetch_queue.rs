//! One request's prefetch state on the host swap-in path, in the order
//! `hisparse_policy::prefetch` writes down (the simulator's): nominations queued after a layer's
//! selection, applied before their target layer's swap-in (this step) or after the last layer
//! (next step), rows copied host → device like misses. The engine's host path keeps one per
//! running request.

use hisparse_memory::{DeviceMemory, DeviceTier, HostTier, KvGeometry, RequestId};
use hisparse_policy::prefetch::{Candidates, LayerSelection, Nomination, Prefetcher, When, budget_rows};
use hisparse_policy::{EvictionPolicy, PrefetchPlan, StepCtx, SwapInState, SwapInputs, copy_rows};

use crate::error::Result;

/// A nomination waiting for its target.
#[derive(Clone, Debug)]
struct Pending {
    target: usize,
    when: When,
    candidates: Vec<u32>,
    budget: usize,
}

/// What applying nominations moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchCounts {
    /// Rows brought in.
    pub rows: u64,
    /// Bytes copied host → device.
    pub bytes: u64,
    /// Prefetched rows evicted unused by these prefetches.
    pub wasted: u64,
}

impl crate::metrics::StepMetrics {
    /// Counts what applying nominations moved.
    pub(crate) fn add_prefetch(&mut self, c: PrefetchCounts) {
        self.bytes_h2d += c.bytes;
        self.bytes_h2d_prefetch += c.bytes;
        self.prefetched += c.rows;
        self.prefetch_wasted += c.wasted;
    }
}

impl PrefetchCounts {
    fn add(&mut self, o: PrefetchCounts) {
        self.rows += o.rows;
        self.bytes += o.bytes;
        self.wasted += o.wasted;
    }
}

/// The `n` best positions of `scores` outside `selected` (ascending), best first.
pub(crate) fn near_cut(scores: &[f32], selected: &[u32], n: usize) -> Vec<u32> {
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

/// Where a request's nominations land: its id, swap-in states (one per layer), and the tiers.
pub(crate) struct PrefetchTarget<'a, M: DeviceMemory> {
    pub id: RequestId,
    pub swap: &'a mut [SwapInState],
    pub host: &'a HostTier,
    pub device: &'a mut DeviceTier<M>,
}

/// One request's queued nominations and this step's selections.
#[derive(Clone, Debug, Default)]
pub(crate) struct PrefetchQueue {
    pending: Vec<Pending>,
    /// This step's selection per layer (next-step nominations protect their target's).
    selections: Vec<Vec<u32>>,
}

/// What a nomination needs to know about the step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepView {
    /// The request's step (from 1).
    pub step: u32,
    /// Tokens this step, the newest included.
    pub seq_len: usize,
    /// Regular hot-buffer slots.
    pub buffer_slots: usize,
}

impl PrefetchQueue {
    /// Asks `prefetcher` after layer `l`'s selection `sel` (`scores`: the indexer's, for
    /// near-cut candidates) and queues its nominations.
    #[allow(clippy::too_many_arguments)] // the step's facts, each a plain value
    pub fn nominate(
        &mut self,
        prefetcher: &dyn Prefetcher,
        g: &KvGeometry,
        budget: usize,
        view: StepView,
        l: usize,
        sel: &[u32],
        scores: Option<&[f32]>,
    ) {
        if prefetcher.name() == "none" {
            return;
        }
        let budget = budget_rows(budget, g.top_k);
        let near = match scores {
            Some(s) if prefetcher.needs_near() => near_cut(s, sel, budget),
            _ => Vec::new(),
        };
        if self.selections.len() != g.layers {
            self.selections.resize(g.layers, Vec::new());
        }
        self.selections[l].clear();
        self.selections[l].extend_from_slice(sel);
        let sources: Vec<u32> = (0..g.layers).map(|x| g.index_source(x) as u32).collect();
        let ls = LayerSelection {
            layer: l as u32,
            layers: g.layers as u32,
            step: view.step,
            seq_len: view.seq_len,
            top_k: g.top_k,
            selected: sel,
            near: &near,
            index_source: &sources,
        };
        let mut noms: Vec<Nomination> = Vec::new();
        prefetcher.nominate(&ls, &mut noms);
        for n in noms {
            let target = n.target as usize;
            if target >= g.layers || (n.when == When::ThisStep && target <= l) {
                continue;
            }
            let candidates = match n.candidates {
                Candidates::Selection => sel.to_vec(),
                Candidates::Near => near.clone(),
            };
            self.pending.push(Pending { target, when: n.when, candidates, budget: n.budget });
        }
    }

    /// Applies the nominations due `when` for layer `l` (every layer: `None`), bringing their
    /// rows into `to`'s hot buffers; `scores` for score-aware policies' hooks.
    pub fn apply<M: DeviceMemory>(
        &mut self,
        l: Option<usize>,
        when: When,
        policy: &dyn EvictionPolicy,
        view: StepView,
        scores: Option<&[f32]>,
        to: PrefetchTarget<'_, M>,
    ) -> Result<PrefetchCounts> {
        let mut counts = PrefetchCounts::default();
        if self.pending.is_empty() {
            return Ok(counts);
        }
        let (due, rest): (Vec<Pending>, Vec<Pending>) =
            self.pending.drain(..).partition(|p| p.when == when && l.is_none_or(|l| p.target == l));
        self.pending = rest;
        let mut plan = PrefetchPlan::default();
        for p in due {
            // Protected: the candidates, and at the step's end the target's selection this step.
            let mut protect = p.candidates.clone();
            if when == When::NextStep {
                protect.extend(self.selections.get(p.target).into_iter().flatten());
            }
            protect.sort_unstable();
            protect.dedup();
            let ctx = StepCtx {
                step: view.step,
                layer: p.target as u32,
                request: to.id.0,
                buffer_slots: view.buffer_slots as u32,
                seed: policy.seed(),
            };
            let inputs = SwapInputs { next_use: None, scores };
            let Some(swap) = to.swap.get_mut(p.target) else { continue };
            swap.prefetch(policy, &p.candidates, view.seq_len, &ctx, &protect, p.budget, inputs, &mut plan)?;
            let bytes = copy_rows(&plan.fills, to.host, to.device, to.id, p.target)?;
            counts.add(PrefetchCounts {
                rows: plan.fills.len() as u64,
                bytes: bytes as u64,
                wasted: plan.wasted as u64,
            });
        }
        Ok(counts)
    }

    /// At the step's end: this-step nominations never served (a target past the last layer) are
    /// dropped.
    pub fn end_step(&mut self) {
        self.pending.retain(|p| p.when == When::NextStep);
    }
}
