//! Seeded random eviction: each step, the evictable slots are ranked by a hash of (seed,
//! request, layer, step, slot), so runs are reproducible and the GPU draws the same victims.

use super::{EvictionPolicy, PolicyScalars, SlotRecord, StepCtx};

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
    fn name(&self) -> &'static str {
        "random"
    }

    fn priority(
        &self,
        _rec: &SlotRecord,
        slot: u32,
        _token: u32,
        _s: &PolicyScalars,
        ctx: &StepCtx,
        _next: u32,
    ) -> u64 {
        let h = mix64(ctx.seed ^ mix64(ctx.request));
        let h = mix64(h ^ (u64::from(ctx.layer) << 32 | u64::from(ctx.step)));
        mix64(h ^ u64::from(slot))
    }

    fn on_insert(&self, _rec: &mut SlotRecord, _ctx: &StepCtx) {}

    fn seed(&self) -> u64 {
        self.seed
    }

    fn cuda(&self) -> Option<&'static str> {
        Some(
            r#"
__device__ unsigned long long policy_mix64(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
__device__ unsigned long long policy_priority(const SlotRecord&, unsigned slot, unsigned, const PolicyScalars&, const StepCtx& c) {
    unsigned long long h = policy_mix64(c.seed ^ policy_mix64(c.request));
    h = policy_mix64(h ^ (((unsigned long long)c.layer << 32) | c.step));
    return policy_mix64(h ^ (unsigned long long)slot);
}
__device__ void policy_on_hit(SlotRecord&, const StepCtx&) {}
__device__ void policy_on_insert(SlotRecord&, const StepCtx&) {}
__device__ void policy_on_keep(SlotRecord&, unsigned, const PolicyScalars&, const VictimKey&, const StepCtx&) {}
__device__ void policy_finish(PolicyScalars&, const VictimKey&, const StepCtx&) {}
"#,
        )
    }
}
