//! FIFO: the slot filled longest ago goes first; hits change nothing.

use super::{EvictionPolicy, PolicyScalars, SlotRecord, StepCtx};

/// First in, first out. Record word `a` = the step the slot was filled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fifo;

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
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

    fn on_insert(&self, rec: &mut SlotRecord, ctx: &StepCtx) {
        rec.a = ctx.step;
    }

    fn cuda(&self) -> Option<&'static str> {
        Some(
            r#"
__device__ unsigned long long policy_priority(const SlotRecord& r, unsigned, unsigned, const PolicyScalars&, const StepCtx&) { return r.a; }
__device__ void policy_on_hit(SlotRecord&, const StepCtx&) {}
__device__ void policy_on_insert(SlotRecord& r, const StepCtx& c) { r.a = c.step; }
__device__ void policy_on_keep(SlotRecord&, unsigned, const PolicyScalars&, const VictimKey&, const StepCtx&) {}
__device__ void policy_finish(PolicyScalars&, const VictimKey&, const StepCtx&) {}
"#,
        )
    }
}
