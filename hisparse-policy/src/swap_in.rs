//! The CPU swap-in step: the semantic reference the GPU kernel must match exactly. Given one
//! (request, layer)'s top-k selection, it finds hits, chooses victims with the eviction policy,
//! assigns each miss a slot, updates the slot table and the policy's records, and returns the
//! hot-buffer slot of every selected token. [`copy_missing_rows`] then moves the missed rows
//! from the host tier into the device tier.
//!
//! Buffers of `seq_len <= device_buffer_size` take the fast path: token `t` lives in slot `t`,
//! with no lookups and no policy. Longer ones keep the newest token in the reserved slot and
//! manage the regular slots by policy (see [`crate::policy`] for one step's exact semantics).

use hisparse_memory::{DeviceMemory, DeviceTier, HostTier, RequestId, SlotTable};

use crate::error::{PolicyError, Result};
use crate::policy::{EvictionPolicy, PolicyScalars, SlotRecord, StepCtx, VictimKey};

/// The outcome of one swap-in step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapInPlan {
    /// Whether the short-sequence fast path was taken.
    pub fast_path: bool,
    /// Slot of every selected token, in selection order (the reserved slot is `buffer_slots`).
    pub locations: Vec<u32>,
    /// `(token, slot)` of every hit, the newest token included.
    pub hits: Vec<(u32, u32)>,
    /// `(token, slot)` of every miss: the row must be copied host → device into `slot`.
    pub misses: Vec<(u32, u32)>,
    /// `(token, slot)` of every eviction.
    pub evictions: Vec<(u32, u32)>,
}

impl SwapInPlan {
    fn clear(&mut self) {
        self.fast_path = false;
        self.locations.clear();
        self.hits.clear();
        self.misses.clear();
        self.evictions.clear();
    }
}

/// The swap-in state of one (request, layer): slot table, policy records and scalars.
#[derive(Clone, Debug)]
pub struct SwapInState {
    table: SlotTable,
    records: Vec<SlotRecord>,
    scalars: PolicyScalars,
    policy_ready: bool,
    seq_len: usize,
    // Scratch reused across steps.
    hit: Vec<bool>,
    keys: Vec<(bool, u64, u32)>,
}

