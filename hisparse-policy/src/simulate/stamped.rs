//! The exact bucketed replay of a stamp policy ([`StampRule`]: LRU, FIFO) without prefetch: the
//! same misses, slot for slot, as [`SwapInState::step`](crate::swap_in::SwapInState::step), at a
//! fraction of the cost (no per-slot scan, no hook calls).
//!
//! The victims of a step are the smallest `(occupied, stamp, slot)` keys among the slots not hit.
//! Empty slots only ever form the tail `next_empty..b` (a buffer fills from slot 0 and a slot,
//! once filled, is only refilled), so they go first in slot order. Occupied slots live in
//! buckets, one per stamp, in stamp order; a bucket is made in one step, already in slot order,
//! and then only loses slots: an entry whose slot has since taken another stamp is stale and
//! skipped (lazy deletion), and the stale entries are compacted away once they outnumber the
//! slots.

use std::collections::VecDeque;

use crate::error::{PolicyError, Result};
use crate::policy::StampRule;

use super::Stream;

const NONE: u32 = u32::MAX;
/// No regular slot, in the token index (slots are below `MAX_BUFFER_SLOTS` < `u16::MAX`).
const NO_SLOT: u16 = u16::MAX;

/// Slots with one stamp, ascending, consumed from `pos`.
struct Bucket {
    stamp: u32,
    slots: Vec<u32>,
    pos: usize,
    /// Whether `slots[pos..]` is ascending; a bucket of hits is not until a victim scan reaches
    /// it, which first drops its stale entries and then sorts what is left.
    sorted: bool,
}

/// One stream's buffer under a stamp policy.
struct StampedBuffer {
    rule: StampRule,
    /// Per slot: its token (`NONE`: empty).
    slot_token: Vec<u32>,
    /// Per slot: its stamp.
    stamp: Vec<u32>,
    /// Per slot: the last step (epoch) it was hit in.
    hit_epoch: Vec<u32>,
    /// Per token: its regular slot (`NO_SLOT`: not in one).
    token_slot: Vec<u16>,
    newest: Option<u32>,
    /// Slots `next_empty..b` are empty.
    next_empty: usize,
    ready: bool,
    buckets: VecDeque<Bucket>,
    entries: usize,
    epoch: u32,
    // Scratch.
    hits: Vec<u32>,
    misses: Vec<u32>,
    victims: Vec<u32>,
    kept: Vec<u32>,
    /// A bit per slot: a bucket's slots sorted by marking them (they are distinct).
    bits: Vec<u64>,
}

impl StampedBuffer {
    fn new(rule: StampRule, b: usize, max_len: usize) -> Self {
        Self {
            rule,
            slot_token: vec![NONE; b],
            // One more entry each: where a miss's mark goes in the branch-free hit loop.
            stamp: vec![0; b + 1],
            hit_epoch: vec![0; b + 1],
            token_slot: vec![NO_SLOT; max_len],
            newest: None,
            next_empty: 0,
            ready: false,
            buckets: VecDeque::new(),
            entries: 0,
            epoch: 0,
            hits: Vec::new(),
            misses: Vec::new(),
            victims: Vec::new(),
            kept: Vec::new(),
            bits: vec![0; b.div_ceil(64)],
        }
    }

    fn b(&self) -> usize {
        self.slot_token.len()
    }

    fn place(&mut self, slot: u32, token: u32) {
        self.slot_token[slot as usize] = token;
        // slot < b <= MAX_BUFFER_SLOTS < u16::MAX (checked by `replay_stamped`).
        self.token_slot[token as usize] = slot as u16;
    }

    /// Drops stale entries and empty buckets (in place).
    fn compact(&mut self) {
        let (slot_token, stamps) = (&self.slot_token[..], &self.stamp[..]);
        for bk in &mut self.buckets {
            let stamp = bk.stamp;
            bk.slots.drain(..bk.pos);
            bk.pos = 0;
            keep_where(&mut bk.slots, |s| (slot_token[s as usize] != NONE) & (stamps[s as usize] == stamp));
        }
        self.buckets.retain(|bk| !bk.slots.is_empty());
        self.entries = self.buckets.iter().map(|bk| bk.slots.len()).sum();
    }

