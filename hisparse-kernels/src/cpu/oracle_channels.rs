//! The oracle's logits over top-channel keys (`channels:keep:group`): a head's product with a
//! key runs over the key's kept channels of the head's span alone — the query's values at the
//! kept places against the kept values, summed as [`dot`] sums two vectors (a quarter of the
//! products of a dense key for `channels:16:64`). Where the CPU has AVX2, a head whose span is
//! one whole group gathers its query's values eight at a time; the same products and sums, so
//! every path gives the same bits.

use super::dot;
use super::key_block::{KeyBlock, key_rows};

/// What a head's span covers of the key's groups.
#[derive(Clone, Copy)]
enum Reach {
    /// Exactly group `g`.
    Whole(usize),
    /// Anything else (part of a group, several, or nothing).
    Partial,
}

/// `logits[j * heads + h] = w_h * (q_h . k_t over k_t's kept channels of h's span)` for the
/// positions `t = first + j` of the block.
pub(super) fn channel_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32], keep: usize, group: usize) {
    #[cfg(target_arch = "x86_64")]
    if keep.is_multiple_of(8) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above); `keep` is a multiple of eight.
        return unsafe { avx2::channel_logits(kb, logits, keep, group) };
    }
    let (mut s, n) = (Scratch::new(kb, group), logits.len() / kb.batch.heads);
    for (lt, row) in logits.chunks_mut(kb.batch.heads).zip(key_rows(kb, n)) {
        let Some(places) = s.decode(kb, row) else { return };
        for (h, l) in lt.iter_mut().enumerate() {
            *l = kb.w[h] * s.partial_dot(kb, h, places, keep, group);
        }
    }
}

/// A block's per-head reach and a key's scratch values.
struct Scratch {
    reach: Vec<Reach>,
    /// A key's kept values, then a head's gathered query values and the kept values they meet.
    vals: Vec<f32>,
    qa: Vec<f32>,
    va: Vec<f32>,
}

impl Scratch {
    fn new(kb: KeyBlock<'_, '_>, group: usize) -> Self {
        let dim = kb.batch.key_layout.dim();
        let reach = kb
            .spans
            .iter()
            .map(|&(a, b)| if a % group == 0 && b == a + group { Reach::Whole(a / group) } else { Reach::Partial })
            .collect();
        Self { reach, vals: vec![0f32; dim], qa: vec![0f32; dim], va: vec![0f32; dim] }
    }

    /// Decodes the key of pool row `row` into `vals`; returns its places (`None` for a layout
    /// without kept values, which the caller matched away).
    #[inline(always)]
    fn decode<'k>(&mut self, kb: KeyBlock<'k, '_>, row: usize) -> Option<&'k [u8]> {
        let key_bytes = kb.batch.key_layout.row_bytes();
        kb.batch.key_layout.decode_kept(&kb.batch.keys[row * key_bytes..][..key_bytes], &mut self.vals)
    }

    /// Head `h`'s product with the decoded key: its query at the kept places of its span
    /// against the kept values there, as [`dot`] sums them.
    fn partial_dot(&mut self, kb: KeyBlock<'_, '_>, h: usize, places: &[u8], keep: usize, group: usize) -> f32 {
        let dim = kb.batch.key_layout.dim();
        let (q, (a, b)) = (&kb.q[h * dim..(h + 1) * dim], kb.spans[h]);
        let mut m = 0;
        for g in a / group..b.div_ceil(group) {
            let kept = g * keep..(g + 1) * keep;
            for (&p, &v) in places[kept.clone()].iter().zip(&self.vals[kept]) {
                // Places lie below `group` (the batch's rows were checked): `c < dim`.
                let c = g * group + usize::from(p);
                if (a..b).contains(&c) {
                    (self.qa[m], self.va[m], m) = (q[c], v, m + 1);
                }
            }
        }
        dot(&self.qa[..m], &self.va[..m])
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{KeyBlock, Reach, Scratch, key_rows};
    use crate::cpu::sum_lanes;

    /// [`super::channel_logits`] where the CPU has AVX2 and `keep` is a multiple of eight: a head
    /// whose span is one whole group gathers its query's values.
    ///
    /// # Safety
    /// The CPU must have AVX2; `keep` must be a multiple of eight.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn channel_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32], keep: usize, group: usize) {
        let (heads, dim) = (kb.batch.heads, kb.batch.key_layout.dim());
        let (mut s, n) = (Scratch::new(kb, group), logits.len() / heads);
        for (lt, row) in logits.chunks_mut(heads).zip(key_rows(kb, n)) {
            let Some(places) = s.decode(kb, row) else { return };
            for (h, l) in lt.iter_mut().enumerate() {
                let d = match s.reach[h] {
                    Reach::Whole(g) => {
                        let (q, kept) =
                            (&kb.q[h * dim + g * group..h * dim + (g + 1) * group], g * keep..(g + 1) * keep);
                        // SAFETY: this function runs only where the CPU has AVX2; `keep` is a
                        // multiple of eight.
                        unsafe { gathered_dot(q, &places[kept.clone()], &s.vals[kept]) }
                    }
                    Reach::Partial => s.partial_dot(kb, h, places, keep, group),
                };
                *l = kb.w[h] * d;
            }
        }
    }

    /// `dot(q at places, vals)` for one group: `q` the group's query values, `places` and
    /// `vals` its kept places and values (`places.len() == vals.len()`, a multiple of eight).
    /// A place past `q` reads `q`'s last value (checked rows have none).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn gathered_dot(q: &[f32], places: &[u8], vals: &[f32]) -> f32 {
        let last = _mm256_set1_epi32(q.len().saturating_sub(1) as i32);
        let mut acc = _mm256_setzero_ps();
        for (p, v) in places.chunks_exact(8).zip(vals.chunks_exact(8)) {
            // SAFETY: `p` holds eight bytes, `v` eight f32 (chunks_exact); the loads are
            // unaligned. Every index is clamped to `q`'s last value, so the gather reads `q`.
            unsafe {
                let idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.as_ptr().cast()));
                let idx = _mm256_min_epi32(idx, last);
                let x = _mm256_i32gather_ps::<4>(q.as_ptr(), idx);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(x, _mm256_loadu_ps(v.as_ptr())));
            }
        }
        // SAFETY: this function runs only where the CPU has AVX2; no tail (whole chunks).
        unsafe { sum_lanes(acc, 0.0) }
    }
}
