//! Eviction policies: the narrow trait a policy implements (a fixed record per slot, two
//! scalars per request and layer, lifecycle hooks and a priority), the built-in policies, and
//! the CUDA C contract under which the same rule is spliced into the GPU swap-in kernel.
//!
//! # Semantics of one step (shared by the CPU swap-in and the GPU kernel)
//!
//! 1. Every regular slot whose token is selected is a *hit*; every selected token not resident
//!    is a *miss*. The newest token sits in the reserved slot and is a hit.
//! 2. Every other regular slot is *evictable*. Its key is `(occupied, priority, slot)`: empty
//!    slots first (in slot order), then occupied ones by [`EvictionPolicy::priority`] (lowest
//!    first), ties by slot index. Priorities are computed before any record changes.
//! 3. The `M` evictables with the smallest keys are the victims (`M` = misses). Misses, in
//!    ascending position order, take the victims in ascending slot order.
//! 4. Hooks, each touching only its own slot's record: `on_hit` for hits, `on_insert` for the
//!    slots just filled, `on_keep` for occupied evictables that were not victims (given the
//!    largest victim key). Then `finish_step` updates the two per-(request, layer) scalars.
//!
//! Because each hook touches its own slot, the order in which slots are processed does not
//! matter, which is what lets a GPU block run them in parallel and still match the CPU exactly.
//!
//! # The CUDA contract
//!
//! [`EvictionPolicy::cuda`] returns C++ defining, for the types of [`CUDA_PRELUDE`]:
//!
//! ```text
//! __device__ unsigned long long policy_priority(const SlotRecord&, unsigned slot, unsigned token,
//!                                               const PolicyScalars&, const StepCtx&);
//! __device__ void policy_on_hit(SlotRecord&, const StepCtx&);
//! __device__ void policy_on_insert(SlotRecord&, const StepCtx&);
//! __device__ void policy_on_keep(SlotRecord&, unsigned slot, const PolicyScalars&,
//!                                const VictimKey&, const StepCtx&);
//! __device__ void policy_finish(PolicyScalars&, const VictimKey&, const StepCtx&);
//! ```

mod belady;
mod clock;
mod fifo;
mod lru;
mod random;

pub use belady::Belady;
pub use clock::Clock;
pub use fifo::Fifo;
pub use lru::Lru;
pub use random::{Random, mix64};

use std::sync::Arc;

use crate::error::{PolicyError, Result};

/// The fixed record a policy keeps per regular slot; what the two words mean is the policy's.
/// Same layout (`struct SlotRecord { unsigned a, b; }`) on the GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotRecord {
    /// First word.
    pub a: u32,
    /// Second word.
    pub b: u32,
}

/// Two words of state per (request, layer) (e.g. CLOCK's hand).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PolicyScalars {
    /// First word.
    pub a: u32,
    /// Second word.
    pub b: u32,
}

/// What every hook knows about the step (same layout as the CUDA `StepCtx`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCtx {
    /// The request's decode step, counted from 1; never 0 in a hook.
    pub step: u32,
    /// Layer.
    pub layer: u32,
    /// Request id.
    pub request: u64,
    /// Regular slots of the buffer.
    pub buffer_slots: u32,
    /// The policy's seed (for randomised policies).
    pub seed: u64,
}

/// The key of the largest victim of a step, given to `on_keep` and `finish_step` (same layout
/// as the CUDA `VictimKey`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimKey {
    /// Whether there were any victims at all.
    pub any: bool,
    /// Whether the largest victim slot was occupied (else every victim was an empty slot).
    pub occupied: bool,
    /// Its priority (meaningful when occupied).
    pub priority: u64,
    /// Its slot.
    pub slot: u32,
}

/// An eviction policy. See the module documentation for when each hook runs.
pub trait EvictionPolicy: Send + Sync + std::fmt::Debug {
    /// The name used in configs (`lru`, `fifo`, ...).
    fn name(&self) -> &'static str;

    /// Eviction priority of an occupied evictable slot: lowest is evicted first. `next_use` is
    /// the step at which `token` is next selected (`u32::MAX`: never), given only to policies
    /// that [`need the future`](EvictionPolicy::needs_future).
    fn priority(
        &self,
        rec: &SlotRecord,
        slot: u32,
        token: u32,
        scalars: &PolicyScalars,
        ctx: &StepCtx,
        next_use: u32,
    ) -> u64;

    /// A slot whose token was selected again.
    fn on_hit(&self, _rec: &mut SlotRecord, _ctx: &StepCtx) {}

    /// A slot just filled with a missed token (also: every occupied slot, in slot order, when a
    /// buffer leaves the short-sequence fast path or the policy changes, with `ctx.step` one less).
    fn on_insert(&self, rec: &mut SlotRecord, ctx: &StepCtx);

    /// An occupied evictable slot that was not evicted.
    fn on_keep(
        &self,
        _rec: &mut SlotRecord,
        _slot: u32,
        _scalars: &PolicyScalars,
        _victim: &VictimKey,
        _ctx: &StepCtx,
    ) {
    }

    /// End of the step.
    fn finish_step(&self, _scalars: &mut PolicyScalars, _victim: &VictimKey, _ctx: &StepCtx) {}

    /// The seed that callers put into [`StepCtx::seed`] (randomised policies).
    fn seed(&self) -> u64 {
        0
    }

    /// Whether the policy needs each token's next use (an offline policy: simulator only).
    fn needs_future(&self) -> bool {
        false
    }

    /// The same rule in CUDA C (see the module documentation), or `None` for a policy that
    /// cannot run on the GPU.
    fn cuda(&self) -> Option<&'static str>;
}

/// Types every policy's CUDA snippet is compiled with.
pub const CUDA_PRELUDE: &str = r#"
struct SlotRecord { unsigned a; unsigned b; };
struct PolicyScalars { unsigned a; unsigned b; };
struct StepCtx { unsigned step; unsigned layer; unsigned long long request; unsigned buffer_slots; unsigned long long seed; };
struct VictimKey { bool any; bool occupied; unsigned long long priority; unsigned slot; };
"#;

/// Names of the built-in policies, online ones first.
pub const POLICY_NAMES: [&str; 5] = ["lru", "fifo", "random", "clock", "belady"];

/// The built-in policy named `name` (`seed` is used by `random`).
pub fn by_name(name: &str, seed: u64) -> Result<Arc<dyn EvictionPolicy>> {
    Ok(match name {
        "lru" => Arc::new(Lru),
        "fifo" => Arc::new(Fifo),
        "random" => Arc::new(Random::new(seed)),
        "clock" => Arc::new(Clock),
        "belady" => Arc::new(Belady),
        _ => return Err(PolicyError::UnknownPolicy { name: name.to_owned(), known: POLICY_NAMES.join(", ") }),
    })
}

/// Every built-in policy (`random` with `seed`).
pub fn builtin(seed: u64) -> Vec<Arc<dyn EvictionPolicy>> {
    POLICY_NAMES.iter().filter_map(|n| by_name(n, seed).ok()).collect()
}

#[cfg(test)]
mod tests;
