//! CPU sparse decode attention: for each request and head, a softmax over `scale * q . k_i` of
//! the selected rows, then the weighted sum of their values — for MLA rows the key is the whole
//! row and the value its first `d_v` values; for GQA rows each query head reads its group's key
//! and value ([`KvRowLayout::head_offsets`](hisparse_memory::KvRowLayout::head_offsets)). Rows are
//! decoded to f32 once per request; every sum runs in selection order, so the result depends only
//! on the selected rows' bytes and their order — not on where the rows live.

use half::bf16;
use hisparse_memory::{EmulatedDevice, MemoryError};
use rayon::prelude::*;

use super::dot;
use crate::batch::AttentionBatch;
use crate::error::{KernelError, Result, check_len};

/// Rows one rayon task decodes.
const DECODE_ROWS: usize = 128;

pub(super) fn sparse_attention(
    batch: &AttentionBatch<'_, EmulatedDevice>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let heads = batch.heads;
    let layout = batch.layout;
    // A decoded row holds `row_dims` values; a query head `d_q`, an output head `d_v`.
    let (row_dims, d_q, d_v, row_bytes) =
        (layout.row_dims(), layout.query_dim(), layout.value_dim(), layout.row_bytes());
    let n = batch.selections.len();
    if heads == 0 {
        return Err(KernelError::invalid("heads", heads, "must be at least 1"));
    }
    layout.check_query_heads(heads)?;
    if !batch.softmax_scale.is_finite() {
        return Err(KernelError::invalid("softmax_scale", batch.softmax_scale, "must be finite"));
    }
    check_len("queries", n * heads * d_q, batch.queries.len())?;
    check_len("out", n * heads * d_v, out.len())?;
    check_len("lse", n * heads, lse.len())?;
    if !batch.rows.len().is_multiple_of(row_bytes) {
        return Err(KernelError::invalid(
            "rows",
            batch.rows.len(),
            format!("row pool length is not a multiple of the {} row size {row_bytes}", layout.format()),
        ));
    }
    let pool_rows = batch.rows.len() / row_bytes;
    for (i, s) in batch.selections.iter().enumerate() {
        if s.end() > batch.locations.len() {
            return Err(MemoryError::OutOfBounds {
                field: "locations",
                start: s.offset,
                end: s.end(),
                len: batch.locations.len(),
            }
            .into());
        }
        if let Some(&bad) = batch.locations[s.offset..s.end()].iter().find(|&&l| l < 0 || l as usize >= pool_rows) {
            return Err(KernelError::invalid(
                "locations",
                bad,
                format!("request {i}: not a row of the pool of {pool_rows} rows"),
            ));
        }
    }
    // Scales first, so that a bad row fails the call before anything is written.
    if let Some(at) = layout.scales_offset() {
        for s in batch.selections {
            for &loc in &batch.locations[s.offset..s.end()] {
                let row = loc as usize * row_bytes;
                for (b, sc) in batch.rows[row + at..row + layout.bf16_offset()].chunks_exact(4).enumerate() {
                    let v = f32::from_le_bytes([sc[0], sc[1], sc[2], sc[3]]);
                    if !(v.is_finite() && v > 0.0) {
                        return Err(MemoryError::BadScale { field: "kv_row", index: b, value: v }.into());
                    }
                }
            }
        }
    }
    let queries: Vec<f32> = batch.queries.iter().map(|q| bf16::to_f32(*q)).collect();
    if let Some((index, &value)) = queries.iter().enumerate().find(|(_, q)| !q.is_finite()) {
        return Err(MemoryError::NonFinite { field: "queries", index, value }.into());
    }

    out.par_chunks_mut(heads * d_v)
        .zip(lse.par_chunks_mut(heads))
        .zip(batch.selections.par_iter())
        .enumerate()
        .try_for_each(|(i, ((out, lse), sel))| {
            let locs = &batch.locations[sel.offset..sel.end()];
            let mut kv = vec![0f32; locs.len() * row_dims];
            // In blocks of rows on rayon's workers (each row's values are its own).
            kv.par_chunks_mut(DECODE_ROWS * row_dims).zip(locs.par_chunks(DECODE_ROWS)).try_for_each(
                |(dst, locs)| {
                    for (dst, &loc) in dst.chunks_mut(row_dims).zip(locs) {
                        // Locations were checked to be rows of the pool above.
                        let at = loc as usize * row_bytes;
                        layout.decode(&batch.rows[at..at + row_bytes], dst)?;
                    }
                    Ok::<(), MemoryError>(())
                },
            )?;
            let q = &queries[i * heads * d_q..(i + 1) * heads * d_q];
            out.par_chunks_mut(d_v).zip(lse.par_iter_mut()).enumerate().for_each(|(h, (o, l))| {
                let (k_at, v_at) = layout.head_offsets(heads, h);
                let rows = RowView { kv: &kv, stride: row_dims, k_at, v_at };
                *l = attend_one_head(&q[h * d_q..(h + 1) * d_q], rows, batch.softmax_scale, o);
            });
            Ok::<(), KernelError>(())
        })
}

/// Decoded rows (`[n, stride]`) as one head reads them: its key from value `k_at` (as long as the
/// query), its value from `v_at` (as long as the output).
#[derive(Clone, Copy)]
pub(crate) struct RowView<'a> {
    pub kv: &'a [f32],
    pub stride: usize,
    pub k_at: usize,
    pub v_at: usize,
}

/// One head over decoded rows: writes the output to `o` (`d_v`) and returns the log-sum-exp
/// (`-inf` and a zero output for no rows).
pub(crate) fn attend_one_head(q: &[f32], rows: RowView<'_>, scale: f32, o: &mut [f32]) -> f32 {
    o.fill(0.0);
    if rows.kv.is_empty() {
        return f32::NEG_INFINITY;
    }
    let (d_q, d_v) = (q.len(), o.len());
    let logits: Vec<f32> =
        rows.kv.chunks(rows.stride).map(|r| scale * dot(q, &r[rows.k_at..rows.k_at + d_q])).collect();
    let m = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f32;
    for (r, &l) in rows.kv.chunks(rows.stride).zip(&logits) {
        let p = (l - m).exp();
        sum += p;
        for (acc, v) in o.iter_mut().zip(&r[rows.v_at..rows.v_at + d_v]) {
            *acc += p * v;
        }
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x *= inv);
    m + sum.ln()
}
