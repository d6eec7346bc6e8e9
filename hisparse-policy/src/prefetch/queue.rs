//! `PrefetchQueue`: one request's prefetch state on a swap-in that runs on the host, in the
//! order this module's parent writes down (the simulator's): nominations queued after a
//! layer's selection, applied before their target layer's swap-in (this step) or after the
//! last layer (next step). The rows a nomination brings in are copied by the caller (its hot
//! buffers and host tier are its own), through the `copy` callback of
//! [`PrefetchQueue::apply`].

use hisparse_memory::KvGeometry;

use super::{Candidates, LayerSelection, Nomination, Prefetcher, When, budget_rows};
use crate::error::Result;
use crate::policy::{EvictionPolicy, StepCtx};
use crate::swap_in::{Nominated, PrefetchPlan, SwapInState, SwapInputs};

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

impl PrefetchCounts {
    /// Adds `o` field by field.
    pub fn add(&mut self, o: PrefetchCounts) {
        self.rows += o.rows;
        self.bytes += o.bytes;
        self.wasted += o.wasted;
    }
}

/// The `n` best positions of `scores` outside `selected` (ascending), best first (ties to the
/// lower position): the candidates ranked just below a top-k cut.
pub fn near_cut(scores: &[f32], selected: &[u32], n: usize) -> Vec<u32> {
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

/// Copies a nomination's `(token, slot)` fills of a layer host → device; returns the bytes.
pub type CopyFills<'a> = dyn FnMut(usize, &[(u32, u32)]) -> Result<usize> + 'a;

/// What a nomination needs to know about the request's step.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchStep {
    /// The request id (the policies' hooks see it).
    pub request: u64,
    /// The request's step (from 1).
    pub step: u32,
    /// Tokens this step, the newest included.
    pub seq_len: usize,
    /// Regular hot-buffer slots.
    pub device_buffer_size: usize,
}

/// A layer's selection as a prefetcher is asked after it ([`PrefetchQueue::nominate`]).
#[derive(Clone, Copy, Debug)]
pub struct LayerPicked<'a> {
    /// The layer.
    pub layer: usize,
    /// Its selected positions (ascending).
    pub selected: &'a [u32],
    /// The indexer's scores by position, for near-cut candidates.
    pub scores: Option<&'a [f32]>,
}

/// Which queued nominations [`PrefetchQueue::apply`] applies: those due `when` for `layer`
/// (every layer: `None`).
#[derive(Clone, Copy, Debug)]
pub struct Due {
    /// The target layer, or every layer.
    pub layer: Option<usize>,
    /// This step (before the target's swap-in) or the next (after the last layer).
    pub when: When,
}

/// One request's queued nominations and this step's selections.
#[derive(Clone, Debug, Default)]
pub struct PrefetchQueue {
    pending: Vec<Pending>,
    /// This step's selection per layer (next-step nominations protect their target's).
    selections: Vec<Vec<u32>>,
}

impl PrefetchQueue {
    /// Asks `prefetcher` after a layer's selection (`picked`) and queues its nominations;
    /// `budget` is the configured per-buffer row budget.
    pub fn nominate(
        &mut self,
        prefetcher: &dyn Prefetcher,
        g: &KvGeometry,
        budget: usize,
        step: PrefetchStep,
        picked: LayerPicked<'_>,
    ) {
        let LayerPicked { layer: l, selected: sel, scores } = picked;
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
            step: step.step,
            seq_len: step.seq_len,
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

    /// Applies the nominations `due` to the request's swap-in states `swap` (one per layer);
    /// `copy(layer, fills)` copies each nomination's `(token, slot)` fills host → device and
    /// returns the bytes it moved. `scores` for score-aware policies' hooks.
    pub fn apply(
        &mut self,
        due: Due,
        policy: &dyn EvictionPolicy,
        step: PrefetchStep,
        scores: Option<&[f32]>,
        swap: &mut [SwapInState],
        copy: &mut CopyFills<'_>,
    ) -> Result<PrefetchCounts> {
        let Due { layer: l, when } = due;
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
                step: step.step,
                layer: p.target as u32,
                request: step.request,
                device_buffer_size: step.device_buffer_size as u32,
                seed: policy.seed(),
            };
            let inputs = SwapInputs { next_use: None, scores };
            let Some(state) = swap.get_mut(p.target) else { continue };
            let nominated = Nominated { candidates: &p.candidates, protect: &protect, budget: p.budget };
            state.prefetch(policy, nominated, step.seq_len, &ctx, inputs, &mut plan)?;
            let bytes = copy(p.target, &plan.fills)?;
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