    /// The `m` victims of this step (epoch `self.epoch`) into `self.victims`, ascending.
    fn take_victims(&mut self, m: usize) {
        self.victims.clear();
        let b = self.b();
        while self.victims.len() < m && self.next_empty < b {
            self.victims.push(self.next_empty as u32);
            self.next_empty += 1;
        }
        let from_empty = self.victims.len();
        let mut i = 0;
        while self.victims.len() < m && i < self.buckets.len() {
            let bk = &mut self.buckets[i];
            if !bk.sorted {
                // Slices, not the vectors: their lengths stay in registers while `keep_where`
                // writes the bucket.
                let (slot_token, stamps, stamp) = (&self.slot_token[..], &self.stamp[..], bk.stamp);
                let before = bk.slots.len() - bk.pos;
                bk.slots.drain(..bk.pos);
                keep_where(&mut bk.slots, |s| (slot_token[s as usize] != NONE) & (stamps[s as usize] == stamp));
                self.entries -= before - bk.slots.len();
                bk.pos = 0;
                sort_distinct(&mut bk.slots, &mut self.bits);
                bk.sorted = true;
            }
            // Entries hit this step stay where they are (a rule without on_hit keeps their
            // stamp): they are moved up against the unread part, in order.
            self.kept.clear();
            let mut j = bk.pos;
            while j < bk.slots.len() && self.victims.len() < m {
                let s = bk.slots[j];
                j += 1;
                if self.slot_token[s as usize] == NONE || self.stamp[s as usize] != bk.stamp {
                    continue;
                }
                if self.hit_epoch[s as usize] == self.epoch {
                    self.kept.push(s);
                } else {
                    self.victims.push(s);
                }
            }
            self.entries -= j - bk.pos - self.kept.len();
            bk.pos = j - self.kept.len();
            bk.slots[bk.pos..j].copy_from_slice(&self.kept);
            i += 1;
        }
        while self.buckets.front().is_some_and(|bk| bk.pos == bk.slots.len()) {
            self.buckets.pop_front();
        }
        // Bucket victims rank below the empty slots by key, not by slot number; the victims are
        // distinct slots.
        if from_empty < self.victims.len() {
            sort_distinct(&mut self.victims, &mut self.bits);
        }
    }

    /// One step: returns its misses.
    fn step(&mut self, selected: &[u32], seq_len: usize, step: u32) -> u32 {
        let b = self.b();
        if seq_len <= b {
            for t in self.next_empty..seq_len {
                self.place(t as u32, t as u32);
            }
            self.next_empty = self.next_empty.max(seq_len);
            return 0;
        }
        if !self.ready {
            // Every occupied slot as inserted at the step before, in slot order.
            let stamp = StampRule::at(self.rule.on_insert, step.wrapping_sub(1));
            let slots: Vec<u32> = (0..b as u32).filter(|&s| self.slot_token[s as usize] != NONE).collect();
            for &s in &slots {
                self.stamp[s as usize] = stamp;
            }
            self.entries += slots.len();
            if !slots.is_empty() {
                self.buckets.push_back(Bucket { stamp, slots, pos: 0, sorted: true });
            }
            self.ready = true;
        }
        let newest = (seq_len - 1) as u32;
        if self.newest != Some(newest) {
            self.newest = Some(newest);
        }
        self.epoch = self.epoch.wrapping_add(1);
        let hit_stamp = self.rule.on_hit.map(|r| StampRule::at(r, step));
        // A selected position past the newest was refused by the trace's check.
        let sel = selected.strip_suffix(&[newest]).unwrap_or(selected);
        // Without branches on hit or miss (a miss is as likely as the trace makes it): every
        // position is written to both lists and counted in one, and a miss's stamp or epoch
        // goes to the spare entry `b`.
        self.misses.resize(sel.len(), 0);
        self.hits.resize(sel.len(), 0);
        let (token_slot, epoch) = (&self.token_slot[..], self.epoch);
        let (misses, hits) = (&mut self.misses[..], &mut self.hits[..]);
        let (mut missed, mut hit) = (0usize, 0usize);
        let (marks, mark) = match hit_stamp {
            // The new stamp makes the slot's old entry stale: no victim scan meets it live.
            Some(h) => (&mut self.stamp[..], h),
            None => (&mut self.hit_epoch[..], epoch),
        };
        for &t in sel {
            let s = token_slot[t as usize];
            let is_miss = s == NO_SLOT;
            let slot = if is_miss { b } else { usize::from(s) };
            marks[slot] = mark;
            misses[missed] = t;
            hits[hit] = slot as u32;
            missed += usize::from(is_miss);
            hit += usize::from(!is_miss);
        }
        self.misses.truncate(missed);
        self.hits.truncate(hit);
        let m = self.misses.len();
        if m > 0 {
            self.take_victims(m);
            let ins = StampRule::at(self.rule.on_insert, step);
            let misses = std::mem::take(&mut self.misses);
            let victims = std::mem::take(&mut self.victims);
            for (&t, &s) in misses.iter().zip(&victims) {
                let gone = self.slot_token[s as usize];
                if gone != NONE {
                    self.token_slot[gone as usize] = NO_SLOT;
                }
                self.place(s, t);
                self.stamp[s as usize] = ins;
            }
            self.entries += victims.len();
            self.buckets.push_back(Bucket { stamp: ins, slots: victims.clone(), pos: 0, sorted: true });
            self.misses = misses;
            self.victims = victims;
        }
        if let Some(h) = hit_stamp
            && !self.hits.is_empty()
        {
            self.entries += self.hits.len();
            let slots = self.hits.clone();
            self.buckets.push_back(Bucket { stamp: h, slots, pos: 0, sorted: false });
        }
        if self.entries > 32 * b + 65_536 {
            self.compact();
        }
        m as u32
    }
}

