//! One replay: a group of a request's streams (every layer together when the prefetcher crosses
//! layers, else one layer) under one policy, prefetcher and buffer size, in the order of
//! [`crate::prefetch`]: per step, layers ascending, this-step nominations applied before their
//! target's swap-in, next-step nominations after the last layer.

use crate::error::Result;
use crate::policy::{EvictionPolicy, StepCtx};
use crate::prefetch::{Candidates, LayerSelection, Nomination, Prefetcher, When};
use crate::swap_in::{Nominated, PrefetchPlan, SwapInPlan, SwapInState, SwapInputs};
use crate::trace::TraceHeader;

use super::Stream;

/// What one replay counted.
#[derive(Clone, Debug, Default)]
pub(super) struct ReplayCounts {
    /// Critical-path misses of each record, per stream of the group.
    pub misses: Vec<Vec<u32>>,
    /// Rows prefetched.
    pub prefetched: u64,
    /// Prefetched rows a selection used.
    pub useful: u64,
    /// Prefetched rows evicted before any selection used them.
    pub wasted: u64,
}

/// A stream's per-position inputs: next uses (offline policies) and this step's scores.
struct StreamInputs {
    next_use: Option<Vec<u32>>,
    scores: Option<Vec<f32>>,
}

/// `next[i][j]`: index of the next record after `i` selecting `records[i].selected[j]`
/// (`u32::MAX`: none); `first[t]`: the first record selecting `t`.
pub(super) fn next_uses(s: &Stream<'_>) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut upcoming = vec![u32::MAX; s.max_len()];
    let mut next: Vec<Vec<u32>> = vec![Vec::new(); s.records.len()];
    for (i, r) in s.records.iter().enumerate().rev() {
        next[i] = r.selected.iter().map(|&t| upcoming[t as usize]).collect();
        for &t in &r.selected {
            upcoming[t as usize] = i as u32;
        }
    }
    (next, upcoming)
}

type Future = (Vec<Vec<u32>>, Vec<u32>);

/// Sets (`on`) or clears the scores a record carries in `scores`.
fn mark_scores(scores: &mut [f32], r: &crate::trace::TraceRecord, on: bool) {
    if let Some(s) = &r.scores {
        for (&t, &v) in r.selected.iter().zip(s) {
            scores[t as usize] = if on { v } else { f32::NAN };
        }
    }
    for &(t, v) in r.near.iter().flatten() {
        scores[t as usize] = if on { v } else { f32::NAN };
    }
}

