//! CPU top-k: the `k` highest scores of each request, ties to the lower position, returned as
//! positions in ascending order. Scores are ordered by IEEE total order (`f32::total_cmp`: NaN
//! above +inf, -0 below +0), so the selection is a unique, well-defined set.

use rayon::prelude::*;

use crate::batch::Span;
use crate::error::{KernelError, Result};

/// Maps an f32 to a u32 whose unsigned order is the float's total order.
#[inline]
fn ordered_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
}

/// The `k` best positions of `scores` (highest score first, then lowest position), written to
/// `out` in ascending position order. `k <= scores.len()` and `out.len() == k` are the caller's
/// to check.
pub fn top_k_positions(scores: &[f32], k: usize, out: &mut [i32]) {
    if k == 0 {
        return;
    }
    // Smaller key = better: the complemented score order in the high half, the position below.
    let mut keys: Vec<u64> =
        scores.iter().enumerate().map(|(i, &s)| (u64::from(!ordered_bits(s)) << 32) | i as u64).collect();
    if k < keys.len() {
        keys.select_nth_unstable(k - 1);
    }
    for (o, key) in out.iter_mut().zip(&keys[..k]) {
        // The low half is a position < 2^31 (checked by the caller), so it fits an i32.
        *o = (key & 0xffff_ffff) as i32;
    }
    out.sort_unstable();
}

/// Checks a top-k call's spans against `k` and the scores' length (shared by every backend).
pub(crate) fn check_spans(spans: &[Span], k: usize, scores_len: usize) -> Result<()> {
    for (request, s) in spans.iter().enumerate() {
        if s.len < k {
            return Err(KernelError::TopKExceedsLength { request, top_k: k, seq_len: s.len });
        }
        if s.len > i32::MAX as usize {
            return Err(KernelError::invalid("spans.len", s.len, "positions must fit in an i32"));
        }
        if s.end() > scores_len {
            return Err(hisparse_memory::MemoryError::OutOfBounds {
                field: "scores",
                start: s.offset,
                end: s.end(),
                len: scores_len,
            }
            .into());
        }
    }
    Ok(())
}

pub(super) fn top_k(scores: &[f32], spans: &[Span], k: usize, out: &mut [i32]) -> Result<()> {
    let want = spans.len() * k;
    if out.len() < want {
        return Err(KernelError::invalid("out", out.len(), format!("{} spans of top-{k} need {want}", spans.len())));
    }
    check_spans(spans, k, scores.len())?;
    if k == 0 {
        return Ok(());
    }
    out[..want]
        .par_chunks_mut(k)
        .zip(spans.par_iter())
        .for_each(|(o, s)| top_k_positions(&scores[s.offset..s.end()], k, o));
    Ok(())
}
