//! The index key: what the device keeps per token for selection. Three formats
//! ([`IndexKeyFormat`]): `dim` e4m3 values and one fp32 scale (132 B for dim 128, as DeepGEMM's
//! fp8 indexer cache stores it per token), or `dim` 4-bit or 2-bit integers with an fp32 scale
//! per group of values.

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
/// - `int2` with `group`: `[0, dim / 4)` the values as 2-bit codes, four per byte (value `4i + j`
///   in bits `2j..2j + 2`), code `c` standing for `c - 1.5` (no zero: the four levels
///   `±0.5, ±1.5` times the scale); then one fp32 scale per group. The encoder writes
///   `scale = amax / 1.5` and the nearest level's code, `clamp(round(v / scale + 1.5), 0, 3)` (a
///   group whose `amax / 1.5` is not a positive f32: the smallest normal f32 as its scale).
///
/// ```
/// use hisparse_memory::{IndexKeyFormat, IndexKeyLayout};
/// let key = IndexKeyLayout::with_format(192, IndexKeyFormat::Int4 { group: 32 })?;
/// assert_eq!(key.row_bytes(), 96 + 6 * 4);
/// assert_eq!("int4:32".parse::<IndexKeyFormat>()?, IndexKeyFormat::Int4 { group: 32 });
/// let two = IndexKeyLayout::with_format(192, "int2".parse()?)?;
/// assert_eq!(two.row_bytes(), 48 + 6 * 4);
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
    /// 2-bit integers (four levels, no zero) with one fp32 scale per `group` values.
    Int2 {
        /// Values per scale (a multiple of 4, dividing the key's dims).
        group: usize,
    },
}

impl IndexKeyFormat {
    /// The 4-bit and 2-bit formats' group when none is given.
    pub const DEFAULT_INT4_GROUP: usize = 32;

    /// Its name on the command line (`fp8`, `int4:GROUP`, `int2:GROUP`).
    pub fn name(&self) -> String {
        match self {
            Self::Fp8 => "fp8".to_owned(),
            Self::Int4 { group } => format!("int4:{group}"),
            Self::Int2 { group } => format!("int2:{group}"),
        }
    }

    /// An integer format's codes and group (`None` for fp8).
    fn int_codes(&self) -> Option<(IntCodes, usize)> {
        match *self {
            Self::Fp8 => None,
            Self::Int4 { group } => Some((IntCodes::INT4, group)),
            Self::Int2 { group } => Some((IntCodes::INT2, group)),
        }
    }
}

/// How an integer format codes a value: `bits` a code, code `c` standing for `(c - offset) *
/// scale`, the encoder's scale `amax / top` (the largest magnitude on the level `top`) and its
/// codes `clamp(round(v / scale + offset), lo, hi)` — the nearest level. A group whose `amax /
/// top` is not a positive f32 takes `tiny_scale`.
#[derive(Clone, Copy)]
struct IntCodes {
    bits: usize,
    offset: f32,
    top: f32,
    lo: f32,
    hi: f32,
    tiny_scale: f32,
}

impl IntCodes {
    /// Levels -7..=7 (code 0, for -8, unused); a tiny group's codes round to zero, unit scale.
    const INT4: Self = Self { bits: 4, offset: 8.0, top: 7.0, lo: 1.0, hi: 15.0, tiny_scale: 1.0 };
    /// Levels ±0.5, ±1.5 (no zero); a tiny group decodes to about 6e-39.
    const INT2: Self = Self { bits: 2, offset: 1.5, top: 1.5, lo: 0.0, hi: 3.0, tiny_scale: f32::MIN_POSITIVE };

    /// Codes per byte.
    fn per_byte(self) -> usize {
        8 / self.bits
    }

    /// Encodes `values` in groups of `group` into `codes` (zeroed here) and `scales`.
    fn encode(self, values: &[f32], group: usize, codes: &mut [u8], scales: &mut [u8]) {
        codes.fill(0);
        for (g, vals) in values.chunks(group).enumerate() {
            let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = amax / self.top;
            let s = if step > 0.0 { step } else { self.tiny_scale };
            scales[4 * g..4 * g + 4].copy_from_slice(&s.to_le_bytes());
            for (j, v) in vals.iter().enumerate() {
                // In 0..=hi after the clamp: the cast is exact.
                let c = (v / s + self.offset).round().clamp(self.lo, self.hi) as u8;
                let i = g * group + j;
                codes[i / self.per_byte()] |= c << (self.bits * (i % self.per_byte()));
            }
        }
    }

