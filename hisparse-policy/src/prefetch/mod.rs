//! Prefetchers: rules that, once a layer's top-k selection is known, nominate positions to bring
//! into a later layer's hot buffer (this step) or into a buffer for the next step, before that
//! buffer's own selection is known, so their rows cross the bus off the critical path.
//!
//! A prefetcher only nominates; the swap-in's prefetch ([`SwapInState::prefetch`]) brings rows
//! in under the eviction policy's rule. The replay order, shared by the simulator and the
//! engine, for one request and step:
//!
//! 1. Layers run in ascending order. Before layer `l`'s swap-in, the nominations made earlier
//!    this step for `l` ([`When::ThisStep`]) are applied in the order they were made.
//! 2. After layer `l`'s selection is known, the prefetcher is asked ([`Prefetcher::nominate`]).
//!    A [`When::ThisStep`] nomination must target a later layer.
//! 3. After the last layer, the [`When::NextStep`] nominations are applied.
//!
//! A nomination is applied with a row budget and a protected set: its own candidates, plus, for
//! a [`When::NextStep`] nomination (applied after the last layer), the target layer's selection
//! this step. Prefetch
//! never evicts a protected token and never changes what attention reads: every selected token
//! is resident when its layer runs, whatever was prefetched.
//!
//! Built-ins ([`BuiltinPrefetcher`]): `none`, `shared-index` (exact: a shared layer gets its full
//! layer's selection as soon as it is known), `adjacent-layer` (speculative: layer `l`'s
//! selection into layer `l + 1`), `next-step` (the candidates ranked just below the cut, for the
//! same layer next step). Each has a CUDA form ([`cuda`]).
//!
//! [`SwapInState::prefetch`]: crate::swap_in::SwapInState::prefetch

pub mod cuda;
mod queue;
mod registry;

pub use queue::{CopyFills, Due, LayerPicked, PrefetchCounts, PrefetchQueue, PrefetchStep, near_cut};

pub use registry::{
    BuiltinPrefetcher, MakePrefetcher, PREFETCHER_NAMES, PrefetcherConfig, PrefetcherSpec, make_prefetcher,
    prefetcher_by_name, prefetcher_specs, register_prefetcher,
};

use std::borrow::Cow;

/// A layer's selection this step, as a prefetcher sees it (same fields as the CUDA
/// `PrefetchSource`).
#[derive(Clone, Copy, Debug)]
pub struct LayerSelection<'a> {
    /// The layer whose selection is known.
    pub layer: u32,
    /// Layers of the model.
    pub layers: u32,
    /// The request's step.
    pub step: u32,
    /// Tokens in the sequence.
    pub seq_len: usize,
    /// Top-k of the model.
    pub top_k: usize,
    /// The selection, ascending.
    pub selected: &'a [u32],
    /// The candidates ranked just below the cut, best first (empty when unknown).
    pub near: &'a [u32],
    /// Per layer, the layer whose selection it uses (empty: every layer full).
    pub index_source: &'a [u32],
}

impl LayerSelection<'_> {
    /// The layer whose selection `layer` uses.
    pub fn source_of(&self, layer: u32) -> u32 {
        self.index_source.get(layer as usize).copied().unwrap_or(layer)
    }
}

/// When a nomination is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Before the target layer's swap-in this step (the target must come later).
    ThisStep,
    /// At the end of this step, for the next.
    NextStep,
}

/// What a nomination brings in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidates {
    /// The source layer's selection.
    Selection,
    /// The source's near-cut candidates.
    Near,
}

/// One nomination: up to `budget` of the `candidates` into `target`'s buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nomination {
    /// The layer whose buffer receives the rows.
    pub target: u32,
    /// When.
    pub when: When,
    /// Which positions, in order of preference.
    pub candidates: Candidates,
    /// Most rows brought in.
    pub budget: usize,
}

/// A prefetcher. See the module documentation for when it is asked and how its nominations
/// are applied.
pub trait Prefetcher: Send + Sync + std::fmt::Debug {
    /// The name used in configs and on the command line.
    fn name(&self) -> &str;

