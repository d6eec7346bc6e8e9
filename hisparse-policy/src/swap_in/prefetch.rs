//! Prefetch into a (request, layer)'s buffer before its selection is known: the tokens a
//! prefetcher nominates enter as misses would — victims chosen by the eviction policy (empty
//! slots first, then the smallest keys), never a slot whose token is protected (the target
//! layer's selection this step, where it is known) — and are marked prefetched until a selection
//! uses them (a useful prefetch) or they are evicted unused (a wasted one).
//!
//! A prefetch that evicts ages the policy as evictions by misses do: `on_evict` and `on_insert`
//! for the slots it refills and `on_keep` for the evictable slots it passed over, all with its
//! largest victim, then `finish_step` (CLOCK's hand moves past the victim). Hits are untouched.
//! Without this, a policy whose aging rides on evictions (CLOCK, S3-FIFO) stopped aging in
//! layers whose rows all arrive by prefetch (shared-index layers) and evicted the same slots
//! again and again.

use super::{SwapInState, SwapInputs, invalid};
use crate::error::Result;
use crate::policy::{EvictionPolicy, PolicyEnv, StepCtx, VictimKey};

/// What one prefetch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefetchPlan {
    /// `(token, slot)` of every row brought in (the rows to copy host → device), ascending.
    pub fills: Vec<(u32, u32)>,
    /// `(token, slot)` of every eviction.
    pub evictions: Vec<(u32, u32)>,
    /// Evictions of earlier prefetches no selection had used (wasted).
    pub wasted: usize,
}

/// What a prefetch into one buffer is asked to bring ([`SwapInState::prefetch`]).
#[derive(Clone, Copy, Debug)]
pub struct Nominated<'a> {
    /// Positions in the prefetcher's order of preference.
    pub candidates: &'a [u32],
    /// Positions never evicted by the fills (ascending).
    pub protect: &'a [u32],
    /// The most rows brought in.
    pub budget: usize,
}

impl SwapInState {
    /// Brings up to `budget` of `candidates` (positions below `seq_len`, in the prefetcher's
    /// order of preference; resident ones, the newest and repeats are skipped) into the buffer,
    /// never evicting a token of `protect` (ascending). When fewer slots may be given up than
    /// there are candidates, the most preferred are taken. Fills in ascending position take their
    /// victims in ascending slot order, as misses do. A buffer on the fast path
    /// (`seq_len <= device_buffer_size`) already holds every token: nothing happens. On error nothing
    /// changes.
    pub fn prefetch(
        &mut self,
        policy: &dyn EvictionPolicy,
        nominated: Nominated<'_>,
        seq_len: usize,
        ctx: &StepCtx,
        inputs: SwapInputs<'_>,
        plan: &mut PrefetchPlan,
    ) -> Result<()> {
        let Nominated { candidates, protect, budget } = nominated;
        plan.fills.clear();
        plan.evictions.clear();
        plan.wasted = 0;
        let b = self.device_buffer_size();
        self.validate(policy, &[], seq_len, ctx, &inputs)?;
        if let Some(&bad) = candidates.iter().find(|&&t| t as usize >= seq_len) {
            return Err(invalid("candidates", bad, format!("not a position of a sequence of {seq_len} tokens")));
        }
        if let Some(w) = protect.windows(2).find(|w| w[0] >= w[1]) {
            return Err(invalid("protect", w[1], "positions must be strictly ascending"));
        }
        if seq_len <= b || budget == 0 {
            return Ok(());
        }
        self.ready_policy(policy, ctx, &inputs);
        let newest = (seq_len - 1) as u32;
        if self.table.newest() != Some(newest) {
            self.table.set_newest(newest)?;
        }
        self.seq_len = seq_len;
        // The fills: the most preferred candidates not resident, within the budget and within
        // the slots that may be given up.
        let protected = |t: u32| protect.binary_search(&t).is_ok();
        let evictable: Vec<u32> =
            (0..b as u32).filter(|&s| self.table.token_at(s).is_none_or(|t| !protected(t))).collect();
        let mut wanted: Vec<u32> = Vec::new();
        for &t in candidates {
            if wanted.len() == budget.min(evictable.len()) {
                break;
            }
            if t != newest && self.table.slot_of(t).is_none() && !wanted.contains(&t) {
                wanted.push(t);
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        wanted.sort_unstable();
        // Victims: the smallest keys among the evictable slots.
        let base = PolicyEnv::of(ctx, self.scalars);
        self.keys.clear();
        for &s in &evictable {
            let key = match self.table.token_at(s) {
                None => (false, 0, s),
                Some(tok) => (true, policy.priority(&self.records[s as usize], &self.env(&base, s, tok, &inputs)), s),
            };
            self.keys.push(key);
        }
        let m = wanted.len();
        if m < self.keys.len() {
            self.keys.select_nth_unstable(m - 1);
        }
        let &(occupied, priority, slot) = self.keys[..m].iter().max().unwrap_or(&(false, 0, 0));
        let base = PolicyEnv { victim: VictimKey { any: true, occupied, priority, slot }, ..base };
        let mut victims: Vec<(bool, u32)> = self.keys[..m].iter().map(|&(occ, _, s)| (occ, s)).collect();
        victims.sort_unstable_by_key(|v| v.1);
        // The evictable slots passed over: aged as kept slots are after a step's evictions.
        let kept: Vec<u32> = self.keys[m..].iter().filter(|k| k.0).map(|k| k.2).collect();
        for (t, (occ, s)) in wanted.into_iter().zip(victims) {
            if occ {
                let gone = self.table.token_at(s).unwrap_or(u32::MAX);
                let word = policy.on_evict(&self.records[s as usize], &self.env(&base, s, gone, &inputs));
                if policy.uses_token_words() {
                    self.set_word(gone, word);
                }
                plan.wasted += usize::from(self.prefetched[s as usize]);
                self.table.evict(s)?;
                plan.evictions.push((gone, s));
            }
            self.table.place(s, t)?;
            let env = PolicyEnv { prefetched: 1, ..self.env(&base, s, t, &inputs) };
            policy.on_insert(&mut self.records[s as usize], &env);
            self.prefetched[s as usize] = true;
            plan.fills.push((t, s));
        }
        for s in kept {
            if let Some(tok) = self.table.token_at(s) {
                let env = self.env(&base, s, tok, &inputs);
                policy.on_keep(&mut self.records[s as usize], &env);
            }
        }
        policy.finish_step(&mut self.scalars, &base);
        Ok(())
    }
}