/// Keeps the slots of `v` where `live` holds, in order, without a branch per slot (most of an
/// old bucket of LRU's hits is stale, each one as the trace makes it).
fn keep_where(v: &mut Vec<u32>, live: impl Fn(u32) -> bool) {
    let mut kept = 0;
    let slots = &mut v[..];
    for i in 0..slots.len() {
        let s = slots[i];
        slots[kept] = s;
        kept += usize::from(live(s));
    }
    v.truncate(kept);
}

/// Sorts `slots` (distinct, each below `64 * bits.len()`) by marking them in `bits` (left
/// clear) and reading the marks back in order: a pass over the buffer's bits instead of a
/// comparison sort of a step's hits.
fn sort_distinct(slots: &mut [u32], bits: &mut [u64]) {
    if slots.len() < 64 {
        slots.sort_unstable();
        return;
    }
    for &s in slots.iter() {
        let (w, bit) = (s as usize / 64, 1u64 << (s % 64));
        debug_assert!(bits[w] & bit == 0, "slot {s} twice in one bucket");
        bits[w] |= bit;
    }
    let mut out = 0;
    debug_assert!(slots.iter().all(|&s| (s as usize) < 64 * bits.len()));
    for (w, word) in bits.iter_mut().enumerate() {
        let mut x = std::mem::take(word);
        while x != 0 {
            // out < slots.len(): each mark is one distinct slot of `slots`.
            slots[out] = (w * 64) as u32 + x.trailing_zeros();
            out += 1;
            x &= x - 1;
        }
    }
}

/// The misses of every record of `stream` under `rule` with `slots` regular slots, as
/// [`SwapInState::step`](crate::swap_in::SwapInState::step) would count them.
pub(super) fn replay_stamped(stream: &Stream<'_>, rule: StampRule, slots: usize) -> Result<Vec<u32>> {
    let mut replay = StampedReplay::new(rule, slots, stream.max_len(), stream.records.first().map(|r| r.seq_len))?;
    stream.records.iter().map(|r| replay.record(&r.selected, r.seq_len)).collect()
}

/// One stream's replay under a stamp rule, a record at a time.
pub(super) struct StampedReplay {
    buf: StampedBuffer,
    slots: usize,
    /// Records replayed.
    steps: u32,
}

impl StampedReplay {
    /// A buffer of `slots` regular slots for a stream whose sequences reach `max_len` tokens,
    /// the first being `first_len` long (a first sequence that fits is preloaded).
    pub(super) fn new(rule: StampRule, slots: usize, max_len: usize, first_len: Option<u32>) -> Result<Self> {
        if slots >= usize::from(NO_SLOT) {
            return Err(PolicyError::Invalid {
                field: "buffer_sizes",
                value: slots.to_string(),
                reason: format!("at most {} slots", NO_SLOT - 1),
            });
        }
        let mut buf = StampedBuffer::new(rule, slots, max_len);
        let first_len = first_len.map_or(0, |n| n as usize);
        if first_len <= slots {
            buf.step(&[], first_len.saturating_sub(1), 1);
        }
        Ok(Self { buf, slots, steps: 0 })
    }

    /// The misses of the stream's next record (`selected`: its checked positions).
    pub(super) fn record(&mut self, selected: &[u32], seq_len: u32) -> Result<u32> {
        if selected.len() > hisparse_memory::device_tier::hot_buffer_rows_of(self.slots) {
            return Err(PolicyError::Invalid {
                field: "buffer_sizes",
                value: self.slots.to_string(),
                reason: format!("a selection of {} tokens does not fit", selected.len()),
            });
        }
        self.steps += 1;
        Ok(self.buf.step(selected, seq_len as usize, self.steps))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::{EvictionPolicy, Fifo, Lru};
    use crate::prefetch::NoPrefetch;
    use crate::simulate::replay::replay;
    use crate::trace::{TraceHeader, TraceRecord};

    /// A stream of `steps` selections of `k` positions over a sequence that starts at `start`
    /// tokens and grows by one a step: each selection keeps a `keep` share of the last one, the
    /// rest drawn at random (seeded).
    fn stream(seed: u64, start: usize, steps: usize, k: usize, keep: f64) -> Vec<TraceRecord> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut last: Vec<u32> = Vec::new();
        (0..steps)
            .map(|i| {
                let n = start + i;
                let mut sel: Vec<u32> =
                    last.iter().copied().filter(|_| (rnd() % 1000) as f64 / 1000.0 < keep).collect();
                while sel.len() < k.min(n) {
                    sel.push((rnd() % n as u64) as u32);
                    sel.sort_unstable();
                    sel.dedup();
                }
                if rnd() % 3 == 0 && !sel.contains(&((n - 1) as u32)) {
                    sel.pop();
                    sel.push((n - 1) as u32);
                }
                sel.sort_unstable();
                last = sel.clone();
                TraceRecord { step: i as u32 + 1, seq_len: n as u32, selected: sel, ..TraceRecord::default() }
            })
            .collect()
    }

