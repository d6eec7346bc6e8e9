//! S3-FIFO (Yang et al., SOSP '23), batch form: new tokens enter a small probationary FIFO and
//! leave it quickly unless selected again; tokens selected while there, or returning soon after
//! being dropped from it (the ghost), live in the main FIFO, where a use buys another pass.
//!
//! Batch form (a step's selection is protected as a whole, victims are the step's `M` smallest
//! keys): the key is `class << 32 | stamp`, classes in eviction order — probationary and unused
//! since entry (0), main and unused since its last pass (1), probationary and used (2), main and
//! used (3); `stamp` is the step it entered its queue or was last passed. The scan passes a used
//! probationary slot when the victims reached main or it is older than the last probationary
//! victim, and a used main slot when the victims reached the used classes or it is older than
//! the last main victim; a passed slot takes its pass: a probationary one moves to main, a main
//! one spends one use; both restart their stamp. Uses count to 3. The ghost is the
//! token's history word: the step it was dropped from probation (0: never); a token refilled
//! within `ghost_steps` of that enters main directly.
//!
//! Record word `a` = stamp, `b` = uses (bits 0..2) and main (bit 8).

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord};

/// S3-FIFO, batch form.
#[derive(Clone, Copy, Debug)]
pub struct S3Fifo {
    /// Steps a token dropped from probation is remembered (the ghost queue's reach).
    pub ghost_steps: u32,
}

const MAIN: u32 = 1 << 8;

fn class(b: u32) -> u32 {
    let main = u32::from(b & MAIN != 0);
    let used = u32::from(b & 3 != 0);
    2 * used + main
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &str {
        "s3fifo"
    }

    fn priority(&self, rec: &SlotRecord, _env: &PolicyEnv) -> u64 {
        u64::from(class(rec.b)) << 32 | u64::from(rec.a)
    }

    fn on_hit(&self, rec: &mut SlotRecord, _env: &PolicyEnv) {
        rec.b = (rec.b & MAIN) | ((rec.b & 3) + 1).min(3);
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step;
        let w = env.token_word;
        let ghost = w != 0 && env.ctx.step.saturating_sub(w) <= self.ghost_steps;
        rec.b = if ghost { MAIN } else { 0 };
    }

    fn on_keep(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        let v = &env.victim;
        if !(v.any && v.occupied) || rec.b & 3 == 0 {
            return;
        }
        let (vc, va) = ((v.priority >> 32) as u32, v.priority as u32);
        let passed = if rec.b & MAIN == 0 { vc >= 1 || rec.a < va } else { vc >= 2 || (vc == 1 && rec.a < va) };
        if passed {
            rec.a = env.ctx.step;
            rec.b = if rec.b & MAIN == 0 { MAIN } else { MAIN | ((rec.b & 3) - 1) };
        }
    }

    fn on_evict(&self, rec: &SlotRecord, env: &PolicyEnv) -> u32 {
        if rec.b & MAIN == 0 { env.ctx.step } else { 0 }
    }

    fn uses_token_words(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Owned(format!(
            "#define S3FIFO_GHOST_STEPS {}u\n{}",
            self.ghost_steps,
            include_str!("cuda/s3fifo.cuh")
        )))
    }
}
