//! LRU with HiSparse's semantics: the slots of a step's selection become the most recent; slots
//! filled by this step's misses rank just below this step's hits and above everything older.

use super::{EvictionPolicy, PolicyScalars, SlotRecord, StepCtx};

/// Least recently used. Record word `a` = `2 * step + 1` when last hit, `2 * step` when filled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lru;

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn priority(
        &self,
        rec: &SlotRecord,
        _slot: u32,
        _token: u32,
        _s: &PolicyScalars,
        _ctx: &StepCtx,
        _next: u32,
    ) -> u64 {
        u64::from(rec.a)
    }

    fn on_hit(&self, rec: &mut SlotRecord, ctx: &StepCtx) {
        rec.a = ctx.step.wrapping_mul(2).wrapping_add(1);
    }

    fn on_insert(&self, rec: &mut SlotRecord, ctx: &StepCtx) {
        rec.a = ctx.step.wrapping_mul(2);
    }

    fn cuda(&self) -> Option<&'static str> {
        Some(
            r#"
__device__ unsigned long long policy_priority(const SlotRecord& r, unsigned, unsigned, const PolicyScalars&, const StepCtx&) { return r.a; }
__device__ void policy_on_hit(SlotRecord& r, const StepCtx& c) { r.a = c.step * 2u + 1u; }
__device__ void policy_on_insert(SlotRecord& r, const StepCtx& c) { r.a = c.step * 2u; }
__device__ void policy_on_keep(SlotRecord&, unsigned, const PolicyScalars&, const VictimKey&, const StepCtx&) {}
__device__ void policy_finish(PolicyScalars&, const VictimKey&, const StepCtx&) {}
"#,
        )
    }
}