    fn both(policy: &dyn EvictionPolicy, recs: &[TraceRecord], slots: usize) -> (Vec<u32>, Vec<u32>) {
        let s = Stream { request: 0, layer: 0, records: recs.iter().collect() };
        let fast = replay_stamped(&s, policy.stamp_rule().unwrap(), slots).unwrap();
        let header = TraceHeader { top_k: 4096, layers: 1, ..TraceHeader::default() };
        let slow = replay(&header, &[&s], &[None], (policy, &NoPrefetch), slots, 0).unwrap();
        (fast, slow.misses[0].clone())
    }

    #[test]
    fn the_bucketed_replay_counts_what_the_swap_in_step_counts() {
        let mut total = 0u64;
        for seed in 1..40u64 {
            let start = [5, 40, 100, 129, 300][seed as usize % 5];
            let keep = [0.0, 0.5, 0.9, 0.99][seed as usize % 4];
            let recs = stream(seed, start, 120, 64, keep);
            for slots in [64, 65, 100, 128, 256] {
                for p in [&Lru as &dyn EvictionPolicy, &Fifo] {
                    let (fast, slow) = both(p, &recs, slots);
                    assert_eq!(fast, slow, "{} seed {seed} start {start} slots {slots}", p.name());
                    total += fast.iter().map(|&m| u64::from(m)).sum::<u64>();
                }
            }
        }
        assert!(total > 10_000, "the streams miss: {total}");
    }

    /// Selections of 256 (a step's hits then fill buckets past the bitmap sort's threshold).
    #[test]
    fn the_bucketed_replay_counts_alike_with_large_selections() {
        let mut total = 0u64;
        for seed in 1..8u64 {
            let keep = [0.5, 0.9, 0.99][seed as usize % 3];
            let recs = stream(seed, 600, 60, 256, keep);
            for slots in [256, 300, 640, 1000] {
                let (fast, slow) = both(&Lru, &recs, slots);
                assert_eq!(fast, slow, "seed {seed} slots {slots}");
                total += fast.iter().map(|&m| u64::from(m)).sum::<u64>();
            }
        }
        assert!(total > 5_000, "the streams miss: {total}");
    }

    /// The bitmap sort orders distinct slots as a comparison sort does, and leaves its bits clear.
    #[test]
    fn the_bitmap_sort_sorts_distinct_slots() {
        let mut x = 7u64;
        for n in [0usize, 1, 63, 64, 65, 500, 4000] {
            let mut all: Vec<u32> = (0..4096).collect();
            for i in (1..all.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                all.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut slots = all[..n].to_vec();
            let mut bits = vec![0u64; 64];
            sort_distinct(&mut slots, &mut bits);
            let mut want = all[..n].to_vec();
            want.sort_unstable();
            assert_eq!(slots, want, "{n} slots");
            assert!(bits.iter().all(|&w| w == 0));
        }
    }

    #[test]
    fn the_rules_are_what_the_hooks_do() {
        use crate::policy::{PolicyEnv, SlotRecord, StepCtx};
        for p in [&Lru as &dyn EvictionPolicy, &Fifo] {
            let rule = p.stamp_rule().unwrap();
            for step in [1u32, 7, 1 << 20, u32::MAX / 2] {
                let env = PolicyEnv::of(&StepCtx { step, ..StepCtx::default() }, Default::default());
                let mut r = SlotRecord { a: 12345, b: 99 };
                p.on_insert(&mut r, &env);
                assert_eq!(r.a, StampRule::at(rule.on_insert, step), "{}", p.name());
                assert_eq!(p.priority(&r, &env), u64::from(r.a));
                let before = r;
                p.on_hit(&mut r, &env);
                match rule.on_hit {
                    Some(h) => assert_eq!(r.a, StampRule::at(h, step)),
                    None => assert_eq!(r, before),
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_stream_replays_the_same(seed in 1u64.., start in 1usize..400, keep in 0.0f64..1.0, extra in 0usize..200) {
            let recs = stream(seed, start, 60, 32, keep);
            for p in [&Lru as &dyn EvictionPolicy, &Fifo] {
                let (fast, slow) = both(p, &recs, 32 + extra);
                prop_assert_eq!(fast, slow);
            }
        }
    }
}
