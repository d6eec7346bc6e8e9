//! Row codecs: how one token's KV row (bf16 or FlashMLA-style fp8) and one index key are laid
//! out in bytes, and how they are encoded from and decoded to f32.
//!
//! Byte layouts (all multi-byte values little-endian):
//!
//! | row | bytes | layout |
//! | --- | --- | --- |
//! | bf16 KV row (576 dims) | 1152 | `[0, 2*d_qk)`: `d_latent` latent then `d_rope` rope values, bf16 |
//! | fp8 KV row (FlashMLA) | 656 | `[0, 512)`: latent e4m3; `[512, 528)`: 4 fp32 scales, one per 128 latent values; `[528, 656)`: 64 rope values, bf16 |
//! | index key (dim 128), fp8 | 132 | `[0, 128)`: e4m3; `[128, 132)`: one fp32 scale |
//! | index key (dim `d`), int4 in groups of `g` | `d/2 + 4d/g` | `[0, d/2)`: 4-bit codes, two per byte (low nibble first); then one fp32 scale per group |
//! | index key (dim `d`), int2 in groups of `g` | `d/4 + 4d/g` | `[0, d/4)`: 2-bit codes, four per byte (lowest bits first), code `c` standing for `c - 1.5`; then one fp32 scale per group |
//! | page summary of `q` positions' keys (dim `d`) | `4d` (`4d/q` a position) | `[0, 2d)`: the minima, `[2d, 4d)`: the maxima, bf16 rounded outward |
//! | top-channel key (dim `d`), `k` of every `g` values | `2kd/g + 4` | per group `k` places (u8, ascending), then per group `k` e4m3 codes, then one fp32 scale |
//! | GQA row (`h` KV heads of dim `d`), bf16 | `4hd` | the `2hd` values `K_0 .. K_{h-1}, V_0 .. V_{h-1}`, bf16 |
//! | GQA row, fp8 | `2hd + 4 * 2hd / 128` | the same values in e4m3 blocks of 128, then their fp32 scales |
//!
//! Every row is `blocked_dims` values (fp8 rows keep them in e4m3 blocks of 128 with a scale
//! each) then `bf16_dims` values kept bf16 in every format: an MLA row's latent and rope parts; a
//! GQA row's `2hd` keys and values, and nothing after them. Its [`RowHeads`] say how attention
//! reads it: query head `q` of `H` reads the key `K_g` and the value `V_g` of its group
//! `g = q / (H / h)`.
//!
//! Our encoders write power-of-two scales (UE8M0-style, as FlashMLA does): the smallest power of
//! two `s` with `amax / s <= 448`, so that decoding (`e4m3 * s`) is exact in f32. Decoders accept any
//! finite positive scale and reject others with [`MemoryError::BadScale`].

mod bf16;
mod fp8;
mod index_key;
mod page_summary;
#[cfg(test)]
mod tests_channels;
#[cfg(test)]
mod tests_int2;
#[cfg(test)]
mod tests_int4;
#[cfg(test)]
mod tests_pages;
mod top_channels;

pub use self::bf16::{decode_bf16_into, encode_bf16_into};
pub use self::fp8::{FP8_BLOCK, quantize_block};
pub use self::index_key::{IndexKeyFormat, IndexKeyLayout};
pub use self::page_summary::upper_bound as page_upper_bound;

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result, check_len};

/// How a KV row is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvRowFormat {
    /// All `d_qk` values in bf16 (1152 B for 576 dims).
    Bf16,
    /// FlashMLA's "fp8 with scale": latent in e4m3 with one fp32 scale per 128 values, rope in bf16
    /// (656 B for 512 + 64 dims).
    Fp8,
}

impl KvRowFormat {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
        }
    }
}

impl std::fmt::Display for KvRowFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvRowFormat {
    type Err = MemoryError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" => Ok(Self::Bf16),
            "fp8" => Ok(Self::Fp8),
            _ => Err(MemoryError::invalid("kv_format", s, "expected bf16 or fp8")),
        }
    }
}

/// What a cache stores per token and layer: its KV row's format and its index key's. A
/// [`KvRowFormat`] alone converts into it with fp8 index keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StorageFormats {
    /// How KV rows are stored.
    pub kv: KvRowFormat,
    /// How index keys are stored.
    pub index: IndexKeyFormat,
}

impl From<KvRowFormat> for StorageFormats {
    fn from(kv: KvRowFormat) -> Self {
        Self { kv, index: IndexKeyFormat::Fp8 }
    }
}

