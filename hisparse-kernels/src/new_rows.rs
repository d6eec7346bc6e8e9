//! New rows of an emulated model: what its projections would write for the newest token of
//! each request — a KV row and an index key — generated from the unit stream
//! ([`crate::unit_stream`]) where the kernels run ([`crate::ModelKernels::fill_new_rows`]), in the
//! geometry's row formats. [`fill_new_rows_host`] is the reference every backend matches bit for
//! bit (the CUDA kernel `fill_new_rows` included): request `i`'s KV row holds the stream seeded
//! `kv_seeds[i]` (`d_qk` values, encoded by `KvRowLayout::encode`); its index key the values
//! `c * u + b * w` (each product and the sum rounded separately) of the streams seeded
//! `key_seeds[2 i]` (`u`) and `key_seeds[2 i + 1]` (`w`), encoded by `IndexKeyLayout::encode`.

use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowLayout};
use rayon::prelude::*;

use crate::error::{Result, check_len};

/// One batch of new rows to generate (see the module documentation).
pub struct NewRows<'a, M: DeviceMemory> {
    /// Format of the KV rows.
    pub kv_layout: KvRowLayout,
    /// One seed per request.
    pub kv_seeds: &'a M::Buffer<u64>,
    /// Format of the index keys.
    pub key_layout: IndexKeyLayout,
    /// Two seeds per request (`None`: no keys, a layer that shares another's index).
    pub key_seeds: Option<&'a M::Buffer<u64>>,
    /// The keys' mix `(c, b)`: `c * u + b * w`.
    pub key_mix: (f32, f32),
}

/// The reference: fills `rows` (`n` KV rows) and `keys` (`n` index keys, when asked) from host
/// seeds.
pub fn fill_new_rows_host(
    kv_layout: KvRowLayout,
    kv_seeds: &[u64],
    key_layout: IndexKeyLayout,
    key_seeds: Option<&[u64]>,
    (c, b): (f32, f32),
    rows: &mut [u8],
    keys: Option<&mut [u8]>,
) -> Result<()> {
    let n = kv_seeds.len();
    let (rb, kb) = (kv_layout.row_bytes(), key_layout.row_bytes());
    check_len("rows", n * rb, rows.len())?;
    rows.par_chunks_mut(rb.max(1)).zip(kv_seeds.par_iter()).try_for_each(|(row, &s)| -> Result<()> {
        let mut v = vec![0f32; kv_layout.row_dims()];
        crate::unit_stream::fill_unit(s, &mut v);
        Ok(kv_layout.encode(&v, row)?)
    })?;
    match (key_seeds, keys) {
        (Some(seeds), Some(keys)) => {
            check_len("key_seeds", 2 * n, seeds.len())?;
            check_len("keys", n * kb, keys.len())?;
            keys.par_chunks_mut(kb.max(1)).zip(seeds.par_chunks(2)).try_for_each(|(key, s)| -> Result<()> {
                let (mut u, mut w) = (vec![0f32; key_layout.dim()], vec![0f32; key_layout.dim()]);
                crate::unit_stream::fill_unit(s[0], &mut u);
                crate::unit_stream::fill_unit(s[1], &mut w);
                for (x, y) in u.iter_mut().zip(&w) {
                    *x = c * *x + b * y;
                }
                Ok(key_layout.encode(&u, key)?)
            })
        }
        (None, None) => Ok(()),
        (given, _) => Err(crate::KernelError::invalid(
            "keys",
            if given.is_some() { "missing" } else { "given" },
            "key seeds and a key buffer come together",
        )),
    }
}
