//! Eviction policies: the narrow trait a policy implements (a fixed record per slot, two
//! scalars per request and layer, optionally one word of history per token, lifecycle hooks and
//! a priority), the built-in policies (each in its own file, its CUDA form in `cuda/*.cuh`), the
//! registry that names them ([`registry`]), and the CUDA C contract under which the same rule is
//! spliced into the GPU swap-in kernel ([`cuda`]).
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
//! 4. Hooks, each touching only its own slot's record (and its tokens' words): `on_evict` for an
//!    occupied victim (it returns the evicted token's new word), then `on_insert` for the slot
//!    it refills; `on_hit` for hits; `on_keep` for occupied evictables that were not victims
//!    (given the largest victim key). Then `finish_step` updates the two per-(request, layer)
//!    scalars.
//!
//! Every hook sees one [`PolicyEnv`]: the step, the scalars, the largest victim, and for its
//! slot the token, the token's indexer score this step (NaN where unknown), its next use
//! (simulator only), whether a prefetch put it there, and its history word. A new input is a new
//! field of the environment, not a new argument of every hook.
//!
//! Because each hook touches its own slot, the order in which slots are processed does not
//! matter, which is what lets a GPU block run them in parallel and still match the CPU exactly.

mod belady;
mod clock;
pub mod cuda;
mod fifo;
mod lru;
mod mq;
mod random;
pub mod registry;
mod s3fifo;
mod score;

pub use belady::Belady;
pub use clock::Clock;
pub use fifo::Fifo;
pub use lru::Lru;
pub use mq::Mq;
pub use random::{Random, mix64};
pub use registry::{
    BuiltinPolicy, MakePolicy, POLICY_NAMES, PolicyConfig, PolicySpec, builtin, by_name, make, register, registered,
};
pub use s3fifo::S3Fifo;
pub use score::{ScoreAware, ScoreMix, score_key};

use std::borrow::Cow;

hisparse_memory::c_struct! {
    /// The fixed record a policy keeps per regular slot; what the two words mean is the policy's.
    /// Its C declaration is generated from this one (`c_layout`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SlotRecord {
        /// First word.
        pub a: u32,
        /// Second word.
        pub b: u32,
    }
}

hisparse_memory::c_struct! {
    /// Two words of state per (request, layer) (e.g. CLOCK's hand).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct PolicyScalars {
        /// First word.
        pub a: u32,
        /// Second word.
        pub b: u32,
    }
}

hisparse_memory::c_struct! {
    /// What every hook knows about the step (the CUDA `StepCtx` is generated from it).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct StepCtx {
        /// The request's decode step, counted from 1; never 0 in a hook.
        pub step: u32,
        /// Layer.
        pub layer: u32,
        /// Request id.
        pub request: u64,
        /// Regular slots of the buffer.
        pub device_buffer_size: u32,
        /// The policy's seed (for randomised policies).
        pub seed: u64,
    }
}

hisparse_memory::c_struct! {
    /// The key of the largest victim of a step, given to `on_keep` and `finish_step` (same layout
    /// as the CUDA `VictimKey`, generated from it).
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
}

hisparse_memory::c_struct! {
    /// Everything a hook sees (the CUDA `PolicyEnv` is generated from it). Step-wide fields are the same
    /// for every hook of a step; slot fields describe the hook's own slot (for `finish_step`, zero).
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub struct PolicyEnv {
        /// The step.
        pub ctx: StepCtx,
        /// The (request, layer)'s scalars as they were before the step's hooks.
        pub scalars: PolicyScalars,
        /// The step's largest victim (`any == false` in `priority` and when there were no misses).
        pub victim: VictimKey,
        /// The slot.
        pub slot: u32,
        /// Its token (for `on_insert`, the token that fills it; for `on_evict`, the one leaving).
        pub token: u32,
        /// The step at which the token is next selected (`u32::MAX`: never or unknown); given only
        /// to policies that need the future (simulator).
        pub next_use: u32,
        /// The token's indexer score this step (NaN where unknown); given only to policies that
        /// need scores.
        pub score: f32,
        /// 1 when a prefetch filled the slot and no selection has used it since, else 0.
        pub prefetched: u32,
        /// The token's history word (0 until a policy sets one; policies that use them only).
        pub token_word: u32,
    }
}

