//! CPU sparse decode attention: for each request and head, a softmax over `scale * q . k_i` of
//! the selected rows, then the weighted sum of their values — for MLA rows the key is the whole
//! row and the value its first `d_v` values; for GQA rows each query head reads its group's key
//! and value ([`KvRowLayout::head_offsets`](hisparse_memory::KvRowLayout::head_offsets)). A row's
//! key is decoded once per group of heads that share it, its value once per piece of the output
//! (in parallel blocks, without a decoded copy of every row); every sum runs in selection order,
//! so the result depends only on the selected rows' bytes and their order — not on where the
//! rows live. The softmax's exponentials are [`super::exp`]'s, eight at a time.

use half::bf16;
use std::ops::Range;

use hisparse_memory::{EmulatedDevice, KvRowLayout, MemoryError};
use rayon::prelude::*;

use super::exp::exp_in_place;
#[cfg(target_arch = "x86_64")]
use super::sum_lanes;
use super::{dot, dot_fixed};
use crate::batch::AttentionBatch;
use crate::error::{KernelError, Result, check_len};

/// Rows whose logits one rayon task computes.
const ROWS: usize = 128;

/// Output dims of one group whose weighted values one rayon task sums.
const DIMS: usize = 32;

pub(super) fn sparse_attention(
    batch: &AttentionBatch<'_, EmulatedDevice>,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let heads = batch.heads;
    let layout = batch.layout;
    // A query head holds `d_q` values, an output head `d_v`.
    let (d_q, d_v, row_bytes) = (layout.query_dim(), layout.value_dim(), layout.row_bytes());
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
    // The pool's whole rows; bytes past the last are never read (a shared pool of hybrid
    // placement ends in whole key pages, not always whole rows).
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

    let groups = head_groups(layout, heads);
    out.par_chunks_mut(heads * d_v)
        .zip(lse.par_chunks_mut(heads))
        .zip(batch.selections.par_iter())
        .enumerate()
        .try_for_each(|(i, ((out, lse), sel))| {
            let req = RequestRows {
                pool: batch.rows,
                layout,
                locs: &batch.locations[sel.offset..sel.end()],
                q: &queries[i * heads * d_q..(i + 1) * heads * d_q],
                heads,
                groups: &groups,
                scale: batch.softmax_scale,
            };
            attend_request(req, out, lse)
        })
}

/// Query heads that read the same key and value of a row: a GQA group, or every head of an
/// MLA row.
struct HeadGroup {
    /// Where the group's key and value start in a decoded row.
    k_at: usize,
    v_at: usize,
    heads: Range<usize>,
}

fn head_groups(layout: KvRowLayout, heads: usize) -> Vec<HeadGroup> {
    let mut groups: Vec<HeadGroup> = Vec::new();
    for h in 0..heads {
        let (k_at, v_at) = layout.head_offsets(heads, h);
        match groups.last_mut() {
            Some(g) if (g.k_at, g.v_at) == (k_at, v_at) => g.heads.end = h + 1,
            _ => groups.push(HeadGroup { k_at, v_at, heads: h..h + 1 }),
        }
    }
    groups
}

/// One request's selected rows in the pool (locations checked to be rows of it), its queries
/// (f32, `[heads, d_q]`) and the heads' groups.
#[derive(Clone, Copy)]
struct RequestRows<'a> {
    pool: &'a [u8],
    layout: KvRowLayout,
    locs: &'a [i32],
    q: &'a [f32],
    heads: usize,
    groups: &'a [HeadGroup],
    scale: f32,
}

