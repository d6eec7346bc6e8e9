//! LRU with HiSparse's semantics: the slots of a step's selection become the most recent; slots
//! filled by this step's misses rank just below this step's hits and above everything older.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord, StampRule};

/// Least recently used. Record word `a` = `2 * step + 1` when last hit, `2 * step` when filled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lru;

impl EvictionPolicy for Lru {
    fn name(&self) -> &str {
        "lru"
    }

    fn priority(&self, rec: &SlotRecord, _env: &PolicyEnv) -> u64 {
        u64::from(rec.a)
    }

    fn on_hit(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2).wrapping_add(1);
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step.wrapping_mul(2);
    }

    fn stamp_rule(&self) -> Option<StampRule> {
        Some(StampRule { on_insert: (2, 0), on_hit: Some((2, 1)) })
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Borrowed(include_str!("cuda/lru.cuh")))
    }
}