/// The byte layout of one KV row: a format and the dims it holds. Built by
/// [`KvRowLayout::new`], which checks that the format can hold the dims.
///
/// ```
/// use hisparse_memory::{KvRowFormat, KvRowLayout};
/// let layout = KvRowLayout::new(KvRowFormat::Fp8, 512, 64)?;
/// let values: Vec<f32> = (0..576).map(|i| (i as f32 * 0.37).sin()).collect();
/// let mut row = vec![0u8; layout.row_bytes()];
/// layout.encode(&values, &mut row)?;
/// let mut back = vec![0f32; 576];
/// layout.decode(&row, &mut back)?;
/// assert!(values.iter().zip(&back).all(|(a, b)| (a - b).abs() <= a.abs() / 16.0 + 1e-3));
/// # Ok::<(), hisparse_memory::MemoryError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvRowLayout {
    format: KvRowFormat,
    /// Values an fp8 row keeps in blocks of 128 with a scale each: MLA's latent part, every
    /// value of a GQA row.
    blocked_dims: usize,
    /// Values every format keeps as bf16, after the blocked ones: MLA's rotary part; none in a
    /// GQA row.
    bf16_dims: usize,
    heads: RowHeads,
}

/// How attention reads a KV row: one MLA row shared by every query head (keys are the whole row,
/// values its latent part), or the keys and values of every KV head of a grouped-query model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum RowHeads {
    /// Multi-head latent attention in MQA form (DeepSeek, GLM).
    #[default]
    Mla,
    /// Grouped-query (or multi-head, when `kv_heads` equals the query heads) attention: the row
    /// holds `K_0 .. K_{kv_heads-1}` then `V_0 .. V_{kv_heads-1}`, each `head_dim` values.
    Gqa {
        /// KV heads.
        kv_heads: usize,
        /// Dims of one head's key (and value).
        head_dim: usize,
    },
}

impl KvRowLayout {
    /// An MLA row of `d_latent` latent values (blocked) then `d_rope` rotary values (bf16) in
    /// `format`. Fp8 rows need `d_latent` to be a non-zero multiple of 128.
    pub fn new(format: KvRowFormat, d_latent: usize, d_rope: usize) -> Result<Self> {
        if d_latent == 0 {
            return Err(MemoryError::invalid("d_latent", d_latent, "must be at least 1"));
        }
        if format == KvRowFormat::Fp8 && !d_latent.is_multiple_of(FP8_BLOCK) {
            return Err(MemoryError::invalid(
                "d_latent",
                d_latent,
                format!("fp8 rows keep their values in blocks of {FP8_BLOCK}"),
            ));
        }
        Ok(Self { format, blocked_dims: d_latent, bf16_dims: d_rope, heads: RowHeads::Mla })
    }

    /// A grouped-query row: the keys and values of `kv_heads` heads of `head_dim` values, all
    /// `2 * kv_heads * head_dim` of them blocked (fp8 needs that to be a multiple of 128).
    ///
    /// ```
    /// use hisparse_memory::{KvRowFormat, KvRowLayout};
    /// let gqa = KvRowLayout::gqa(KvRowFormat::Bf16, 3, 64)?; // SmolLM2: 3 KV heads of 64 dims
    /// assert_eq!((gqa.row_bytes(), gqa.query_dim(), gqa.value_dim()), (768, 64, 64));
    /// assert_eq!(gqa.head_offsets(9, 4), (64, 3 * 64 + 64)); // query head 4 reads group 1
    /// assert_eq!((gqa.row_dims(), gqa.bf16_dims(), gqa.mla_dims()), (384, 0, None));
    /// # Ok::<(), hisparse_memory::MemoryError>(())
    /// ```
    pub fn gqa(format: KvRowFormat, kv_heads: usize, head_dim: usize) -> Result<Self> {
        if kv_heads == 0 {
            return Err(MemoryError::invalid("kv_heads", kv_heads, "must be at least 1"));
        }
        if head_dim == 0 {
            return Err(MemoryError::invalid("head_dim", head_dim, "must be at least 1"));
        }
        let d = kv_heads
            .checked_mul(head_dim)
            .and_then(|x| x.checked_mul(2))
            .ok_or_else(|| MemoryError::invalid("head_dim", head_dim, format!("{kv_heads} KV heads overflow")))?;
        if format == KvRowFormat::Fp8 && !d.is_multiple_of(FP8_BLOCK) {
            return Err(MemoryError::invalid(
                "head_dim",
                head_dim,
                format!("fp8 rows keep their values in blocks of {FP8_BLOCK}"),
            ));
        }
        Ok(Self { format, blocked_dims: d, bf16_dims: 0, heads: RowHeads::Gqa { kv_heads, head_dim } })
    }

    /// How attention reads the row.
    pub fn heads(&self) -> RowHeads {
        self.heads
    }

    /// Dims of one query head (and of one key): `d_latent + d_rope` for MLA, `head_dim` for GQA.
    pub fn query_dim(&self) -> usize {
        match self.heads {
            RowHeads::Mla => self.row_dims(),
            RowHeads::Gqa { head_dim, .. } => head_dim,
        }
    }