impl Default for PolicyEnv {
    fn default() -> Self {
        Self {
            ctx: StepCtx::default(),
            scalars: PolicyScalars::default(),
            victim: VictimKey::default(),
            slot: 0,
            token: 0,
            next_use: u32::MAX,
            score: f32::NAN,
            prefetched: 0,
            token_word: 0,
        }
    }
}

impl PolicyEnv {
    /// The environment of `ctx` with `scalars` and no slot.
    pub fn of(ctx: &StepCtx, scalars: PolicyScalars) -> Self {
        Self { ctx: *ctx, scalars, ..Self::default() }
    }
}

/// A policy whose priority is a step stamp (see [`EvictionPolicy::stamp_rule`]): `(mul, add)`
/// pairs giving record word `a = mul * step + add`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StampRule {
    /// Set by `on_insert`.
    pub on_insert: (u32, u32),
    /// Set by `on_hit`; `None`: hits leave the record alone.
    pub on_hit: Option<(u32, u32)>,
}

impl StampRule {
    /// The stamp of `rule` at `step` (wrapping, as the hooks compute it).
    pub fn at((mul, add): (u32, u32), step: u32) -> u32 {
        step.wrapping_mul(mul).wrapping_add(add)
    }
}

/// An eviction policy. See the module documentation for when each hook runs.
pub trait EvictionPolicy: Send + Sync + std::fmt::Debug {
    /// The name used in configs (`lru`, `fifo`, ...).
    fn name(&self) -> &str;

    /// Eviction priority of an occupied evictable slot: lowest is evicted first.
    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64;

    /// A slot whose token was selected again.
    fn on_hit(&self, _rec: &mut SlotRecord, _env: &PolicyEnv) {}

    /// A slot just filled with a missed (or prefetched) token (also: every occupied slot, in slot
    /// order, when a buffer leaves the short-sequence fast path or the policy changes, with
    /// `env.ctx.step` one less).
    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv);

    /// An occupied evictable slot that was not evicted.
    fn on_keep(&self, _rec: &mut SlotRecord, _env: &PolicyEnv) {}

    /// An occupied slot about to be refilled: returns the evicted token's new history word
    /// (policies that keep them; the default keeps `env.token_word`).
    fn on_evict(&self, _rec: &SlotRecord, env: &PolicyEnv) -> u32 {
        env.token_word
    }

    /// End of the step.
    fn finish_step(&self, _scalars: &mut PolicyScalars, _env: &PolicyEnv) {}

    /// The seed that callers put into [`StepCtx::seed`] (randomised policies).
    fn seed(&self) -> u64 {
        0
    }

    /// Whether the policy needs each token's next use (an offline policy: simulator only).
    fn needs_future(&self) -> bool {
        false
    }

    /// Whether the policy reads [`PolicyEnv::score`] (the callers then supply scores).
    fn needs_scores(&self) -> bool {
        false
    }

    /// Whether the policy keeps a history word per token ([`PolicyEnv::token_word`]).
    fn uses_token_words(&self) -> bool {
        false
    }

    /// The policy as a step stamp, when that is all it is: `priority` is record word `a`, which
    /// `on_insert` (and `on_hit`, if given) set to `mul * step + add`, and no other hook or input
    /// matters. The simulator then replays it in an exact bucketed form, many times faster;
    /// `None` (the default) replays the hooks.
    fn stamp_rule(&self) -> Option<StampRule> {
        None
    }

    /// The same rule in CUDA C (the hooks of [`cuda`], in a `.cuh` of the policy's own), or
    /// `None` for a policy that cannot run on the GPU.
    fn cuda(&self) -> Option<Cow<'static, str>>;
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_more;
