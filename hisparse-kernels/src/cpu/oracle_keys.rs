//! The oracle's logits `w_h * q_h . k_t` for a block of positions over stored index keys (not
//! page summaries): each key decoded, then a [`dot`] per head over its query's non-zero span;
//! with AVX2 where the CPU has it, and for fp8 keys with F16C the codes converted in registers
//! and multiplied there by every head that reads them — the same products summed in the same
//! order as `dot` sums them, so every path gives the same bits.

use super::dot;
use super::index_keys::key_row;
use crate::batch::{IndexerBatch, IndexerRequest};
use hisparse_memory::EmulatedDevice;

/// A block of positions of one request, and the queries that score them.
#[derive(Clone, Copy)]
pub(super) struct KeyBlock<'a, 'b> {
    pub batch: &'a IndexerBatch<'b, EmulatedDevice>,
    pub r: &'a IndexerRequest,
    /// The block's first position.
    pub first: usize,
    pub q: &'a [f32],
    pub w: &'a [f32],
    /// Each head's non-zero span of its query.
    pub spans: &'a [(usize, usize)],
}

/// The pool rows of the block's first `n` positions: a page's positions are consecutive rows,
/// so the page table is read once per page.
fn key_rows(kb: KeyBlock<'_, '_>, n: usize) -> impl Iterator<Item = usize> {
    let p = kb.batch.page_tokens;
    let (mut row, mut left_in_page) = (0, 0);
    (kb.first..kb.first + n).map(move |t| {
        if left_in_page == 0 {
            row = key_row(kb.batch, kb.r, t);
            left_in_page = p - t % p;
        }
        (row, left_in_page) = (row + 1, left_in_page - 1);
        row - 1
    })
}

/// `logits[j * heads + h] = w_h * q_h . k_t` for the positions `t = first + j` of the block
/// (`logits` holds `[positions, heads]`); `key` holds a decoded key (`dim` values).
pub(super) fn key_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32], key: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        if kb.batch.key_layout.format() == hisparse_memory::IndexKeyFormat::Fp8
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has AVX2 and F16C (checked just above).
            return unsafe { fp8::logits(kb, logits) };
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { key_logits_avx2(kb, logits, key) };
    }
    key_logits_any(kb, logits, key)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn key_logits_avx2(kb: KeyBlock<'_, '_>, logits: &mut [f32], key: &mut [f32]) {
    key_logits_any(kb, logits, key)
}

#[inline(always)]
fn key_logits_any(kb: KeyBlock<'_, '_>, logits: &mut [f32], key: &mut [f32]) {
    let (batch, heads, dim) = (kb.batch, kb.batch.heads, kb.batch.key_layout.dim());
    let key_bytes = batch.key_layout.row_bytes();
    let n = logits.len() / heads;
    for (lt, row) in logits.chunks_mut(heads).zip(key_rows(kb, n)) {
        batch.key_layout.decode_checked(&batch.keys[row * key_bytes..][..key_bytes], key);
        for (h, l) in lt.iter_mut().enumerate() {
            let (a, b) = kb.spans[h];
            *l = kb.w[h] * dot(&kb.q[h * dim + a..h * dim + b], &key[a..b]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod fp8 {
    use std::arch::x86_64::*;

    use hisparse_memory::fp8::{E4M3_TABLE, e4m3x8_scaled};

    use super::{KeyBlock, key_rows};
    use crate::cpu::sum_lanes;

    /// One head's query over its span: whole groups of eight values, then the rest.
    #[derive(Clone, Copy)]
    struct SpanQuery<'a> {
        head: usize,
        chunks: &'a [[f32; 8]],
        tail: &'a [f32],
    }

    /// [`super::key_logits`] over fp8 keys: per group of heads with the same span (at most four
    /// at a time), eight codes at a time converted once and multiplied by each head's query (a
    /// product rounded, then added: `dot`'s lanes), the tail and the lanes' sum as `dot` makes
    /// them.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn logits(kb: KeyBlock<'_, '_>, logits: &mut [f32]) {
        let (batch, heads, dim) = (kb.batch, kb.batch.heads, kb.batch.key_layout.dim());
        let key_bytes = batch.key_layout.row_bytes();
        // Heads by span, in head order, each with its query's span split for the loop.
        let mut groups: Vec<((usize, usize), Vec<SpanQuery<'_>>)> = Vec::new();
        for (h, &(a, b)) in kb.spans.iter().enumerate() {
            let (chunks, tail) = kb.q[h * dim + a..h * dim + b].as_chunks::<8>();
            let sq = SpanQuery { head: h, chunks, tail };
            match groups.iter_mut().find(|(s, _)| *s == (a, b)) {
                Some((_, qs)) => qs.push(sq),
                None => groups.push(((a, b), vec![sq])),
            }
        }
        let n = logits.len() / heads;
        for (lt, row) in logits.chunks_mut(heads).zip(key_rows(kb, n)) {
            let bytes = &batch.keys[row * key_bytes..][..key_bytes];
            // An fp8 key is `dim` codes, then its fp32 scale (checked by the batch's validation).
            let (codes, scale) = bytes.split_at(dim);
            let s = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
            for ((a, b), qs) in &groups {
                let key = Key { chunks: codes[*a..*b].as_chunks::<8>().0, tail: codes[*a..*b].as_chunks::<8>().1, s };
                for qs in qs.chunks(4) {
                    // (`dots` needs AVX2 and F16C, which this function runs with.)
                    match qs {
                        [q0] => put(lt, kb.w, qs, &dots([*q0], key)),
                        [q0, q1] => put(lt, kb.w, qs, &dots([*q0, *q1], key)),
                        [q0, q1, q2] => put(lt, kb.w, qs, &dots([*q0, *q1, *q2], key)),
                        [q0, q1, q2, q3] => put(lt, kb.w, qs, &dots([*q0, *q1, *q2, *q3], key)),
                        _ => {}
                    }
                }
            }
        }
    }

    /// A key's codes over one span: whole groups of eight, the rest, and the key's scale.
    #[derive(Clone, Copy)]
    struct Key<'a> {
        chunks: &'a [[u8; 8]],
        tail: &'a [u8],
        s: f32,
    }

    fn put(lt: &mut [f32], w: &[f32], qs: &[SpanQuery<'_>], dots: &[f32]) {
        for (q, d) in qs.iter().zip(dots) {
            lt[q.head] = w[q.head] * d;
        }
    }

    /// `N` heads' dot products with one key, each as `dot` sums it.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn dots<const N: usize>(qs: [SpanQuery<'_>; N], key: Key<'_>) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        for (i, c8) in key.chunks.iter().enumerate() {
            // SAFETY: this function runs only where the CPU has AVX2 and F16C.
            let k = unsafe { e4m3x8_scaled(*c8, key.s) };
            for (acc, q) in acc.iter_mut().zip(&qs) {
                // SAFETY: a chunk holds exactly eight f32; the load is unaligned.
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(unsafe { _mm256_loadu_ps(q.chunks[i].as_ptr()) }, k));
            }
        }
        let mut out = [0f32; N];
        for ((o, acc), q) in out.iter_mut().zip(acc).zip(&qs) {
            let mut tail = 0f32;
            for (x, &c) in q.tail.iter().zip(key.tail) {
                tail += x * (E4M3_TABLE[usize::from(c)] * key.s);
            }
            // SAFETY: this function runs only where the CPU has AVX2.
            *o = unsafe { sum_lanes(acc, tail) };
        }
        out
    }
}