    /// Nominations after `sel.layer`'s selection is known (appended to `out`).
    fn nominate(&self, sel: &LayerSelection<'_>, out: &mut Vec<Nomination>);

    /// Whether it reads near-cut candidates (the callers then supply them).
    fn needs_near(&self) -> bool {
        false
    }

    /// Whether a nomination may target another layer (then layers are replayed together).
    fn crosses_layers(&self) -> bool {
        false
    }

    /// The same rule in CUDA C (see [`cuda`]), or `None` for one that cannot run on the GPU.
    fn cuda(&self) -> Option<Cow<'static, str>>;
}

/// Prefetches nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPrefetch;

impl Prefetcher for NoPrefetch {
    fn name(&self) -> &str {
        "none"
    }

    fn nominate(&self, _sel: &LayerSelection<'_>, _out: &mut Vec<Nomination>) {}

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Borrowed(include_str!("cuda/none.cuh")))
    }
}

/// Exact IndexShare prefetch: after a full layer's selection, every later layer that shares it
/// gets the whole selection at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedIndex;

impl Prefetcher for SharedIndex {
    fn name(&self) -> &str {
        "shared-index"
    }

    fn nominate(&self, sel: &LayerSelection<'_>, out: &mut Vec<Nomination>) {
        if sel.source_of(sel.layer) != sel.layer {
            return;
        }
        for target in sel.layer + 1..sel.layers {
            if sel.source_of(target) == sel.layer {
                out.push(Nomination {
                    target,
                    when: When::ThisStep,
                    candidates: Candidates::Selection,
                    budget: sel.selected.len(),
                });
            }
        }
    }

    fn crosses_layers(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Borrowed(include_str!("cuda/shared_index.cuh")))
    }
}

/// Rows a budget of `budget` allows at top-k `top_k` (0: a quarter of top-k, at least one).
pub fn budget_rows(budget: usize, top_k: usize) -> usize {
    if budget == 0 { (top_k / 4).max(1) } else { budget }
}

/// Speculative cross-layer prefetch: layer `l`'s selection into layer `l + 1`, up to a budget
/// (adjacent DSA layers' selections overlap 70–100%).
#[derive(Clone, Copy, Debug)]
pub struct AdjacentLayer {
    /// Most rows per step and target layer (0: a quarter of top-k).
    pub budget: usize,
}

impl Prefetcher for AdjacentLayer {
    fn name(&self) -> &str {
        "adjacent-layer"
    }

    fn nominate(&self, sel: &LayerSelection<'_>, out: &mut Vec<Nomination>) {
        if sel.layer + 1 < sel.layers {
            out.push(Nomination {
                target: sel.layer + 1,
                when: When::ThisStep,
                candidates: Candidates::Selection,
                budget: budget_rows(self.budget, sel.top_k),
            });
        }
    }

    fn crosses_layers(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Owned(format!(
            "#define PREFETCH_BUDGET {}u\n{}",
            self.budget,
            include_str!("cuda/adjacent_layer.cuh")
        )))
    }
}

/// Next-step prefetch: the candidates ranked just below this step's cut, for the same layer at
/// the next step, up to a budget.
#[derive(Clone, Copy, Debug)]
pub struct NextStep {
    /// Most rows per step and layer (0: a quarter of top-k).
    pub budget: usize,
}

impl Prefetcher for NextStep {
    fn name(&self) -> &str {
        "next-step"
    }

    fn nominate(&self, sel: &LayerSelection<'_>, out: &mut Vec<Nomination>) {
        if !sel.near.is_empty() {
            out.push(Nomination {
                target: sel.layer,
                when: When::NextStep,
                candidates: Candidates::Near,
                budget: budget_rows(self.budget, sel.top_k),
            });
        }
    }

    fn needs_near(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Owned(format!("#define PREFETCH_BUDGET {}u\n{}", self.budget, include_str!("cuda/next_step.cuh"))))
    }
}

#[cfg(test)]
mod tests;
