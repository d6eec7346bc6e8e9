//! CLOCK (second chance), step-batched: the hand sweeps the slots in circular order from its
//! position; a referenced slot loses its bit and is passed, an unreferenced one is evicted.
//!
//! For `M` misses at once this is exactly: victims are the first `M` evictable slots in the
//! order (unreferenced before referenced, then by circular distance from the hand) — priority
//! `ref << 32 | distance`; kept slots that the hand passed lose their bit (all referenced ones
//! if the sweep went round into the referenced class, else those before the last victim); the
//! hand stops after the last victim. Hits and fills set the bit. Empty slots are filled first
//! and do not move the hand.

use super::{EvictionPolicy, PolicyScalars, SlotRecord, StepCtx, VictimKey};

/// CLOCK. Record word `a` = reference bit; scalar `a` = the hand.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock;

fn distance(slot: u32, hand: u32, slots: u32) -> u32 {
    (slot + slots - hand % slots.max(1)) % slots.max(1)
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn priority(&self, rec: &SlotRecord, slot: u32, _token: u32, s: &PolicyScalars, ctx: &StepCtx, _next: u32) -> u64 {
        u64::from(rec.a & 1) << 32 | u64::from(distance(slot, s.a, ctx.buffer_slots))
    }

    fn on_hit(&self, rec: &mut SlotRecord, _ctx: &StepCtx) {
        rec.a = 1;
    }

    fn on_insert(&self, rec: &mut SlotRecord, _ctx: &StepCtx) {
        rec.a = 1;
    }

    fn on_keep(&self, rec: &mut SlotRecord, slot: u32, s: &PolicyScalars, v: &VictimKey, ctx: &StepCtx) {
        if v.any && v.occupied && rec.a == 1 {
            let wrapped = v.priority >> 32 == 1;
            if wrapped || u64::from(distance(slot, s.a, ctx.buffer_slots)) < (v.priority & 0xffff_ffff) {
                rec.a = 0;
            }
        }
    }

    fn finish_step(&self, s: &mut PolicyScalars, v: &VictimKey, ctx: &StepCtx) {
        if v.any && v.occupied {
            s.a = (v.slot + 1) % ctx.buffer_slots.max(1);
        }
    }

    fn cuda(&self) -> Option<&'static str> {
        Some(
            r#"
__device__ unsigned policy_distance(unsigned slot, unsigned hand, unsigned slots) {
    slots = slots ? slots : 1u;
    return (slot + slots - hand % slots) % slots;
}
__device__ unsigned long long policy_priority(const SlotRecord& r, unsigned slot, unsigned, const PolicyScalars& s, const StepCtx& c) {
    return ((unsigned long long)(r.a & 1u) << 32) | policy_distance(slot, s.a, c.buffer_slots);
}
__device__ void policy_on_hit(SlotRecord& r, const StepCtx&) { r.a = 1u; }
__device__ void policy_on_insert(SlotRecord& r, const StepCtx&) { r.a = 1u; }
__device__ void policy_on_keep(SlotRecord& r, unsigned slot, const PolicyScalars& s, const VictimKey& v, const StepCtx& c) {
    if (v.any && v.occupied && r.a == 1u) {
        bool wrapped = (v.priority >> 32) == 1ull;
        if (wrapped || (unsigned long long)policy_distance(slot, s.a, c.buffer_slots) < (v.priority & 0xffffffffull)) r.a = 0u;
    }
}
__device__ void policy_finish(PolicyScalars& s, const VictimKey& v, const StepCtx& c) {
    if (v.any && v.occupied) s.a = (v.slot + 1u) % (c.buffer_slots ? c.buffer_slots : 1u);
}
"#,
        )
    }
}
