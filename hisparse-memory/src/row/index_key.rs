//! The index key: what the device keeps per token for selection. Two formats ([`IndexKeyFormat`]):
//! `dim` e4m3 values and one fp32 scale (132 B for dim 128, as DeepGEMM's fp8 indexer cache
//! stores it per token), or `dim` 4-bit integers with an fp32 scale per group of values.

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result, check_len};
use crate::fp8::E4M3_TABLE;
use crate::row::fp8::{quantize_block, read_scale};

/// How an index key is stored.
///
/// - `fp8`: `[0, dim)` e4m3 codes, `[dim, dim + 4)` one fp32 scale (a power of two when written
///   by [`IndexKeyLayout::encode`]).
/// - `int4` with `group`: `[0, dim / 2)` the values as 4-bit codes, two per byte (value `2i` in
///   the low nibble), code `c` standing for `c - 8`; then one fp32 scale per group of `group`
///   values. A value decodes to `(c - 8) * scale`; the encoder writes `scale = amax / 7` and codes
///   `8 + round(v / scale)` in `1..=15` (a group whose `amax / 7` is not a positive f32, all
///   zeros or subnormal: scale 1, codes 8).
///
/// ```
/// use hisparse_memory::{IndexKeyFormat, IndexKeyLayout};
/// let key = IndexKeyLayout::with_format(192, IndexKeyFormat::Int4 { group: 32 })?;
/// assert_eq!(key.row_bytes(), 96 + 6 * 4);
/// assert_eq!("int4:32".parse::<IndexKeyFormat>()?, IndexKeyFormat::Int4 { group: 32 });
/// # Ok::<(), hisparse_memory::MemoryError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum IndexKeyFormat {
    /// e4m3 values with one fp32 scale per key.
    #[default]
    Fp8,
    /// 4-bit integers with one fp32 scale per `group` values.
    Int4 {
        /// Values per scale (even, and dividing the key's dims).
        group: usize,
    },
}

impl IndexKeyFormat {
    /// The 4-bit format's group when none is given.
    pub const DEFAULT_INT4_GROUP: usize = 32;

    /// Its name on the command line (`fp8`, `int4:GROUP`).
    pub fn name(&self) -> String {
        match self {
            Self::Fp8 => "fp8".to_owned(),
            Self::Int4 { group } => format!("int4:{group}"),
        }
    }
}

impl std::fmt::Display for IndexKeyFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for IndexKeyFormat {
    type Err = MemoryError;
    /// `fp8`, `int4` (groups of [`Self::DEFAULT_INT4_GROUP`]) or `int4:GROUP`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || MemoryError::invalid("index_format", s, "expected fp8, int4 or int4:GROUP");
        match s.split_once(':') {
            None if s == "fp8" => Ok(Self::Fp8),
            None if s == "int4" => Ok(Self::Int4 { group: Self::DEFAULT_INT4_GROUP }),
            Some(("int4", g)) => Ok(Self::Int4 { group: g.parse().map_err(|_| bad())? }),
            _ => Err(bad()),
        }
    }
}

/// The byte layout of one index key: its dims and [`IndexKeyFormat`], checked together.
///
/// ```
/// use hisparse_memory::IndexKeyLayout;
/// let key = IndexKeyLayout::new(128)?;
/// assert_eq!(key.row_bytes(), 132);
/// # Ok::<(), hisparse_memory::MemoryError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexKeyLayout {
    dim: usize,
    format: IndexKeyFormat,
}

impl IndexKeyLayout {
    /// An fp8 layout for keys of `dim` values (`dim >= 1`).
    pub fn new(dim: usize) -> Result<Self> {
        Self::with_format(dim, IndexKeyFormat::Fp8)
    }

    /// A layout of `format` for keys of `dim` values: `dim >= 1`; for `int4`, `group` even and
    /// dividing `dim`.
    pub fn with_format(dim: usize, format: IndexKeyFormat) -> Result<Self> {
        if dim == 0 {
            return Err(MemoryError::invalid("index_dim", dim, "must be at least 1"));
        }
        if let IndexKeyFormat::Int4 { group } = format
            && (group == 0 || !group.is_multiple_of(2) || !dim.is_multiple_of(group))
        {
            return Err(MemoryError::invalid(
                "index_format",
                format,
                format!("an int4 group must be even and divide the key's {dim} dims"),
            ));
        }
        Ok(Self { dim, format })
    }