/// Replays `group` (streams of one request, ascending layers).
pub(super) fn replay(
    header: &TraceHeader,
    group: &[&Stream<'_>],
    futures: &[Option<Future>],
    (policy, prefetcher): (&dyn EvictionPolicy, &dyn Prefetcher),
    slots: usize,
    warmup: usize,
) -> Result<ReplayCounts> {
    let mut states = Vec::with_capacity(group.len());
    let mut inputs = Vec::with_capacity(group.len());
    for (s, fut) in group.iter().zip(futures) {
        let mut st = SwapInState::new(slots)?;
        let first_len = s.records.first().map_or(0, |r| r.seq_len as usize);
        if first_len <= slots {
            st.preload(first_len.saturating_sub(1))?;
        }
        states.push(st);
        inputs.push(StreamInputs {
            next_use: fut.as_ref().map(|(_, first)| first.clone()),
            scores: policy.needs_scores().then(|| vec![f32::NAN; s.max_len()]),
        });
    }
    let mut counts = ReplayCounts {
        misses: group.iter().map(|s| Vec::with_capacity(s.records.len())).collect(),
        ..ReplayCounts::default()
    };
    let (mut plan, mut pplan) = (SwapInPlan::default(), PrefetchPlan::default());
    let mut noms: Vec<Nomination> = Vec::new();
    // Queued nominations: (target index in the group, when, candidates, budget, extra protect).
    let mut queue: Vec<(usize, When, Vec<u32>, usize)> = Vec::new();
    let mut near_buf: Vec<u32> = Vec::new();
    let steps = group.iter().map(|s| s.records.len()).max().unwrap_or(0);
    let ctx_of = |s: &Stream<'_>, i: usize| StepCtx {
        step: i as u32 + 1,
        layer: s.layer,
        request: s.request,
        device_buffer_size: slots as u32,
        seed: policy.seed(),
    };
    for i in 0..steps {
        let counted = u64::from(i >= warmup);
        for g in 0..group.len() {
            let s = group[g];
            let Some(r) = s.records.get(i) else { continue };
            let ctx = ctx_of(s, i);
            let inp = &mut inputs[g];
            if let Some(sc) = inp.scores.as_mut() {
                mark_scores(sc, r, true);
            }
            // This-step nominations for this layer.
            let mut q = 0;
            while q < queue.len() {
                if queue[q].0 == g && queue[q].1 == When::ThisStep {
                    let (_, _, cands, budget) = queue.swap_remove(q);
                    let mut protect = cands.clone();
                    protect.sort_unstable();
                    protect.dedup();
                    let si = SwapInputs { next_use: inp.next_use.as_deref(), scores: inp.scores.as_deref() };
                    let cands: Vec<u32> = cands.into_iter().filter(|&t| t < r.seq_len).collect();
                    let nominated = Nominated { candidates: &cands, protect: &protect, budget };
                    states[g].prefetch(policy, nominated, r.seq_len as usize, &ctx, si, &mut pplan)?;
                    counts.prefetched += counted * pplan.fills.len() as u64;
                    counts.wasted += counted * pplan.wasted as u64;
                } else {
                    q += 1;
                }
            }
            let si = SwapInputs { next_use: inp.next_use.as_deref(), scores: inp.scores.as_deref() };
            states[g].step(policy, &r.selected, r.seq_len as usize, &ctx, si, &mut plan)?;
            counts.misses[g].push(plan.misses.len() as u32);
            counts.useful += counted * plan.prefetch_used as u64;
            counts.wasted += counted * plan.prefetch_wasted as u64;
            if let (Some(nu), Some((next, _))) = (inp.next_use.as_mut(), futures[g].as_ref()) {
                for (&t, &n) in r.selected.iter().zip(&next[i]) {
                    nu[t as usize] = n;
                }
            }
            // Nominations after this layer's selection.
            near_buf.clear();
            near_buf.extend(r.near.iter().flatten().map(|&(t, _)| t));
            let sel = LayerSelection {
                layer: s.layer,
                layers: header.layers,
                step: i as u32 + 1,
                seq_len: r.seq_len as usize,
                top_k: header.top_k as usize,
                selected: &r.selected,
                near: &near_buf,
                index_source: &header.index_source,
            };
            noms.clear();
            prefetcher.nominate(&sel, &mut noms);
            for n in &noms {
                // Targets outside the group (layers the trace lacks) are dropped.
                let Some(tg) = group.iter().position(|x| x.layer == n.target) else { continue };
                if n.when == When::ThisStep && n.target <= s.layer {
                    continue;
                }
                let cands = match n.candidates {
                    Candidates::Selection => r.selected.clone(),
                    Candidates::Near => near_buf.clone(),
                };
                queue.push((tg, n.when, cands, n.budget));
            }
        }
        // Next-step nominations, protecting the target's selection this step.
        let pending: Vec<_> = queue.iter().filter(|x| x.1 == When::NextStep).cloned().collect();
        queue.retain(|x| x.1 != When::NextStep);
        for (g, _, cands, budget) in pending {
            let s = group[g];
            let Some(r) = s.records.get(i) else { continue };
            let mut protect: Vec<u32> = cands.iter().chain(&r.selected).copied().collect();
            protect.sort_unstable();
            protect.dedup();
            let inp = &inputs[g];
            let si = SwapInputs { next_use: inp.next_use.as_deref(), scores: inp.scores.as_deref() };
            let nominated = Nominated { candidates: &cands, protect: &protect, budget };
            states[g].prefetch(policy, nominated, r.seq_len as usize, &ctx_of(s, i), si, &mut pplan)?;
            counts.prefetched += counted * pplan.fills.len() as u64;
            counts.wasted += counted * pplan.wasted as u64;
        }
        for (g, s) in group.iter().enumerate() {
            if let (Some(sc), Some(r)) = (inputs[g].scores.as_mut(), s.records.get(i)) {
                mark_scores(sc, r, false);
            }
        }
        // This-step nominations whose target had no record this step are dropped.
        queue.clear();
    }
    Ok(counts)
}
