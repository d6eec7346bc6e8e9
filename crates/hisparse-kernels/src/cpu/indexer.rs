//! CPU lightning indexer: `s_t = scale_t * sum_h w_h * relu(q_h . k~_t)`, where `k~_t` are the key's
//! e4m3 values and `scale_t` its fp32 scale (equal to `sum_h w_h relu(q_h . k_t)` because scales
//! are positive). f32 accumulation; parallel over requests and blocks of positions.

use half::bf16;
use hisparse_memory::fp8::E4M3_TABLE;
use hisparse_memory::{EmulatedDevice, MemoryError};
use rayon::prelude::*;

use super::{disjoint_spans_mut, dot};
use crate::backend::{IndexerBatch, Span};
use crate::error::{KernelError, Result, check_len};

/// Positions scored per rayon task.
const BLOCK: usize = 256;

pub(super) fn indexer_scores(
    batch: &IndexerBatch<'_, EmulatedDevice>,
    scores: &mut [f32],
) -> Result<()> {
    let heads = batch.heads;
    let dim = batch.key_layout.dim();
    let key_bytes = batch.key_layout.row_bytes();
    let n = batch.requests.len();
    if heads == 0 {
        return Err(KernelError::invalid("heads", heads, "must be at least 1"));
    }
    check_len("queries", n * heads * dim, batch.queries.len())?;
    check_len("weights", n * heads, batch.weights.len())?;
    if !batch.keys.len().is_multiple_of(key_bytes) {
        return Err(KernelError::invalid(
            "keys",
            batch.keys.len(),
            format!("key pool length is not a multiple of the key size {key_bytes}"),
        ));
    }
    let pool_rows = batch.keys.len() / key_bytes;
    for (i, r) in batch.requests.iter().enumerate() {
        if r.first_key
            .checked_add(r.seq_len)
            .is_none_or(|end| end > pool_rows)
        {
            return Err(KernelError::invalid(
                "requests.first_key",
                r.first_key,
                format!(
                    "request {i}: keys {}..{} leave the pool of {pool_rows} rows",
                    r.first_key,
                    r.first_key.saturating_add(r.seq_len)
                ),
            ));
        }
    }
    if let Some((index, &value)) = batch
        .weights
        .iter()
        .enumerate()
        .find(|(_, w)| !w.is_finite())
    {
        return Err(MemoryError::NonFinite {
            field: "weights",
            index,
            value,
        }
        .into());
    }
    // Scales first, so that a bad key fails the call before anything is written.
    for r in batch.requests {
        for t in r.first_key..r.first_key + r.seq_len {
            batch
                .key_layout
                .scale(&batch.keys[t * key_bytes..(t + 1) * key_bytes])?;
        }
    }
    let spans: Vec<Span> = batch
        .requests
        .iter()
        .map(|r| Span::new(r.score_offset, r.seq_len))
        .collect();
    let outs = disjoint_spans_mut("scores", scores, &spans)?;

    // Split every request's output into blocks of positions; score the blocks in parallel.
    let mut tasks = Vec::new();
    for (i, out) in outs.into_iter().enumerate() {
        for (b, chunk) in out.chunks_mut(BLOCK).enumerate() {
            tasks.push((i, b * BLOCK, chunk));
        }
    }
    let queries: Vec<f32> = batch.queries.iter().map(|q| bf16::to_f32(*q)).collect();
    tasks.into_par_iter().try_for_each(|(i, start, out)| {
        let r = &batch.requests[i];
        let q = &queries[i * heads * dim..(i + 1) * heads * dim];
        let w = &batch.weights[i * heads..(i + 1) * heads];
        let mut key = vec![0f32; dim];
        for (t, o) in out.iter_mut().enumerate() {
            let row = (r.first_key + start + t) * key_bytes;
            let bytes = &batch.keys[row..row + key_bytes];
            let scale = batch.key_layout.scale(bytes)?;
            for (k, &c) in key.iter_mut().zip(&bytes[..dim]) {
                *k = E4M3_TABLE[usize::from(c)];
            }
            let mut s = 0f32;
            for (h, wh) in w.iter().enumerate() {
                s += wh * dot(&q[h * dim..(h + 1) * dim], &key).max(0.0);
            }
            *o = scale * s;
        }
        Ok(())
    })
}
