//! Belady's MIN, adapted to steps: among the slots not selected in this step, evict the token
//! whose next selection is farthest in the future (never selected again: first). Offline — it
//! needs the future — so it runs in the simulator only; its misses bound every online policy's.

use std::borrow::Cow;

use super::{EvictionPolicy, PolicyEnv, SlotRecord};

/// The offline optimum (tested against exhaustive search on small traces).
#[derive(Clone, Copy, Debug, Default)]
pub struct Belady;

impl EvictionPolicy for Belady {
    fn name(&self) -> &str {
        "belady"
    }

    fn priority(&self, _rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        u64::from(u32::MAX - env.next_use)
    }

    fn on_insert(&self, _rec: &mut SlotRecord, _env: &PolicyEnv) {}

    fn needs_future(&self) -> bool {
        true
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        None
    }
}
