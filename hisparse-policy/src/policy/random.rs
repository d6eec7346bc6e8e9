//! Seeded random eviction: each step, the evictable slots are ranked by a hash of (seed,
//! request, layer, step, slot), so runs are reproducible and the GPU draws the same victims.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord};

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Uniformly random victims among the evictable slots, reproducible from the seed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Random {
    seed: u64,
}

impl Random {
    /// A random policy drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }
}

impl EvictionPolicy for Random {
    fn name(&self) -> &str {
        "random"
    }

    fn priority(&self, _rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        let c = &env.ctx;
        let h = mix64(c.seed ^ mix64(c.request));
        let h = mix64(h ^ (u64::from(c.layer) << 32 | u64::from(c.step)));
        mix64(h ^ u64::from(env.slot))
    }

    fn on_insert(&self, _rec: &mut SlotRecord, _env: &PolicyEnv) {}

    fn seed(&self) -> u64 {
        self.seed
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Borrowed(include_str!("cuda/random.cuh")))
    }
}
