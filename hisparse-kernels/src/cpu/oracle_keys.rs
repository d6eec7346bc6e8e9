//! The oracle's logits `w_h * q_h . k_t` for a block of positions over stored index keys (not
//! page summaries): each key decoded, then a [`dot`] per head over its query's non-zero span.
//! Where the CPU has AVX2 and F16C, the heads reading the same span share each eight values of
//! the key (fp8 codes converted in registers, other formats decoded once per key) — the same
//! products summed in the same order as `dot` sums them, so every path gives the same bits.
//! Top-channel keys are scored over their kept channels alone (`oracle_channels.rs`).

use super::dot;
use super::key_block::{KeyBlock, key_rows};
#[cfg(test)]
use crate::batch::{IndexerBatch, IndexerRequest};
#[cfg(test)]
use hisparse_memory::EmulatedDevice;

/// `logits[j * heads + h] = w_h * q_h . k_t` for the positions `t = first + j` of the block
/// (`logits` holds `[positions, heads]`); `key` holds a decoded key (`dim` values).
pub(super) fn key_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32], key: &mut [f32]) {
    if let hisparse_memory::IndexKeyFormat::Channels { keep, group } = kb.batch.key_layout.format() {
        return super::oracle_channels::channel_logits(kb, logits, keep, group);
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        if kb.batch.key_layout.format() == hisparse_memory::IndexKeyFormat::Fp8 {
            // SAFETY: the CPU has AVX2 and F16C (checked just above).
            return unsafe { grouped::fp8_logits(kb, logits) };
        }
        // SAFETY: the CPU has AVX2 and F16C (checked just above).
        return unsafe { grouped::decoded_logits(kb, logits, key) };
    }
    key_logits_any(kb, logits, key)
}

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

/// The AVX2 paths: heads grouped by the span of their query (a GQA group's heads read the same
/// part of the key), each eight values of the key loaded once and multiplied by every head of
/// the group (a product rounded, then added: `dot`'s lanes), the tail and the lanes' sum as
/// `dot` makes them.
#[cfg(target_arch = "x86_64")]
mod grouped {
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

