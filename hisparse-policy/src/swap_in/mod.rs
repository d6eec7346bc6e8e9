//! The CPU swap-in step: the semantic reference the GPU kernel must match exactly. Given one
//! (request, layer)'s top-k selection, it finds hits, chooses victims with the eviction policy,
//! assigns each miss a slot, updates the slot table and the policy's records, and returns the
//! hot-buffer slot of every selected token. [`copy_missing_rows`] then moves the missed rows
//! from the host tier into the device tier.
//!
//! Buffers of `seq_len <= device_buffer_size` take the fast path: token `t` lives in slot `t`,
//! with no lookups and no policy. Longer ones keep the newest token in the reserved slot and
//! manage the regular slots by policy (see [`crate::policy`] for one step's exact semantics):
//! `step.rs` runs a step, `prefetch.rs` brings tokens in before their selection is known.

mod prefetch;
mod step;

pub use prefetch::{Nominated, PrefetchPlan};

use hisparse_memory::{DeviceMemory, DeviceTier, HostTier, RequestId, SlotTable};

use crate::error::{PolicyError, Result};
use crate::policy::{EvictionPolicy, PolicyEnv, PolicyScalars, SlotRecord, StepCtx};

/// The outcome of one swap-in step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwapInPlan {
    /// Whether the short-sequence fast path was taken.
    pub fast_path: bool,
    /// Slot of every selected token, in selection order (the reserved slot is `device_buffer_size`).
    pub locations: Vec<u32>,
    /// `(token, slot)` of every hit, the newest token included.
    pub hits: Vec<(u32, u32)>,
    /// `(token, slot)` of every miss: the row must be copied host → device into `slot`.
    pub misses: Vec<(u32, u32)>,
    /// `(token, slot)` of every eviction.
    pub evictions: Vec<(u32, u32)>,
    /// Hits on slots a prefetch filled and no selection had used yet (useful prefetches).
    pub prefetch_used: usize,
    /// Evictions of slots a prefetch filled and no selection had used (wasted prefetches).
    pub prefetch_wasted: usize,
}

/// What a step or a prefetch may know besides the selection.
#[derive(Clone, Copy, Debug, Default)]
pub struct SwapInputs<'a> {
    /// `next_use[t]`: the step at which token `t` is next selected (`u32::MAX`: never). Only
    /// policies that need the future read it (the simulator supplies it).
    pub next_use: Option<&'a [u32]>,
    /// `scores[t]`: token `t`'s indexer score this step (NaN where unknown). Only policies that
    /// need scores read it.
    pub scores: Option<&'a [f32]>,
}

impl SwapInPlan {
    fn clear(&mut self) {
        self.fast_path = false;
        self.locations.clear();
        self.hits.clear();
        self.misses.clear();
        self.evictions.clear();
        self.prefetch_used = 0;
        self.prefetch_wasted = 0;
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
    /// Per slot: filled by a prefetch that no selection has used yet.
    prefetched: Vec<bool>,
    /// Per token: the policy's history word (policies that keep them).
    words: Vec<u32>,
    // Scratch reused across steps.
    hit: Vec<bool>,
    keys: Vec<(bool, u64, u32)>,
}

pub(crate) fn invalid(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

impl SwapInState {
    /// An empty buffer of `device_buffer_size` regular slots.
    pub fn new(device_buffer_size: usize) -> Result<Self> {
        Ok(Self {
            table: SlotTable::new(device_buffer_size)?,
            records: vec![SlotRecord::default(); device_buffer_size],
            scalars: PolicyScalars::default(),
            policy_ready: false,
            seq_len: 0,
            prefetched: vec![false; device_buffer_size],
            words: Vec::new(),
            hit: vec![false; device_buffer_size],
            keys: Vec::with_capacity(device_buffer_size),
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
    pub fn device_buffer_size(&self) -> usize {
        self.records.len()
    }

    /// Whether a prefetch filled `slot` and no selection has used it since.
    pub fn is_prefetched(&self, slot: u32) -> bool {
        self.prefetched.get(slot as usize).copied().unwrap_or(false)
    }

    /// Token `t`'s history word (0 if never set).
    pub fn token_word(&self, t: u32) -> u32 {
        self.words.get(t as usize).copied().unwrap_or(0)
    }

    fn set_word(&mut self, t: u32, w: u32) {
        let need = t as usize + 1;
        if self.words.len() < need {
            self.words.resize(need.next_power_of_two().max(64), 0);
        }
        self.words[t as usize] = w;
    }

    /// The environment of a hook on `slot` holding `token`.
    fn env(&self, base: &PolicyEnv, slot: u32, token: u32, inputs: &SwapInputs<'_>) -> PolicyEnv {
        PolicyEnv {
            slot,
            token,
            next_use: inputs.next_use.and_then(|n| n.get(token as usize).copied()).unwrap_or(u32::MAX),
            score: inputs.scores.and_then(|s| s.get(token as usize).copied()).unwrap_or(f32::NAN),
            prefetched: u32::from(self.is_prefetched(slot)),
            token_word: self.token_word(token),
            ..*base
        }
    }

    /// On the first policy-managed step (or after a policy change) every occupied slot's record
    /// is rebuilt by `on_insert` at the step before.
    fn ready_policy(&mut self, policy: &dyn EvictionPolicy, ctx: &StepCtx, inputs: &SwapInputs<'_>) {
        if self.policy_ready {
            return;
        }
        let init = PolicyEnv::of(&StepCtx { step: ctx.step - 1, ..*ctx }, PolicyScalars::default());
        for s in 0..self.device_buffer_size() as u32 {
            let mut rec = SlotRecord::default();
            if let Some(tok) = self.table.token_at(s) {
                let env = self.env(&init, s, tok, inputs);
                policy.on_insert(&mut rec, &env);
            }
            self.records[s as usize] = rec;
        }
        self.scalars = PolicyScalars::default();
        self.policy_ready = true;
    }

    /// Places tokens `0..tokens` in slots `0..tokens` (a prompt that fits the buffer, copied in
    /// whole at admission). Fails unless `tokens <= device_buffer_size` and the buffer is empty.
    pub fn preload(&mut self, tokens: usize) -> Result<()> {
        if tokens > self.device_buffer_size() || self.table.resident() > 0 || self.table.newest().is_some() {
            return Err(invalid(
                "tokens",
                tokens,
                format!("preload needs an empty buffer of at least that many slots ({})", self.device_buffer_size()),
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
    copy_rows(&plan.misses, host, device, req, layer)
}

/// Copies the rows of `(token, slot)` pairs (a step's misses, a prefetch's fills) from the host
/// tier into `req`'s hot buffer in the device tier, for `layer`; returns the bytes copied.
pub fn copy_rows<M: DeviceMemory>(
    rows: &[(u32, u32)],
    host: &HostTier,
    device: &mut DeviceTier<M>,
    req: RequestId,
    layer: usize,
) -> Result<usize> {
    let mut row = vec![0u8; host.row_bytes()];
    for &(token, slot) in rows {
        host.read_row(req, layer, token as usize, &mut row)?;
        device.write_hot_row(req, layer, slot as usize, &row)?;
    }
    Ok(rows.len() * row.len())
}
