//! MQ (multi-queue, Zhou et al.), batch form: an entry sits in queue `min(log2(uses), Q - 1)`
//! and drops one queue per `lifetime` steps without a selection; victims come from the lowest
//! queue, least recently used first. A token's use count survives its eviction (MQ's `Qout`
//! history, kept in its history word) and is restored when it returns.
//!
//! Record word `a` = LRU's stamp (`2 * step + 1` when selected, `2 * step` when filled), `b` =
//! uses. Token word = uses when last evicted.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord};

/// Multi-queue.
#[derive(Clone, Copy, Debug)]
pub struct Mq {
    /// Queues (1..=16).
    pub queues: u32,
    /// Steps without a selection after which an entry drops one queue (at least 1).
    pub lifetime: u32,
}

/// Most uses counted.
const MAX_USES: u32 = 1 << 16;

impl Mq {
    /// The queue an entry with `uses` whose stamp is `stamp` sits in at `step`.
    fn queue(&self, uses: u32, stamp: u32, step: u32) -> u32 {
        let q = (31 - uses.max(1).leading_zeros()).min(self.queues.saturating_sub(1));
        let idle = step.wrapping_mul(2).saturating_sub(stamp) / 2;
        q.saturating_sub(idle / self.lifetime.max(1))
    }
}

impl EvictionPolicy for Mq {
    fn name(&self) -> &str {
        "mq"
    }

    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        u64::from(self.queue(rec.b, rec.a, env.ctx.step)) << 32 | u64::from(rec.a)
    }

    fn on_hit(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2).wrapping_add(1);
        rec.b = (rec.b + 1).min(MAX_USES);
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2);
        rec.b = (env.token_word + 1).min(MAX_USES);
    }

    fn on_evict(&self, rec: &SlotRecord, _env: &PolicyEnv) -> u32 {
        rec.b
    }

    fn uses_token_words(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Owned(format!(
            "#define MQ_QUEUES {}u\n#define MQ_LIFETIME {}u\n{}",
            self.queues,
            self.lifetime.max(1),
            include_str!("cuda/mq.cuh")
        )))
    }
}
