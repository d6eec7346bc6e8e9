//! CPU sparse MLA decode attention: for each request and head, a softmax over `scale * q . k_i` of
//! the selected rows, then the weighted sum of their first `d_v` values. Rows are decoded to f32
//! once per request; every sum runs in selection order, so the result depends only on the
//! selected rows' bytes and their order — not on where the rows live.

use half::bf16;
use hisparse_memory::{EmulatedDevice, MemoryError};
use rayon::prelude::*;

use super::dot;
use crate::batch::AttentionBatch;
use crate::error::{KernelError, Result, check_len};

pub(super) fn sparse_attention(
    batch: &AttentionBatch<'_, EmulatedDevice>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let heads = batch.heads;
    let layout = batch.layout;
    let (d_qk, d_v, row_bytes) = (layout.d_qk(), layout.d_latent(), layout.row_bytes());
    let n = batch.selections.len();
    if heads == 0 {
        return Err(KernelError::invalid("heads", heads, "must be at least 1"));
    }
    if !batch.softmax_scale.is_finite() {
        return Err(KernelError::invalid("softmax_scale", batch.softmax_scale, "must be finite"));
    }
    check_len("queries", n * heads * d_qk, batch.queries.len())?;
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
                for (b, sc) in batch.rows[row + at..row + layout.rope_offset()].chunks_exact(4).enumerate() {
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
            let mut kv = vec![0f32; locs.len() * d_qk];
            for (dst, &loc) in kv.chunks_mut(d_qk).zip(locs) {
                // Locations were checked to be rows of the pool above.
                let at = loc as usize * row_bytes;
                layout.decode(&batch.rows[at..at + row_bytes], dst)?;
            }
            let q = &queries[i * heads * d_qk..(i + 1) * heads * d_qk];
            out.par_chunks_mut(d_v).zip(lse.par_iter_mut()).enumerate().for_each(|(h, (o, l))| {
                *l = attend_one_head(&q[h * d_qk..(h + 1) * d_qk], &kv, d_qk, d_v, batch.softmax_scale, o);
            });
            Ok::<(), KernelError>(())
        })
}

/// One head over decoded rows `kv` (`[n, d_qk]`): writes the output to `o` (`d_v`) and returns the
/// log-sum-exp (`-inf` and a zero output for no rows).
pub(crate) fn attend_one_head(q: &[f32], kv: &[f32], d_qk: usize, d_v: usize, scale: f32, o: &mut [f32]) -> f32 {
    o.fill(0.0);
    if kv.is_empty() {
        return f32::NEG_INFINITY;
    }
    let logits: Vec<f32> = kv.chunks(d_qk).map(|k| scale * dot(q, k)).collect();
    let m = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f32;
    for (k, &l) in kv.chunks(d_qk).zip(&logits) {
        let p = (l - m).exp();
        sum += p;
        for (acc, v) in o.iter_mut().zip(&k[..d_v]) {
            *acc += p * v;
        }
    }
    let inv = 1.0 / sum;
    o.iter_mut().for_each(|x| *x *= inv);
    m + sum.ln()
}