    /// Dims of one head's output (and of one value): `d_latent` for MLA, `head_dim` for GQA.
    pub fn value_dim(&self) -> usize {
        match self.heads {
            RowHeads::Mla => self.blocked_dims,
            RowHeads::Gqa { head_dim, .. } => head_dim,
        }
    }

    /// Where query head `head` of `q_heads` finds its key and its value in a decoded row (value
    /// offsets): `(0, 0)` for MLA; its group's `K_g` and `V_g` for GQA. `q_heads` must be a
    /// multiple of the KV heads (see [`KvRowLayout::check_query_heads`]).
    pub fn head_offsets(&self, q_heads: usize, head: usize) -> (usize, usize) {
        match self.heads {
            RowHeads::Mla => (0, 0),
            RowHeads::Gqa { kv_heads, head_dim } => {
                let g = head / (q_heads / kv_heads).max(1);
                (g * head_dim, (kv_heads + g) * head_dim)
            }
        }
    }

    /// Checks that `q_heads` query heads can read this row: any number for MLA, a non-zero
    /// multiple of the KV heads for GQA.
    pub fn check_query_heads(&self, q_heads: usize) -> Result<()> {
        if q_heads == 0 {
            return Err(MemoryError::invalid("q_heads", q_heads, "must be at least 1"));
        }
        if let RowHeads::Gqa { kv_heads, .. } = self.heads
            && !q_heads.is_multiple_of(kv_heads)
        {
            return Err(MemoryError::invalid(
                "q_heads",
                q_heads,
                format!("must be a multiple of the {kv_heads} KV heads"),
            ));
        }
        Ok(())
    }

    /// The row format.
    pub fn format(&self) -> KvRowFormat {
        self.format
    }

    /// An MLA row's `(d_latent, d_rope)`; `None` for a GQA row.
    pub fn mla_dims(&self) -> Option<(usize, usize)> {
        (self.heads == RowHeads::Mla).then_some((self.blocked_dims, self.bf16_dims))
    }

    /// Values an fp8 row keeps in blocks of 128 with a scale each (MLA's latent part, every value
    /// of a GQA row); they come first in the decoded row.
    pub fn blocked_dims(&self) -> usize {
        self.blocked_dims
    }

    /// Values every format keeps as bf16, after the blocked ones (MLA's rotary part; 0 for GQA).
    pub fn bf16_dims(&self) -> usize {
        self.bf16_dims
    }

    /// All values of a row: `blocked_dims + bf16_dims` (MLA: `d_latent + d_rope`; GQA: keys and
    /// values of every KV head).
    pub fn row_dims(&self) -> usize {
        self.blocked_dims + self.bf16_dims
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        match self.format {
            KvRowFormat::Bf16 => 2 * self.row_dims(),
            KvRowFormat::Fp8 => self.blocked_dims + 4 * (self.blocked_dims / FP8_BLOCK) + 2 * self.bf16_dims,
        }
    }

    /// Byte offset of the fp32 scales inside an fp8 row (`None` for bf16 rows).
    pub fn scales_offset(&self) -> Option<usize> {
        (self.format == KvRowFormat::Fp8).then_some(self.blocked_dims)
    }

    /// Byte offset of the bf16 values (MLA's rope) inside a row.
    pub fn bf16_offset(&self) -> usize {
        match self.format {
            KvRowFormat::Bf16 => 2 * self.blocked_dims,
            KvRowFormat::Fp8 => self.blocked_dims + 4 * (self.blocked_dims / FP8_BLOCK),
        }
    }

