//! Seeded random inputs (never all-zero) for tests, benches and self-checks: KV row pools, index
//! key pools, queries and head weights, with the shapes the `Backend` kernels take.

use half::bf16;
use hisparse_memory::{IndexKeyLayout, KvRowLayout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::error::Result;

/// A seeded generator.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` normal values with standard deviation `std`.
pub fn normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal) * std).collect()
}

/// `n` normal values rounded to bf16.
pub fn normal_bf16(rng: &mut StdRng, n: usize, std: f32) -> Vec<bf16> {
    normal(rng, n, std).into_iter().map(bf16::from_f32).collect()
}

/// A pool of `rows` KV rows with normal values (latent std 1, rope std 0.5), encoded in
/// `layout`, and the same values before encoding (`[rows, d_qk]`).
pub fn kv_pool(rng: &mut StdRng, layout: KvRowLayout, rows: usize) -> Result<(Vec<u8>, Vec<f32>)> {
    let d = layout.row_dims();
    let mut values = normal(rng, rows * d, 1.0);
    for row in values.chunks_mut(d) {
        row[layout.blocked_dims()..].iter_mut().for_each(|x| *x *= 0.5);
    }
    let pool = encode_kv_rows(layout, &values)?;
    Ok((pool, values))
}

/// Encodes `[rows, d_qk]` values as a pool of rows in `layout`.
pub fn encode_kv_rows(layout: KvRowLayout, values: &[f32]) -> Result<Vec<u8>> {
    let rb = layout.row_bytes();
    let rows = values.len() / layout.row_dims();
    let mut pool = vec![0u8; rows * rb];
    for (v, r) in values.chunks(layout.row_dims()).zip(pool.chunks_mut(rb)) {
        layout.encode(v, r)?;
    }
    Ok(pool)
}

/// Decodes a pool of rows in `layout` to `[rows, d_qk]` f32.
pub fn decode_kv_rows(layout: KvRowLayout, pool: &[u8]) -> Result<Vec<f32>> {
    let rb = layout.row_bytes();
    let mut out = vec![0f32; pool.len() / rb * layout.row_dims()];
    for (r, o) in pool.chunks(rb).zip(out.chunks_mut(layout.row_dims())) {
        layout.decode(r, o)?;
    }
    Ok(out)
}

/// A pool of `positions` positions' index keys with normal values (a page summary's row is the
/// fold of its positions' keys).
pub fn index_key_pool(rng: &mut StdRng, layout: IndexKeyLayout, positions: usize) -> Result<Vec<u8>> {
    let (q, rb) = (layout.positions_per_row(), layout.row_bytes());
    let values = normal(rng, positions * layout.dim(), 1.0);
    let mut pool = vec![0u8; positions.div_ceil(q) * rb];
    let mut one = vec![0u8; rb];
    for (t, v) in values.chunks(layout.dim()).enumerate() {
        let row = &mut pool[(t / q) * rb..][..rb];
        if t % q == 0 {
            layout.encode(v, row)?;
        } else {
            layout.encode(v, &mut one)?;
            layout.fold(row, &one)?;
        }
    }
    Ok(pool)
}

/// `n` positive head weights in `[0.1, 1.1)`.
pub fn head_weights(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 0.1 + rng.random::<f32>()).collect()
}
