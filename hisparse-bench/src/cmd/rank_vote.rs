//! [`StepVote`]: ranks (threads of one process) agreeing before every step whether any still has
//! work, so that collectives always meet; used by `run --gpus` (`run_ranks.rs`) and by its
//! arrivals loop (`arrivals.rs`).

use std::sync::{Arc, Barrier, Mutex};

/// The ranks' agreement before each step on whether any still has work (requests to come,
/// queued or running) and whether any has something to decode now. The ranks are threads of
/// one process, so a barrier and a lock are the collective: round `r` adds into slot `r % 2`,
/// which round `r - 2` used and every rank finished reading before the barrier of `r - 1`.
pub struct StepVote {
    barrier: Barrier,
    /// Per slot: its round, ranks with work, ranks with something to decode.
    slots: Mutex<[(u64, usize, usize); 2]>,
}

/// One rank's handle on a [`StepVote`] (its own round count).
pub struct RankVote {
    vote: Arc<StepVote>,
    round: std::cell::Cell<u64>,
}

impl StepVote {
    /// A vote of `ranks` ranks; one handle per rank.
    pub fn group(ranks: usize) -> Vec<RankVote> {
        let vote = Arc::new(StepVote { barrier: Barrier::new(ranks), slots: Mutex::new([(u64::MAX, 0, 0); 2]) });
        (0..ranks).map(|_| RankVote { vote: Arc::clone(&vote), round: std::cell::Cell::new(0) }).collect()
    }
}

impl RankVote {
    /// This rank's `(pending, active)`; returns whether any rank has work and whether any has
    /// something to decode now. Every rank calls it once per round.
    pub fn any(&self, pending: bool, active: bool) -> (bool, bool) {
        let r = self.round.get();
        self.round.set(r + 1);
        let slot = (r % 2) as usize;
        let add = |s: &mut [(u64, usize, usize); 2]| {
            if s[slot].0 != r {
                s[slot] = (r, 0, 0);
            }
            s[slot].1 += usize::from(pending);
            s[slot].2 += usize::from(active);
        };
        // A poisoned lock means another rank panicked holding it; its counts are still whole
        // (the closure cannot panic), so the vote goes on with them.
        add(&mut self.vote.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        self.vote.barrier.wait();
        let s = self.vote.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)[slot];
        (s.1 > 0, s.2 > 0)
    }
}
