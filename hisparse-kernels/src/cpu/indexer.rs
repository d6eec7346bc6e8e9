//! CPU lightning indexer: `s_t = scale_t * sum_h w_h * relu(q_h . k~_t)`, where `k~_t` are the key's
//! e4m3 values and `scale_t` its fp32 scale (equal to `sum_h w_h relu(q_h . k_t)` because scales
//! are positive). Keys are found through each request's pages. f32 accumulation; parallel over
//! requests and blocks of positions. With [`IndexerQueries::Fp8`] the queries are first
//! quantised per head exactly as the CUDA kernel quantises them.

use half::bf16;
use hisparse_memory::fp8::E4M3_TABLE;
use hisparse_memory::{EmulatedDevice, IndexKeyFormat, MemoryError};
use rayon::prelude::*;

use super::index_keys::key_row;
use super::{disjoint_spans_mut, dot};
use crate::batch::{IndexScore, IndexerBatch, Span};
use crate::error::{KernelError, Result, check_len};
use crate::index_queries::{IndexerQueries, pow2, quantize_head};

/// Positions scored per rayon task.
const BLOCK: usize = 256;

/// Checks the batch's shapes, pages and stored scales; returns nothing but errors.
fn validate(batch: &IndexerBatch<'_, EmulatedDevice>) -> Result<()> {
    let (heads, dim, p) = (batch.heads, batch.key_layout.dim(), batch.page_tokens);
    let key_bytes = batch.key_layout.row_bytes();
    let n = batch.requests.len();
    if heads == 0 {
        return Err(KernelError::invalid("heads", heads, "must be at least 1"));
    }
    if p == 0 {
        return Err(KernelError::invalid("page_tokens", p, "must be at least 1"));
    }
    check_len("queries", n * heads * dim, batch.queries.len())?;
    check_len("weights", n * heads, batch.weights.len())?;
    let page_bytes = batch.key_layout.page_bytes(p)?;
    // The pool's whole pages; bytes past the last are never read.
    let pool_pages = batch.keys.len() / page_bytes;
    for (i, r) in batch.requests.iter().enumerate() {
        let pages = r.seq_len.div_ceil(p);
        let table = r
            .first_page
            .checked_add(pages)
            .and_then(|end| batch.page_table.get(r.first_page..end))
            .ok_or_else(|| {
                KernelError::invalid(
                    "requests.first_page",
                    r.first_page,
                    format!("request {i}: {pages} pages leave the page table of {} entries", batch.page_table.len()),
                )
            })?;
        if let Some(&bad) = table.iter().find(|&&pg| pg as usize >= pool_pages) {
            return Err(KernelError::invalid(
                "page_table",
                bad,
                format!("request {i}: not a page of the key pool of {pool_pages} pages"),
            ));
        }
    }
    if let Some((index, &value)) = batch.weights.iter().enumerate().find(|(_, w)| !w.is_finite()) {
        return Err(MemoryError::NonFinite { field: "weights", index, value }.into());
    }
    let format = batch.key_layout.format();
    if matches!(batch.score, IndexScore::Lightning) && format != IndexKeyFormat::Fp8 {
        return Err(KernelError::invalid("index_format", format, "the lightning indexer reads fp8 keys"));
    }
    // Stored scales too, so that a bad key fails the call before anything is written.
    // (A page summary's row once, not once per position it holds.)
    // A page's rows at a time (its positions' rows are consecutive), the pages in parallel, the
    // first bad row (by request, then position) reported.
    let (p, per_row) = (batch.page_tokens, batch.key_layout.positions_per_row());
    for r in batch.requests {
        let bad = (0..r.seq_len.div_ceil(p)).into_par_iter().with_min_len(16).find_map_first(|page| {
            let rows = (r.seq_len - page * p).min(p).div_ceil(per_row);
            let first = key_row(batch, r, page * p) * key_bytes;
            batch.key_layout.check_scales_of_rows(&batch.keys[first..first + rows * key_bytes]).err()
        });
        if let Some(e) = bad {
            return Err(e.into());
        }
    }
    Ok(())
}

/// The queries as the scores use them (f32) and the head weights: as given, or, for
/// [`IndexerQueries::Fp8`], every head's queries quantised to e4m3 and its weight times the
/// head's scale.
fn queries_and_weights(batch: &IndexerBatch<'_, EmulatedDevice>) -> (Vec<f32>, Vec<f32>) {
    match batch.queries_as {
        IndexerQueries::Exact => (batch.queries.iter().map(|q| bf16::to_f32(*q)).collect(), batch.weights.to_vec()),
        IndexerQueries::Fp8 => {
            let dim = batch.key_layout.dim();
            let mut codes = vec![0u8; dim];
            let mut q = Vec::with_capacity(batch.queries.len());
            let mut w = Vec::with_capacity(batch.weights.len());
            for (head, &wh) in batch.queries.chunks_exact(dim).zip(batch.weights.iter()) {
                let e = quantize_head(head, &mut codes);
                q.extend(codes.iter().map(|&c| E4M3_TABLE[usize::from(c)]));
                w.push(wh * pow2(e));
            }
            (q, w)
        }
    }
}

pub(super) fn indexer_scores(batch: &IndexerBatch<'_, EmulatedDevice>, scores: &mut [f32]) -> Result<()> {
    validate(batch)?;
    let (heads, dim, key_bytes) = (batch.heads, batch.key_layout.dim(), batch.key_layout.row_bytes());
    let spans: Vec<Span> = batch.requests.iter().map(|r| Span::new(r.score_offset, r.seq_len)).collect();
    let outs = disjoint_spans_mut("scores", scores, &spans)?;
    if let IndexScore::Oracle(oracle) = batch.score {
        let (queries, weights) = queries_and_weights(batch);
        super::oracle_index::oracle_scores(batch, oracle, &queries, &weights, outs);
        return Ok(());
    }

    // Split every request's output into blocks of positions; score the blocks in parallel.
    let mut tasks = Vec::new();
    for (i, out) in outs.into_iter().enumerate() {
        for (b, chunk) in out.chunks_mut(BLOCK).enumerate() {
            tasks.push((i, b * BLOCK, chunk));
        }
    }
    let (queries, weights) = queries_and_weights(batch);
    tasks.into_par_iter().for_each(|(i, start, out)| {
        let r = &batch.requests[i];
        let q = &queries[i * heads * dim..(i + 1) * heads * dim];
        let w = &weights[i * heads..(i + 1) * heads];
        let mut key = vec![0f32; dim];
        for (t, o) in out.iter_mut().enumerate() {
            let row = key_row(batch, r, start + t) * key_bytes;
            let bytes = &batch.keys[row..row + key_bytes];
            let scale = f32::from_le_bytes([bytes[dim], bytes[dim + 1], bytes[dim + 2], bytes[dim + 3]]);
            for (k, &c) in key.iter_mut().zip(&bytes[..dim]) {
                *k = E4M3_TABLE[usize::from(c)];
            }
            let mut s = 0f32;
            for (h, wh) in w.iter().enumerate() {
                s += wh * dot(&q[h * dim..(h + 1) * dim], &key).max(0.0);
            }
            *o = if batch.pin_newest && start + t + 1 == r.seq_len { f32::INFINITY } else { scale * s };
        }
    });
    Ok(())
}
