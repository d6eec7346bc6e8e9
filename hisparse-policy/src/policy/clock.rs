//! CLOCK (second chance), step-batched, with a reference counter of `bits` bits (1: classic
//! CLOCK; more: GCLOCK): the hand sweeps the slots in circular order from its position; a slot
//! whose counter is above zero loses one and is passed, one at zero is evicted.
//!
//! For `M` misses at once this is exactly: a slot with counter `c` at circular distance `d` from
//! the hand would be evicted at sweep time `c * N + d`, so the victims are the first `M`
//! evictable slots by `(c, d)` — priority `c << 32 | d`. If the last victim is `(c*, d*)`, a
//! kept slot was visited `c* + [d < d*]` times and loses that much of its counter; the hand
//! stops after the last victim. Selections add one to the counter (up to `2^bits - 1`); fills
//! set it to one, or — the `clock-cold` variant — leave it at zero, so a token that is never
//! selected again goes on the next sweep. Empty slots are filled first and do not move the hand.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, PolicyScalars, SlotRecord};

/// CLOCK. Record word `a` = reference counter; scalar `a` = the hand.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Leave the counter of a newly filled slot at zero (`clock-cold`).
    pub clear_on_insert: bool,
    /// Counter width in bits (1..=8).
    pub bits: u32,
}

impl Default for Clock {
    fn default() -> Self {
        Self { clear_on_insert: false, bits: 1 }
    }
}

fn distance(slot: u32, hand: u32, slots: u32) -> u32 {
    (slot + slots - hand % slots.max(1)) % slots.max(1)
}

impl Clock {
    fn max(&self) -> u32 {
        (1u32 << self.bits.clamp(1, 8)) - 1
    }
}

impl EvictionPolicy for Clock {
    fn name(&self) -> &str {
        if self.clear_on_insert { "clock-cold" } else { "clock" }
    }

    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        u64::from(rec.a) << 32 | u64::from(distance(env.slot, env.scalars.a, env.ctx.device_buffer_size))
    }

    fn on_hit(&self, rec: &mut SlotRecord, _env: &PolicyEnv) {
        rec.a = (rec.a + 1).min(self.max());
    }

    fn on_insert(&self, rec: &mut SlotRecord, _env: &PolicyEnv) {
        rec.a = u32::from(!self.clear_on_insert);
    }

    fn on_keep(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        let v = &env.victim;
        if v.any && v.occupied {
            let d = u64::from(distance(env.slot, env.scalars.a, env.ctx.device_buffer_size));
            let visits = (v.priority >> 32) as u32 + u32::from(d < (v.priority & 0xffff_ffff));
            rec.a -= visits.min(rec.a);
        }
    }

    fn finish_step(&self, s: &mut PolicyScalars, env: &PolicyEnv) {
        let v = &env.victim;
        if v.any && v.occupied {
            s.a = (v.slot + 1) % env.ctx.device_buffer_size.max(1);
        }
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        let cold = if self.clear_on_insert { "#define CLOCK_CLEAR_ON_INSERT\n" } else { "" };
        Some(Cow::Owned(format!("{cold}#define CLOCK_MAX {}u\n{}", self.max(), include_str!("cuda/clock.cuh"))))
    }
}