    /// Encodes `values` (`row_dims` finite f32: blocked then bf16) into `row` (`row_bytes`).
    pub fn encode(&self, values: &[f32], row: &mut [u8]) -> Result<()> {
        check_len("values", self.row_dims(), values.len())?;
        check_len("row", self.row_bytes(), row.len())?;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(MemoryError::NonFinite { field: "values", index, value });
        }
        let (blocked, plain) = values.split_at(self.blocked_dims);
        let plain_at = self.bf16_offset();
        match self.format {
            KvRowFormat::Bf16 => encode_bf16_into(values, row),
            KvRowFormat::Fp8 => {
                let (codes, rest) = row.split_at_mut(self.blocked_dims);
                let (scales, _) = rest.split_at_mut(plain_at - self.blocked_dims);
                for (b, (block, out)) in blocked.chunks(FP8_BLOCK).zip(codes.chunks_mut(FP8_BLOCK)).enumerate() {
                    let s = quantize_block(block, out);
                    scales[4 * b..4 * b + 4].copy_from_slice(&s.to_le_bytes());
                }
                encode_bf16_into(plain, &mut row[plain_at..]);
            }
        }
        Ok(())
    }

    /// Decodes `row` (`row_bytes`) into `out` (`row_dims` f32: blocked then bf16). Fails on a scale
    /// that is not finite and positive.
    pub fn decode(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        check_len("out", self.row_dims(), out.len())?;
        match self.format {
            KvRowFormat::Bf16 => decode_bf16_into(row, out),
            KvRowFormat::Fp8 => {
                let (blocked, plain) = out.split_at_mut(self.blocked_dims);
                fp8::decode_blocks(&row[..self.bf16_offset()], blocked, "kv_row")?;
                decode_bf16_into(&row[self.bf16_offset()..], plain);
            }
        }
        Ok(())
    }

    /// Decodes values `start .. start + out.len()` of `row` into `out`: the same values as
    /// [`KvRowLayout::decode`] gives them, without checking the scales (the kernels check a
    /// batch's rows once, then read each row's pieces many times). Fails on a row of the wrong
    /// length or a range past the row's values.
    #[inline]
    pub fn decode_range_checked(&self, row: &[u8], start: usize, out: &mut [f32]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        let end = start.checked_add(out.len()).filter(|&e| e <= self.row_dims()).ok_or_else(|| {
            MemoryError::invalid(
                "start",
                start,
                format!("{} values from it pass the row's {}", out.len(), self.row_dims()),
            )
        })?;
        if self.format == KvRowFormat::Bf16 {
            decode_bf16_into(&row[2 * start..2 * end], out);
            return Ok(());
        }
        // Fp8: the blocked values a block's piece at a time, then any bf16 ones.
        let (mut at, mut o) = (start, 0);
        while at < end.min(self.blocked_dims) {
            let b = at / FP8_BLOCK;
            let stop = ((b + 1) * FP8_BLOCK).min(end);
            let sc = self.blocked_dims + 4 * b;
            let s = f32::from_le_bytes([row[sc], row[sc + 1], row[sc + 2], row[sc + 3]]);
            crate::fp8::decode_e4m3_scaled(&row[at..stop], s, &mut out[o..o + stop - at]);
            (o, at) = (o + stop - at, stop);
        }
        if end > at {
            let plain = self.bf16_offset() + 2 * (at - self.blocked_dims);
            decode_bf16_into(&row[plain..plain + 2 * (end - at)], &mut out[o..]);
        }
        Ok(())
    }

    /// [`KvRowLayout::decode_range_checked`] of rows `rows` of `pool` (rows of this layout, one
    /// after another): row `rows[i]`'s values `start ..` into `out[i * width ..][..width]`. Fails,
    /// writing nothing, on a row not in the pool, or a range past the row's values.
    pub fn decode_ranges_checked(
        &self,
        pool: &[u8],
        rows: &[i32],
        start: usize,
        width: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let rb = self.row_bytes();
        let pool_rows = pool.len() / rb;
        check_len("out", rows.len() * width, out.len())?;
        if let Some(&bad) = rows.iter().find(|&&r| r < 0 || r as usize >= pool_rows) {
            return Err(MemoryError::invalid("rows", bad, format!("not a row of the pool of {pool_rows} rows")));
        }
        if start.checked_add(width).is_none_or(|e| e > self.row_dims()) {
            return Err(MemoryError::invalid(
                "start",
                start,
                format!("{width} values from it pass the row's {}", self.row_dims()),
            ));
        }
        if self.format == KvRowFormat::Bf16 {
            // Every row was checked to be in the pool, and the range to be in a row.
            bf16::decode_bf16_rows(pool, rows, rb, 2 * start, out, width);
            return Ok(());
        }
        for (&r, o) in rows.iter().zip(out.chunks_exact_mut(width.max(1))) {
            let at = r as usize * rb;
            self.decode_range_checked(&pool[at..at + rb], start, o)?;
        }
        Ok(())
    }

    /// The largest error [`KvRowLayout::encode`] then [`KvRowLayout::decode`] may make on `x`,
    /// a value of a block (of 128 blocked values, for fp8) whose largest magnitude is `amax`
    /// (`is_bf16`: one of the values every format keeps as bf16):
    ///
    /// * bf16: half a unit in the last place, `|x| * 2^-8`;
    /// * fp8 blocked: `max(|x| * 2^-4, s * 2^-10)` with `s` the block's power-of-two scale
    ///   (`s < amax / 224`), i.e. half an e4m3 ulp for normals and half the smallest subnormal.
    pub fn error_bound(&self, x: f32, amax: f32, is_bf16: bool) -> f32 {
        if is_bf16 || self.format == KvRowFormat::Bf16 {
            return x.abs() * 2f32.powi(-8);
        }
        let s = fp8::pow2_scale(amax);
        (x.abs() * 2f32.powi(-4)).max(s * 2f32.powi(-10))
    }
}

#[cfg(test)]
mod tests;
