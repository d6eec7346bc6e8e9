//! CLOCK (second chance), step-batched: the hand sweeps the slots in circular order from its
//! position; a referenced slot loses its bit and is passed, an unreferenced one is evicted.
//!
//! For `M` misses at once this is exactly: victims are the first `M` evictable slots in the
//! order (unreferenced before referenced, then by circular distance from the hand) — priority
//! `ref << 32 | distance`; kept slots that the hand passed lose their bit (all referenced ones
//! if the sweep went round into the referenced class, else those before the last victim); the
//! hand stops after the last victim. Hits set the bit; fills set it too, or — the `clock-cold`
//! variant — leave it clear, so a token that is never selected again goes on the next sweep.
//! Empty slots are filled first and do not move the hand.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, PolicyScalars, SlotRecord};

/// CLOCK. Record word `a` = reference bit; scalar `a` = the hand.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    /// Leave the reference bit of a newly filled slot clear (`clock-cold`).
    pub clear_on_insert: bool,
}

fn distance(slot: u32, hand: u32, slots: u32) -> u32 {
    (slot + slots - hand % slots.max(1)) % slots.max(1)
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &str {
        if self.clear_on_insert { "clock-cold" } else { "clock" }
    }

    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        u64::from(rec.a & 1) << 32 | u64::from(distance(env.slot, env.scalars.a, env.ctx.buffer_slots))
    }

    fn on_hit(&self, rec: &mut SlotRecord, _env: &PolicyEnv) {
        rec.a = 1;
    }

    fn on_insert(&self, rec: &mut SlotRecord, _env: &PolicyEnv) {
        rec.a = u32::from(!self.clear_on_insert);
    }

    fn on_keep(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        let v = &env.victim;
        if v.any && v.occupied && rec.a == 1 {
            let wrapped = v.priority >> 32 == 1;
            let d = u64::from(distance(env.slot, env.scalars.a, env.ctx.buffer_slots));
            if wrapped || d < (v.priority & 0xffff_ffff) {
                rec.a = 0;
            }
        }
    }

    fn finish_step(&self, s: &mut PolicyScalars, env: &PolicyEnv) {
        let v = &env.victim;
        if v.any && v.occupied {
            s.a = (v.slot + 1) % env.ctx.buffer_slots.max(1);
        }
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        let hooks = include_str!("cuda/clock.cuh");
        Some(if self.clear_on_insert {
            Cow::Owned(format!("#define CLOCK_CLEAR_ON_INSERT\n{hooks}"))
        } else {
            Cow::Borrowed(hooks)
        })
    }
}
