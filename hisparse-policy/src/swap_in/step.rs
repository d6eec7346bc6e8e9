//! One swap-in step of a (request, layer): hits, victims by the policy, misses placed, hooks —
//! the semantics written down in [`crate::policy`], which the GPU kernel matches exactly.

use super::{SwapInPlan, SwapInState, SwapInputs, invalid};
use crate::error::Result;
use crate::policy::{EvictionPolicy, PolicyEnv, StepCtx, VictimKey};

impl SwapInState {
    /// Runs one step for `selection` (strictly ascending positions `< seq_len`) over a sequence of
    /// `seq_len` tokens whose newest is `seq_len - 1`. `inputs` carries what policies may read
    /// besides the selection (next uses for offline policies, scores for score-aware ones). On
    /// error nothing changes.
    pub fn step(
        &mut self,
        policy: &dyn EvictionPolicy,
        selection: &[u32],
        seq_len: usize,
        ctx: &StepCtx,
        inputs: SwapInputs<'_>,
        plan: &mut SwapInPlan,
    ) -> Result<()> {
        let b = self.device_buffer_size();
        self.validate(policy, selection, seq_len, ctx, &inputs)?;
        plan.clear();
        let newest = (seq_len - 1) as u32;
        if seq_len <= b {
            // Fast path: every token in its own slot; place the tokens generated since.
            plan.fast_path = true;
            for t in self.table.resident() as u32..seq_len as u32 {
                self.table.place(t, t)?;
            }
            plan.locations.extend_from_slice(selection);
            plan.hits.extend(selection.iter().map(|&t| (t, t)));
            self.seq_len = seq_len;
            return Ok(());
        }
        self.ready_policy(policy, ctx, &inputs);
        if self.table.newest() != Some(newest) {
            self.table.set_newest(newest)?;
        }
        self.seq_len = seq_len;
        let base = PolicyEnv::of(ctx, self.scalars);

        // 1. Hits and misses.
        self.hit.fill(false);
        for &t in selection {
            if t == newest {
                plan.hits.push((t, b as u32));
            } else if let Some(s) = self.table.slot_of(t) {
                self.hit[s as usize] = true;
                plan.hits.push((t, s));
            } else {
                plan.misses.push((t, u32::MAX));
            }
        }
        // 2. Keys of the evictable slots, before any record changes.
        let m = plan.misses.len();
        let mut victim = VictimKey::default();
        if m > 0 {
            self.keys.clear();
            for s in 0..b as u32 {
                if self.hit[s as usize] {
                    continue;
                }
                let key = match self.table.token_at(s) {
                    None => (false, 0, s),
                    Some(tok) => {
                        (true, policy.priority(&self.records[s as usize], &self.env(&base, s, tok, &inputs)), s)
                    }
                };
                self.keys.push(key);
            }
            // 3. The m smallest keys are the victims, taken by the misses in slot order.
            if m < self.keys.len() {
                self.keys.select_nth_unstable(m - 1);
            }
            let victims = &mut self.keys[..m];
            let &(occupied, priority, slot) = victims.iter().max().unwrap_or(&(false, 0, 0));
            victim = VictimKey { any: true, occupied, priority, slot };
            victims.sort_unstable_by_key(|k| k.2);
            let victims: Vec<(bool, u32)> = victims.iter().map(|&(occ, _, s)| (occ, s)).collect();
            let evict_env = PolicyEnv { victim, ..base };
            for (miss, (occ, s)) in plan.misses.iter_mut().zip(victims) {
                if occ {
                    let gone = self.table.token_at(s).unwrap_or(u32::MAX);
                    let env = self.env(&evict_env, s, gone, &inputs);
                    let word = policy.on_evict(&self.records[s as usize], &env);
                    if policy.uses_token_words() {
                        self.set_word(gone, word);
                    }
                    plan.prefetch_wasted += usize::from(self.prefetched[s as usize]);
                    self.table.evict(s)?;
                    plan.evictions.push((gone, s));
                }
                self.prefetched[s as usize] = false;
                self.table.place(s, miss.0)?;
                miss.1 = s;
                self.hit[s as usize] = true; // mark as touched for step 4
                let env = self.env(&evict_env, s, miss.0, &inputs);
                policy.on_insert(&mut self.records[s as usize], &env);
            }
        }
        // 4. Hooks for hits and kept slots.
        let step_env = PolicyEnv { victim, ..base };
        for &(tok, s) in &plan.hits {
            if (s as usize) < b {
                let env = self.env(&step_env, s, tok, &inputs);
                policy.on_hit(&mut self.records[s as usize], &env);
                plan.prefetch_used += usize::from(self.prefetched[s as usize]);
                self.prefetched[s as usize] = false;
            }
        }
        if victim.any {
            for s in 0..b as u32 {
                if let Some(tok) = self.table.token_at(s).filter(|_| !self.hit[s as usize]) {
                    let env = self.env(&step_env, s, tok, &inputs);
                    policy.on_keep(&mut self.records[s as usize], &env);
                }
            }
        }
        policy.finish_step(&mut self.scalars, &step_env);
        // 5. Locations in selection order: hits and misses are both ascending subsequences.
        let (mut h, mut mi) = (plan.hits.iter().peekable(), plan.misses.iter().peekable());
        for &t in selection {
            let slot = match (h.peek(), mi.peek()) {
                (Some(&&(ht, hs)), _) if ht == t => {
                    h.next();
                    hs
                }
                (_, Some(&&(_, ms))) => {
                    mi.next();
                    ms
                }
                _ => unreachable!("every selected token is a hit or a miss"),
            };
            plan.locations.push(slot);
        }
        Ok(())
    }

    pub(super) fn validate(
        &self,
        policy: &dyn EvictionPolicy,
        selection: &[u32],
        seq_len: usize,
        ctx: &StepCtx,
        inputs: &SwapInputs<'_>,
    ) -> Result<()> {
        if seq_len == 0 || seq_len > u32::MAX as usize {
            return Err(invalid("seq_len", seq_len, "must be in 1..2^32"));
        }
        if seq_len < self.seq_len {
            return Err(invalid("seq_len", seq_len, format!("sequences only grow (was {})", self.seq_len)));
        }
        if ctx.step == 0 {
            return Err(invalid("step", 0, "steps count from 1"));
        }
        if ctx.device_buffer_size as usize != self.device_buffer_size() {
            return Err(invalid(
                "device_buffer_size",
                ctx.device_buffer_size,
                format!("the buffer has {} slots", self.device_buffer_size()),
            ));
        }
        if let Some(w) = selection.windows(2).find(|w| w[0] >= w[1]) {
            return Err(invalid(
                "selection",
                format!("[.., {}, {}, ..]", w[0], w[1]),
                "positions must be strictly ascending",
            ));
        }
        if let Some(&last) = selection.last().filter(|&&t| t as usize >= seq_len) {
            return Err(invalid("selection", last, format!("not a position of a sequence of {seq_len} tokens")));
        }
        let newest_selected = selection.last() == Some(&((seq_len - 1) as u32));
        if selection.len() - usize::from(newest_selected) > self.device_buffer_size() {
            return Err(invalid(
                "selection",
                selection.len(),
                format!("more tokens than the {} regular slots", self.device_buffer_size()),
            ));
        }
        if policy.needs_future() && inputs.next_use.is_none() && seq_len > self.device_buffer_size() {
            return Err(invalid(
                "eviction_policy",
                policy.name(),
                "needs the future (each token's next use): simulator only",
            ));
        }
        Ok(())
    }
}