/// Every head of one request: `out` `[heads, d_v]`, `lse` `[heads]`. Per head, as a softmax over
/// `scale * q . k_j` of its selected rows in selection order: the logits (a row's key decoded
/// once for its group), the largest, each `p_j = exp(l_j - max)`, their sum in row order, and
/// `sum_j p_j v_j` accumulated in row order (a group's values decoded once per piece of the
/// output) times `1 / sum` — so the result depends only on the rows' bytes and their order.
fn attend_request(r: RequestRows<'_>, out: &mut [f32], lse: &mut [f32]) -> Result<()> {
    let (n, heads, d_v) = (r.locs.len(), r.heads, r.layout.value_dim());
    if n == 0 {
        out.fill(0.0);
        lse.fill(f32::NEG_INFINITY);
        return Ok(());
    }
    // probs[j * heads + h]: first the logits, then the exponentials.
    let mut probs = vec![0f32; n * heads];
    probs.par_chunks_mut(ROWS * heads).enumerate().try_for_each(|(b, chunk)| logits(r, b * ROWS, chunk))?;
    let mut max = vec![f32::NEG_INFINITY; heads];
    for lt in probs.chunks(heads) {
        for (m, &l) in max.iter_mut().zip(lt) {
            *m = m.max(l);
        }
    }
    probs.par_chunks_mut(ROWS * heads).for_each(|chunk| {
        for lt in chunk.chunks_mut(heads) {
            for (p, &m) in lt.iter_mut().zip(&max) {
                *p -= m;
            }
        }
        exp_in_place(chunk);
    });
    let mut sum = vec![0f32; heads];
    for pt in probs.chunks(heads) {
        for (s, &p) in sum.iter_mut().zip(pt) {
            *s += p;
        }
    }
    // The weighted values, a piece of `DIMS` output dims of one group per task.
    let pieces: Vec<(usize, Range<usize>)> =
        (0..r.groups.len()).flat_map(|g| (0..d_v).step_by(DIMS).map(move |c| (g, c..(c + DIMS).min(d_v)))).collect();
    let sums: Vec<Vec<f32>> = pieces
        .par_iter()
        .map(|(g, dims)| weighted_values(r, &r.groups[*g], dims.clone(), &probs))
        .collect::<Result<_>>()?;
    for ((g, dims), acc) in pieces.iter().zip(&sums) {
        let group = &r.groups[*g];
        for (h, a) in group.heads.clone().zip(acc.chunks(dims.len())) {
            out[h * d_v + dims.start..h * d_v + dims.end].copy_from_slice(a);
        }
    }
    for (h, (o, l)) in out.chunks_mut(d_v).zip(lse.iter_mut()).enumerate() {
        let inv = 1.0 / sum[h];
        o.iter_mut().for_each(|x| *x *= inv);
        *l = max[h] + sum[h].ln();
    }
    Ok(())
}