    /// Values per key.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// How the key is stored.
    pub fn format(&self) -> IndexKeyFormat {
        self.format
    }

    /// Bytes per key: `dim + 4` (fp8), `dim / 2 + 4 * dim / group` (int4).
    pub fn row_bytes(&self) -> usize {
        match self.format {
            IndexKeyFormat::Fp8 => self.dim + 4,
            IndexKeyFormat::Int4 { group } => self.dim / 2 + 4 * (self.dim / group),
        }
    }

    /// Encodes `values` (`dim` finite f32) into `row` (`row_bytes`).
    pub fn encode(&self, values: &[f32], row: &mut [u8]) -> Result<()> {
        check_len("values", self.dim, values.len())?;
        check_len("row", self.row_bytes(), row.len())?;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(MemoryError::NonFinite { field: "values", index, value });
        }
        match self.format {
            IndexKeyFormat::Fp8 => {
                let (codes, scale) = row.split_at_mut(self.dim);
                let s = quantize_block(values, codes);
                scale.copy_from_slice(&s.to_le_bytes());
            }
            IndexKeyFormat::Int4 { group } => {
                let (codes, scales) = row.split_at_mut(self.dim / 2);
                codes.fill(0);
                for (g, vals) in values.chunks(group).enumerate() {
                    let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
                    // A group too small for its step to be a positive f32 (all zeros, or a
                    // subnormal largest value) keeps unit scale: its codes round to zero.
                    let step = amax / 7.0;
                    let s = if step > 0.0 { step } else { 1.0 };
                    scales[4 * g..4 * g + 4].copy_from_slice(&s.to_le_bytes());
                    for (j, v) in vals.iter().enumerate() {
                        let c = (8.0 + (v / s).round()).clamp(1.0, 15.0) as u8;
                        let i = g * group + j;
                        codes[i / 2] |= c << (4 * (i % 2));
                    }
                }
            }
        }
        Ok(())
    }

    /// The fp8 key's scale, checked to be finite and positive (an int4 key has one per group:
    /// [`Self::check_scales`] reads them).
    pub fn scale(&self, row: &[u8]) -> Result<f32> {
        check_len("row", self.row_bytes(), row.len())?;
        if self.format != IndexKeyFormat::Fp8 {
            return Err(MemoryError::invalid("index_format", self.format, "has a scale per group, not per key"));
        }
        read_scale(&row[self.dim..], "index_key", 0)
    }

    /// Checks every scale of `row` (one for fp8, one per group for int4) is finite and positive.
    pub fn check_scales(&self, row: &[u8]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        match self.format {
            IndexKeyFormat::Fp8 => self.scale(row).map(|_| ()),
            IndexKeyFormat::Int4 { group } => {
                let scales = &row[self.dim / 2..];
                (0..self.dim / group).try_for_each(|g| read_scale(&scales[4 * g..], "index_key", g).map(|_| ()))
            }
        }
    }

    /// Decodes `row` into `out` (`dim` f32): code value times its scale; every scale checked.
    pub fn decode(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        check_len("out", self.dim, out.len())?;
        self.check_scales(row)?;
        self.decode_checked(row, out);
        Ok(())
    }

    /// [`Self::decode`] of a row whose length and scales were checked ([`Self::check_scales`]):
    /// the kernels' form, which decodes the same key many times. `out` holds `dim` values.
    pub fn decode_checked(&self, row: &[u8], out: &mut [f32]) {
        let scale_at = |at: usize| f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
        match self.format {
            IndexKeyFormat::Fp8 => {
                let s = scale_at(self.dim);
                for (o, &c) in out.iter_mut().zip(&row[..self.dim]) {
                    *o = E4M3_TABLE[usize::from(c)] * s;
                }
            }
            IndexKeyFormat::Int4 { group } => {
                let half = self.dim / 2;
                for (g, chunk) in out.chunks_mut(group).enumerate() {
                    let s = scale_at(half + 4 * g);
                    for (j, o) in chunk.iter_mut().enumerate() {
                        let i = g * group + j;
                        let c = (row[i / 2] >> (4 * (i % 2))) & 0xf;
                        *o = (f32::from(c) - 8.0) * s;
                    }
                }
            }
        }
    }
}