    /// The heads of `kb`, grouped by span in head order.
    fn span_groups<'a>(kb: KeyBlock<'a, '_>, dim: usize) -> Vec<((usize, usize), Vec<SpanQuery<'a>>)> {
        let mut groups: Vec<((usize, usize), Vec<SpanQuery<'a>>)> = Vec::new();
        for (h, &(a, b)) in kb.spans.iter().enumerate() {
            let (chunks, tail) = kb.q[h * dim + a..h * dim + b].as_chunks::<8>();
            let sq = SpanQuery { head: h, chunks, tail };
            match groups.iter_mut().find(|(s, _)| *s == (a, b)) {
                Some((_, qs)) => qs.push(sq),
                None => groups.push(((a, b), vec![sq])),
            }
        }
        groups
    }

    /// One key over one span, eight values at a time.
    trait SpanKey: Copy {
        /// Values `8i .. 8i + 8` of the span.
        ///
        /// # Safety
        /// The CPU must have AVX2 and F16C; `i` is below the span's whole groups of eight.
        unsafe fn chunk(self, i: usize) -> __m256;
        /// Value `j` past the span's whole groups of eight.
        fn tail(self, j: usize) -> f32;
    }

    /// An fp8 key's codes over one span and the key's scale.
    #[derive(Clone, Copy)]
    struct Fp8Key<'a> {
        chunks: &'a [[u8; 8]],
        tail: &'a [u8],
        s: f32,
    }

    impl SpanKey for Fp8Key<'_> {
        #[inline(always)]
        unsafe fn chunk(self, i: usize) -> __m256 {
            // SAFETY: the caller's CPU has AVX2 and F16C.
            unsafe { e4m3x8_scaled(self.chunks[i], self.s) }
        }
        #[inline(always)]
        fn tail(self, j: usize) -> f32 {
            E4M3_TABLE[usize::from(self.tail[j])] * self.s
        }
    }

    /// A decoded key's values over one span.
    #[derive(Clone, Copy)]
    struct DecodedKey<'a> {
        chunks: &'a [[f32; 8]],
        tail: &'a [f32],
    }

    impl SpanKey for DecodedKey<'_> {
        #[inline(always)]
        unsafe fn chunk(self, i: usize) -> __m256 {
            // SAFETY: a chunk holds exactly eight f32; the load is unaligned.
            unsafe { _mm256_loadu_ps(self.chunks[i].as_ptr()) }
        }
        #[inline(always)]
        fn tail(self, j: usize) -> f32 {
            self.tail[j]
        }
    }

    /// [`super::key_logits`] over fp8 keys: the codes converted in registers, never decoded to
    /// memory.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn fp8_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32]) {
        let (batch, heads, dim) = (kb.batch, kb.batch.heads, kb.batch.key_layout.dim());
        let key_bytes = batch.key_layout.row_bytes();
        let groups = span_groups(kb, dim);
        let n = logits.len() / heads;
        for (lt, row) in logits.chunks_mut(heads).zip(key_rows(kb, n)) {
            let bytes = &batch.keys[row * key_bytes..][..key_bytes];
            // An fp8 key is `dim` codes, then its fp32 scale (checked by the batch's validation).
            let (codes, scale) = bytes.split_at(dim);
            let s = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
            for ((a, b), qs) in &groups {
                let (chunks, tail) = codes[*a..*b].as_chunks::<8>();
                // (`heads_dots` needs AVX2 and F16C, which this function runs with.)
                heads_dots(lt, kb.w, qs, Fp8Key { chunks, tail, s });
            }
        }
    }

    /// [`super::key_logits`] over keys of any other format: each key decoded once into `key`,
    /// then read by every group of heads.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn decoded_logits(kb: KeyBlock<'_, '_>, logits: &mut [f32], key: &mut [f32]) {
        let (batch, heads, dim) = (kb.batch, kb.batch.heads, kb.batch.key_layout.dim());
        let key_bytes = batch.key_layout.row_bytes();
        let groups = span_groups(kb, dim);
        let n = logits.len() / heads;
        for (lt, row) in logits.chunks_mut(heads).zip(key_rows(kb, n)) {
            batch.key_layout.decode_checked(&batch.keys[row * key_bytes..][..key_bytes], key);
            for ((a, b), qs) in &groups {
                let (chunks, tail) = key[*a..*b].as_chunks::<8>();
                heads_dots(lt, kb.w, qs, DecodedKey { chunks, tail });
            }
        }
    }

    /// `lt[h] = w_h * q_h . key` for the heads `qs` (one span), at most four at a time.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn heads_dots(lt: &mut [f32], w: &[f32], qs: &[SpanQuery<'_>], key: impl SpanKey) {
        for qs in qs.chunks(4) {
            match qs {
                [q0] => put(lt, w, qs, &dots([*q0], key)),
                [q0, q1] => put(lt, w, qs, &dots([*q0, *q1], key)),
                [q0, q1, q2] => put(lt, w, qs, &dots([*q0, *q1, *q2], key)),
                [q0, q1, q2, q3] => put(lt, w, qs, &dots([*q0, *q1, *q2, *q3], key)),
                _ => {}
            }
        }
    }

    fn put(lt: &mut [f32], w: &[f32], qs: &[SpanQuery<'_>], dots: &[f32]) {
        for (q, d) in qs.iter().zip(dots) {
            lt[q.head] = w[q.head] * d;
        }
    }

    /// `N` heads' dot products with one key, each as `dot` sums it.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn dots<const N: usize>(qs: [SpanQuery<'_>; N], key: impl SpanKey) -> [f32; N] {
        let mut acc = [_mm256_setzero_ps(); N];
        // Every head of `qs` has the key's span: as many whole groups of eight.
        for i in 0..qs[0].chunks.len() {
            // SAFETY: this function runs only where the CPU has AVX2 and F16C; `i` is below the
            // span's whole groups.
            let k = unsafe { key.chunk(i) };
            for (acc, q) in acc.iter_mut().zip(&qs) {
                // SAFETY: a chunk holds exactly eight f32; the load is unaligned.
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(unsafe { _mm256_loadu_ps(q.chunks[i].as_ptr()) }, k));
            }
        }
        let mut out = [0f32; N];
        for ((o, acc), q) in out.iter_mut().zip(acc).zip(&qs) {
            let mut tail = 0f32;
            for (j, x) in q.tail.iter().enumerate() {
                tail += x * key.tail(j);
            }
            // SAFETY: this function runs only where the CPU has AVX2.
            *o = unsafe { sum_lanes(acc, tail) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
    use half::bf16;
    use hisparse_memory::{IndexKeyFormat, IndexKeyLayout};

    use super::*;
    use crate::IndexerQueries;
    use crate::batch::IndexScore;

    /// Every path of `key_logits` (fp8 in registers, other formats decoded once per key, heads
    /// grouped by span) gives the bits of the portable per-head `dot`s, and top-channel keys the
    /// bits of `dot` over the kept channels of each head's span, for spans shared by one to five
    /// heads, spans with a tail, and an empty span.
    #[test]
    fn every_key_path_gives_the_portable_bits() {
        let (dim, page, n) = (192usize, 16usize, 77usize);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        // Heads 0-2, 3-7 and 8-10 share the three 64-value groups; 11 a span with a tail; 12 an
        // empty query.
        let spans: Vec<(usize, usize)> = (0..13)
            .map(|h| match h {
                0..=2 => (0, 64),
                3..=7 => (64, 128),
                8..=10 => (128, 192),
                11 => (5, 131),
                _ => (0, 0),
            })
            .collect();
        let heads = spans.len();
        let mut q = vec![0f32; heads * dim];
        for (h, &(a, b)) in spans.iter().enumerate() {
            for x in &mut q[h * dim + a..h * dim + b] {
                *x = next();
            }
        }
        let w: Vec<f32> = (0..heads).map(|h| 0.125 + 0.01 * h as f32).collect();
        let pages = n.div_ceil(page);
        let table: Vec<u32> = (0..pages as u32).rev().collect();
        let formats = [
            IndexKeyFormat::Fp8,
            IndexKeyFormat::Int4 { group: 32 },
            IndexKeyFormat::Int2 { group: 32 },
            IndexKeyFormat::Channels { keep: 16, group: 64 },
            IndexKeyFormat::Channels { keep: 3, group: 8 },
        ];
        for format in formats {
            let layout = IndexKeyLayout::with_format(dim, format).unwrap();
            let rb = layout.row_bytes();
            let mut keys = vec![0u8; pages * page * rb];
            let mut values = vec![0f32; dim];
            for row in keys.chunks_exact_mut(rb) {
                values.iter_mut().for_each(|v| *v = 3.0 * next());
                layout.encode(&values, row).unwrap();
            }
            let (qb, wb) = (vec![bf16::ZERO; heads * dim], w.clone());
            let requests = [IndexerRequest { first_page: 0, seq_len: n, score_offset: 0 }];
            let batch = IndexerBatch::<EmulatedDevice> {
                heads,
                key_layout: layout,
                queries: &qb,
                weights: &wb,
                keys: &keys,
                page_tokens: page,
                page_table: &table,
                requests: &requests,
                pin_newest: false,
                queries_as: IndexerQueries::Exact,
                score: IndexScore::Lightning,
            };
            let kb = KeyBlock { batch: &batch, r: &requests[0], first: 3, q: &q, w: &w, spans: &spans };
            let (mut got, mut want, mut key) = (vec![0f32; 70 * heads], vec![0f32; 70 * heads], vec![0f32; dim]);
            key_logits(kb, &mut got, &mut key);
            if let IndexKeyFormat::Channels { keep, group } = format {
                // The query at the kept places of the span against the decoded key there, as
                // `dot` sums them; the places read from the row's first bytes.
                let rows: Vec<usize> = key_rows(kb, 70).collect();
                for (lt, row) in want.chunks_mut(heads).zip(rows) {
                    let bytes = &keys[row * rb..][..rb];
                    layout.decode(bytes, &mut key).unwrap();
                    for (h, l) in lt.iter_mut().enumerate() {
                        let (a, b) = spans[h];
                        let kept = (0..dim / group * keep).map(|j| j / keep * group + usize::from(bytes[j]));
                        let (qa, ka): (Vec<f32>, Vec<f32>) =
                            kept.filter(|c| (a..b).contains(c)).map(|c| (q[h * dim + c], key[c])).unzip();
                        *l = w[h] * dot(&qa, &ka);
                    }
                }
            } else {
                key_logits_any(kb, &mut want, &mut key);
            }
            assert!(want.iter().any(|&x| x != 0.0), "{format}: the logits are not all zero");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{format}");
        }
    }
}
