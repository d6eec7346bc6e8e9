//! The oracle selection of a model without an indexer ([`IndexScore::Oracle`](crate::IndexScore)):
//! per head the softmax over a request's positions of `w_h * q_h . k_t` (the model's own
//! attention weights, its keys stored as index keys), combined over heads by sum or max; the
//! first `sink` and last `window` positions scored `+inf`. With page summaries (Quest) a
//! position's `q_h . k_t` is the largest product over its page's box, shared by the page. A head's product runs over its
//! query's non-zero span only (a GQA head's query fills its group's part of the key), so a
//! head costs its own dims, not the whole key's. Every sum runs in a fixed order, so the scores
//! are the same bits on every run; the exponentials are [`super::exp`]'s (the same bits with
//! and without AVX2).

use rayon::prelude::*;

use super::exp::exp_in_place;
use super::index_keys::{key_bounds, key_row};
use super::key_block::KeyBlock;
use super::oracle_keys::key_logits;
use crate::batch::{HeadCombine, IndexerBatch, OracleScore};
use hisparse_memory::{EmulatedDevice, page_upper_bound};

/// Positions whose logits one rayon task computes.
const BLOCK: usize = 256;

/// Scores every request of a validated batch into its own output slice.
pub(super) fn oracle_scores(
    batch: &IndexerBatch<'_, EmulatedDevice>,
    oracle: OracleScore,
    queries: &[f32],
    weights: &[f32],
    outs: Vec<&mut [f32]>,
) {
    let (heads, dim) = (batch.heads, batch.key_layout.dim());
    outs.into_par_iter().enumerate().for_each(|(i, out)| {
        let r = &batch.requests[i];
        let q = &queries[i * heads * dim..(i + 1) * heads * dim];
        let w = &weights[i * heads..(i + 1) * heads];
        // Each head's non-zero span of its query (empty for an all-zero query).
        let spans: Vec<(usize, usize)> = q
            .chunks(dim)
            .map(|qh| match (qh.iter().position(|x| *x != 0.0), qh.iter().rposition(|x| *x != 0.0)) {
                (Some(a), Some(b)) => (a, b + 1),
                _ => (0, 0),
            })
            .collect();
        let n = r.seq_len;
        // logits[t * heads + h] = w_h * q_h . k_t, in blocks of positions.
        let mut logits = vec![0f32; n * heads];
        let summaries = batch.key_layout.positions_per_row() > 1;
        logits.par_chunks_mut(BLOCK * heads).enumerate().for_each(|(b, chunk)| {
            let (mut key, mut maxs) = (vec![0f32; dim], vec![0f32; if summaries { dim } else { 0 }]);
            // The pool row whose logits `row` holds: a page summary's positions share them.
            let (mut held, mut row) = (usize::MAX, vec![0f32; heads]);
            if !summaries {
                key_logits(KeyBlock { batch, r, first: b * BLOCK, q, w, spans: &spans }, chunk, &mut key);
                return;
            }
            for (j, lt) in chunk.chunks_mut(heads).enumerate() {
                let t = b * BLOCK + j;
                let at = key_row(batch, r, t);
                if at != held {
                    held = at;
                    key_bounds(batch, at, &mut key, &mut maxs);
                    for (h, l) in row.iter_mut().enumerate() {
                        let (a, b) = spans[h];
                        *l = w[h] * page_upper_bound(&q[h * dim + a..h * dim + b], &key[a..b], &maxs[a..b]);
                    }
                }
                lt.copy_from_slice(&row);
            }
        });
        // Per head: the largest logit (in parallel blocks: a maximum is the same in any order),
        // every exponential below it (in parallel, in place), then their sum in position order.
        let max = logits
            .par_chunks(BLOCK * heads)
            .map(|chunk| {
                let mut m = vec![f32::NEG_INFINITY; heads];
                for lt in chunk.chunks(heads) {
                    for (m, &l) in m.iter_mut().zip(lt) {
                        *m = m.max(l);
                    }
                }
                m
            })
            .reduce(|| vec![f32::NEG_INFINITY; heads], |a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
        logits.par_chunks_mut(BLOCK * heads).for_each(|chunk| {
            for lt in chunk.chunks_mut(heads) {
                for (l, &m) in lt.iter_mut().zip(&max) {
                    *l -= m;
                }
            }
            exp_in_place(chunk);
        });
        let exps = logits;
        let mut sum = vec![0f32; heads];
        for et in exps.chunks(heads) {
            for (s, &e) in sum.iter_mut().zip(et) {
                *s += e;
            }
        }
        let inv: Vec<f32> = sum.iter().map(|s| 1.0 / s).collect();
        out.par_iter_mut().zip(exps.par_chunks(heads)).enumerate().for_each(|(t, (o, et))| {
            let kept = t < oracle.sink || t + oracle.window >= n || (batch.pin_newest && t + 1 == n);
            *o = if kept {
                f32::INFINITY
            } else {
                let p = et.iter().zip(&inv).map(|(&e, &iv)| e * iv);
                match oracle.combine {
                    HeadCombine::Sum => p.sum(),
                    HeadCombine::Max => p.fold(0f32, f32::max),
                }
            };
        });
    });
}