    /// Decodes `out` (groups of `group`) from `codes` and the checked `scales`.
    fn decode(self, codes: &[u8], scales: &[u8], group: usize, out: &mut [f32]) {
        let mask = (1u8 << self.bits) - 1;
        for (g, chunk) in out.chunks_mut(group).enumerate() {
            let s = f32::from_le_bytes([scales[4 * g], scales[4 * g + 1], scales[4 * g + 2], scales[4 * g + 3]]);
            for (j, o) in chunk.iter_mut().enumerate() {
                let i = g * group + j;
                let c = (codes[i / self.per_byte()] >> (self.bits * (i % self.per_byte()))) & mask;
                *o = (f32::from(c) - self.offset) * s;
            }
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
    /// `fp8`, `int4` or `int2` (groups of [`Self::DEFAULT_INT4_GROUP`]), `int4:GROUP` or
    /// `int2:GROUP`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || MemoryError::invalid("index_format", s, "expected fp8, int4, int4:GROUP, int2 or int2:GROUP");
        let (name, group) = match s.split_once(':') {
            None => (s, Self::DEFAULT_INT4_GROUP),
            Some((name, g)) => (name, g.parse().map_err(|_| bad())?),
        };
        match name {
            "fp8" if !s.contains(':') => Ok(Self::Fp8),
            "int4" => Ok(Self::Int4 { group }),
            "int2" => Ok(Self::Int2 { group }),
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
    /// dividing `dim`; for `int2`, `group` a multiple of 4 dividing `dim` (whole bytes of codes).
    pub fn with_format(dim: usize, format: IndexKeyFormat) -> Result<Self> {
        if dim == 0 {
            return Err(MemoryError::invalid("index_dim", dim, "must be at least 1"));
        }
        if let Some((codes, group)) = format.int_codes() {
            let (bits, per_byte) = (codes.bits, codes.per_byte());
            if group == 0 || !group.is_multiple_of(per_byte) || !dim.is_multiple_of(group) {
                return Err(MemoryError::invalid(
                    "index_format",
                    format,
                    format!("an int{bits} group must be a multiple of {per_byte} and divide the key's {dim} dims"),
                ));
            }
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

    /// Bytes per key: `dim + 4` (fp8), `dim * bits / 8 + 4 * dim / group` (int4, int2).
    pub fn row_bytes(&self) -> usize {
        match self.format.int_codes() {
            None => self.dim + 4,
            Some((codes, group)) => self.codes_bytes(codes) + 4 * (self.dim / group),
        }
    }

    /// Bytes of an integer key's codes (whole bytes: the group divides into them).
    fn codes_bytes(&self, codes: IntCodes) -> usize {
        self.dim / codes.per_byte()
    }

    /// Encodes `values` (`dim` finite f32) into `row` (`row_bytes`).
    pub fn encode(&self, values: &[f32], row: &mut [u8]) -> Result<()> {
        check_len("values", self.dim, values.len())?;
        check_len("row", self.row_bytes(), row.len())?;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(MemoryError::NonFinite { field: "values", index, value });
        }
        match self.format.int_codes() {
            None => {
                let (codes, scale) = row.split_at_mut(self.dim);
                let s = quantize_block(values, codes);
                scale.copy_from_slice(&s.to_le_bytes());
            }
            Some((int, group)) => {
                let (codes, scales) = row.split_at_mut(self.codes_bytes(int));
                int.encode(values, group, codes, scales);
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

    /// Checks every scale of `row` (one for fp8, one per group for int4 and int2) is finite and
    /// positive.
    pub fn check_scales(&self, row: &[u8]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        match self.format.int_codes() {
            None => self.scale(row).map(|_| ()),
            Some((codes, group)) => {
                let scales = &row[self.codes_bytes(codes)..];
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
        match self.format.int_codes() {
            None => {
                let at = self.dim;
                let s = f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
                for (o, &c) in out.iter_mut().zip(&row[..self.dim]) {
                    *o = E4M3_TABLE[usize::from(c)] * s;
                }
            }
            Some((int, group)) => {
                let (codes, scales) = row.split_at(self.codes_bytes(int));
                int.decode(codes, scales, group, out);
            }
        }
    }
}