/// `chunk[j * heads + h] = scale * q_h . k` for the rows `first + j`, each row's key decoded
/// once per group; with AVX2 where the CPU has it (the same sums in the same order).
fn logits(r: RequestRows<'_>, first: usize, chunk: &mut [f32]) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { logits_avx2(r, first, chunk) };
    }
    logits_any(r, first, chunk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn logits_avx2(r: RequestRows<'_>, first: usize, chunk: &mut [f32]) -> Result<()> {
    logits_any(r, first, chunk)
}

#[inline(always)]
fn logits_any(r: RequestRows<'_>, first: usize, chunk: &mut [f32]) -> Result<()> {
    let (d_q, n) = (r.layout.query_dim(), chunk.len() / r.heads);
    let locs = &r.locs[first..first + n];
    // The block's keys of one group at a time, row after row; then each head of the group over
    // them (its query held across the rows).
    let mut keys = vec![0f32; n * d_q];
    for g in r.groups {
        r.layout.decode_ranges_checked(r.pool, locs, g.k_at, d_q, &mut keys)?;
        for h in g.heads.clone() {
            let q = &r.q[h * d_q..(h + 1) * d_q];
            match d_q {
                64 => head_logits::<8>(q, &keys, r.scale, r.heads, h, chunk),
                128 => head_logits::<16>(q, &keys, r.scale, r.heads, h, chunk),
                _ => {
                    for (lt, key) in chunk.chunks_mut(r.heads).zip(keys.chunks_exact(d_q)) {
                        lt[h] = r.scale * dot(q, key);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `chunk[j * heads + h] = scale * q . key_j` for keys of exactly `8 * C` values, as [`dot`]
/// sums them; with AVX2 where the CPU has it (the query in registers across the rows).
#[inline(always)]
fn head_logits<const C: usize>(q: &[f32], keys: &[f32], scale: f32, heads: usize, h: usize, chunk: &mut [f32]) {
    let (q, _) = q.as_chunks::<8>();
    // Invariant: the caller passes a query of `8 * C` values (its query dim, matched to C).
    let q: &[[f32; 8]; C] = q.try_into().expect("a query of 8 * C values");
    let (keys, _) = keys.as_chunks::<8>();
    let keys = keys.as_chunks::<C>().0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { head_logits_avx2(q, keys, scale, heads, h, chunk) };
    }
    for (lt, key) in chunk.chunks_mut(heads).zip(keys) {
        lt[h] = scale * dot_fixed(q, key);
    }
}

/// [`head_logits`] with each row's eight accumulators in one register, as `dot`'s AVX2 form.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn head_logits_avx2<const C: usize>(
    q: &[[f32; 8]; C],
    keys: &[[[f32; 8]; C]],
    scale: f32,
    heads: usize,
    h: usize,
    chunk: &mut [f32],
) {
    use std::arch::x86_64::*;
    // SAFETY: each `[f32; 8]` is eight f32; the loads are unaligned.
    let q: [__m256; C] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(q[c].as_ptr()) });
    for (lt, key) in chunk.chunks_mut(heads).zip(keys) {
        let mut acc = _mm256_setzero_ps();
        for (q, k) in q.iter().zip(key) {
            // SAFETY: `k` is eight f32; the load is unaligned.
            acc = _mm256_add_ps(acc, _mm256_mul_ps(*q, unsafe { _mm256_loadu_ps(k.as_ptr()) }));
        }
        // SAFETY: this function runs only where the CPU has AVX2.
        lt[h] = scale * unsafe { sum_lanes(acc, 0.0) };
    }
}

/// `sum_j p_j v_j` over dims `dims` of the group's value for each of its heads (`[heads of the
/// group, dims]`), rows in selection order; with AVX2 where the CPU has it (each output dim its
/// own products and sums: the same bits).
fn weighted_values(r: RequestRows<'_>, group: &HeadGroup, dims: Range<usize>, probs: &[f32]) -> Result<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { weighted_values_avx2(r, group, dims, probs) };
    }
    weighted_values_any(r, group, dims, probs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weighted_values_avx2(
    r: RequestRows<'_>,
    group: &HeadGroup,
    dims: Range<usize>,
    probs: &[f32],
) -> Result<Vec<f32>> {
    weighted_values_any(r, group, dims, probs)
}

#[inline(always)]
fn weighted_values_any(r: RequestRows<'_>, group: &HeadGroup, dims: Range<usize>, probs: &[f32]) -> Result<Vec<f32>> {
    let w = dims.len();
    let mut acc = vec![0f32; group.heads.len() * w];
    // The values' pieces of a block of rows at a time; then each head of the group sums them
    // row after row (its sums held across the rows).
    let mut vals = vec![0f32; ROWS * w];
    for (b, locs) in r.locs.chunks(ROWS).enumerate() {
        let vals = &mut vals[..locs.len() * w];
        r.layout.decode_ranges_checked(r.pool, locs, group.v_at + dims.start, w, vals)?;
        let probs = &probs[b * ROWS * r.heads..][..locs.len() * r.heads];
        for (acc, h) in acc.chunks_mut(w).zip(group.heads.clone()) {
            if w == DIMS {
                head_values::<{ DIMS / 8 }>(acc, vals, probs, r.heads, h);
            } else {
                for (v, pt) in vals.chunks_exact(w).zip(probs.chunks_exact(r.heads)) {
                    let p = pt[h];
                    for (a, v) in acc.iter_mut().zip(v) {
                        *a += p * v;
                    }
                }
            }
        }
    }
    Ok(acc)
}

/// `acc += p_j,h * v_j` for values of exactly `8 * C` dims, row after row (each dim its own
/// product, then sum: the bits of the plain loop).
#[inline(always)]
fn head_values<const C: usize>(acc: &mut [f32], vals: &[f32], probs: &[f32], heads: usize, h: usize) {
    let (acc, _) = acc.as_chunks_mut::<8>();
    // Invariant: the caller passes a piece of `DIMS = 8 * C` dims.
    let acc: &mut [[f32; 8]; C] = acc.try_into().expect("a piece of 8 * C dims");
    let mut a = *acc;
    let (vals, _) = vals.as_chunks::<8>();
    for (v, pt) in vals.as_chunks::<C>().0.iter().zip(probs.chunks_exact(heads)) {
        let p = pt[h];
        for (a, v) in a.iter_mut().zip(v) {
            for i in 0..8 {
                a[i] += p * v[i];
            }
        }
    }
    *acc = a;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Values of mixed signs and magnitudes, so that rounding depends on the order of the sums.
    fn values(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-1f32..1.0) * 10f32.powi(rng.random_range(-2..3))).collect()
    }

    fn fixed_logits_are_dots<const C: usize>(rng: &mut impl Rng) {
        let (d, heads, rows) = (8 * C, 5, 37);
        let (q, keys) = (values(rng, heads * d), values(rng, rows * d));
        let mut got = vec![f32::NAN; rows * heads];
        for h in 0..heads {
            head_logits::<C>(&q[h * d..(h + 1) * d], &keys, 0.3, heads, h, &mut got);
        }
        for (j, key) in keys.chunks(d).enumerate() {
            for h in 0..heads {
                let want = 0.3 * dot(&q[h * d..(h + 1) * d], key);
                assert_eq!(got[j * heads + h].to_bits(), want.to_bits(), "dim {d} row {j} head {h}");
            }
        }
    }

    #[test]
    fn fixed_width_logits_are_dots_bits() {
        let mut rng = crate::random::rng(41);
        fixed_logits_are_dots::<8>(&mut rng);
        fixed_logits_are_dots::<16>(&mut rng);
    }

    #[test]
    fn fixed_width_values_are_the_plain_sums_bits() {
        let mut rng = crate::random::rng(42);
        let (heads, rows, w) = (7, 129, DIMS);
        let (vals, probs) = (values(&mut rng, rows * w), values(&mut rng, rows * heads));
        for h in 0..heads {
            let start = values(&mut rng, w);
            let mut got = start.clone();
            head_values::<{ DIMS / 8 }>(&mut got, &vals, &probs, heads, h);
            let mut want = start;
            for (v, pt) in vals.chunks(w).zip(probs.chunks(heads)) {
                for (a, v) in want.iter_mut().zip(v) {
                    *a += pt[h] * v;
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "head {h}");
        }
    }
}