fn invalid(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

impl SwapInState {
    /// An empty buffer of `buffer_slots` regular slots.
    pub fn new(buffer_slots: usize) -> Result<Self> {
        Ok(Self {
            table: SlotTable::new(buffer_slots)?,
            records: vec![SlotRecord::default(); buffer_slots],
            scalars: PolicyScalars::default(),
            policy_ready: false,
            seq_len: 0,
            hit: vec![false; buffer_slots],
            keys: Vec::with_capacity(buffer_slots),
        })
    }

    /// The slot table.
    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// The policy's per-slot records.
    pub fn records(&self) -> &[SlotRecord] {
        &self.records
    }

    /// The policy's scalars.
    pub fn scalars(&self) -> PolicyScalars {
        self.scalars
    }

    /// Regular slots.
    pub fn buffer_slots(&self) -> usize {
        self.records.len()
    }

    /// Places tokens `0..tokens` in slots `0..tokens` (a prompt that fits the buffer, copied in
    /// whole at admission). Fails unless `tokens <= buffer_slots` and the buffer is empty.
    pub fn preload(&mut self, tokens: usize) -> Result<()> {
        if tokens > self.buffer_slots() || self.table.resident() > 0 || self.table.newest().is_some() {
            return Err(invalid(
                "tokens",
                tokens,
                format!("preload needs an empty buffer of at least that many slots ({})", self.buffer_slots()),
            ));
        }
        for t in 0..tokens as u32 {
            self.table.place(t, t)?;
        }
        self.seq_len = tokens;
        Ok(())
    }

    /// Forgets the policy's records: at the next policy-managed step they are rebuilt by
    /// `on_insert` for every occupied slot (used when the policy is swapped at run time).
    pub fn reset_policy(&mut self) {
        self.policy_ready = false;
    }

    /// Runs one step for `selection` (strictly ascending positions `< seq_len`) over a sequence of
    /// `seq_len` tokens whose newest is `seq_len - 1`. `next_use[t]` is the step at which token
    /// `t` is next selected; only policies that need the future read it. On error nothing changes.
    pub fn step(
        &mut self,
        policy: &dyn EvictionPolicy,
        selection: &[u32],
        seq_len: usize,
        ctx: &StepCtx,
        next_use: Option<&[u32]>,
        plan: &mut SwapInPlan,
    ) -> Result<()> {
        let b = self.buffer_slots();
        self.validate(policy, selection, seq_len, ctx, next_use)?;
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
        if !self.policy_ready {
            let init = StepCtx { step: ctx.step - 1, ..*ctx };
            for (s, rec) in self.records.iter_mut().enumerate() {
                *rec = SlotRecord::default();
                if self.table.token_at(s as u32).is_some() {
                    policy.on_insert(rec, &init);
                }
            }
            self.scalars = PolicyScalars::default();
            self.policy_ready = true;
        }
        if self.table.newest() != Some(newest) {
            self.table.set_newest(newest)?;
        }
        self.seq_len = seq_len;

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
                self.keys.push(match self.table.token_at(s) {
                    None => (false, 0, s),
                    Some(tok) => {
                        let nu = next_use.map_or(u32::MAX, |n| n.get(tok as usize).copied().unwrap_or(u32::MAX));
                        (true, policy.priority(&self.records[s as usize], s, tok, &self.scalars, ctx, nu), s)
                    }
                });
            }
            // 3. The m smallest keys are the victims, taken by the misses in slot order.
            if m < self.keys.len() {
                self.keys.select_nth_unstable(m - 1);
            }
            let victims = &mut self.keys[..m];
            let &(occupied, priority, slot) = victims.iter().max().unwrap_or(&(false, 0, 0));
            victim = VictimKey { any: true, occupied, priority, slot };
            victims.sort_unstable_by_key(|k| k.2);
            for (miss, &(occ, _, s)) in plan.misses.iter_mut().zip(victims.iter()) {
                if occ {
                    let gone = self.table.evict(s)?;
                    plan.evictions.push((gone, s));
                }
                self.table.place(s, miss.0)?;
                miss.1 = s;
                self.hit[s as usize] = true; // mark as touched for step 4
                policy.on_insert(&mut self.records[s as usize], ctx);
            }
        }
        // 4. Hooks for hits and kept slots.
        for &(_, s) in &plan.hits {
            if (s as usize) < b {
                policy.on_hit(&mut self.records[s as usize], ctx);
            }
        }
        if victim.any {
            for s in 0..b as u32 {
                if !self.hit[s as usize] && self.table.token_at(s).is_some() {
                    policy.on_keep(&mut self.records[s as usize], s, &self.scalars, &victim, ctx);
                }
            }
        }
        policy.finish_step(&mut self.scalars, &victim, ctx);
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

    fn validate(
        &self,
        policy: &dyn EvictionPolicy,
        selection: &[u32],
        seq_len: usize,
        ctx: &StepCtx,
        next_use: Option<&[u32]>,
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
        if ctx.buffer_slots as usize != self.buffer_slots() {
            return Err(invalid(
                "buffer_slots",
                ctx.buffer_slots,
                format!("the buffer has {} slots", self.buffer_slots()),
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
        if selection.len() - usize::from(newest_selected) > self.buffer_slots() {
            return Err(invalid(
                "selection",
                selection.len(),
                format!("more tokens than the {} regular slots", self.buffer_slots()),
            ));
        }
        if policy.needs_future() && next_use.is_none() && seq_len > self.buffer_slots() {
            return Err(invalid(
                "eviction_policy",
                policy.name(),
                "needs the future (each token's next use): simulator only",
            ));
        }
        Ok(())
    }
}

/// Copies the rows of `plan`'s misses from the host tier into `req`'s hot buffer in the device
/// tier, for `layer`; returns the bytes copied.
pub fn copy_missing_rows<M: DeviceMemory>(
    plan: &SwapInPlan,
    host: &HostTier,
    device: &mut DeviceTier<M>,
    req: RequestId,
    layer: usize,
) -> Result<usize> {
    let mut row = vec![0u8; host.row_bytes()];
    for &(token, slot) in &plan.misses {
        host.read_row(req, layer, token as usize, &mut row)?;
        device.write_hot_row(req, layer, slot as usize, &row)?;
    }
    Ok(plan.misses.len() * row.len())
}
