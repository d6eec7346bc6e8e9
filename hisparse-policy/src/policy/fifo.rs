//! FIFO: the slot filled longest ago goes first; hits change nothing.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord, StampRule};

/// First in, first out. Record word `a` = the step the slot was filled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fifo;

impl EvictionPolicy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }

    fn priority(&self, rec: &SlotRecord, _env: &PolicyEnv) -> u64 {
        u64::from(rec.a)
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        rec.a = env.ctx.step;
    }

    fn stamp_rule(&self) -> Option<StampRule> {
        Some(StampRule { on_insert: (1, 0), on_hit: None })
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        Some(Cow::Borrowed(include_str!("cuda/fifo.cuh")))
    }
}
