//! The index key: what the device keeps for selection. Five formats ([`IndexKeyFormat`]), four
//! with a row per position: `dim` e4m3 values and one fp32 scale (132 B for dim 128, as
//! DeepGEMM's fp8 indexer cache stores it per token), `dim` 4-bit or 2-bit integers with an
//! fp32 scale per group of values, or each group's largest values and their places
//! (`top_channels.rs`); and page summaries, a row per `tokens` positions (`page_summary.rs`).

use serde::{Deserialize, Serialize};

use crate::error::{MemoryError, Result, check_len};
use crate::fp8::decode_e4m3_scaled;
use crate::row::fp8::{quantize_block, read_scale};
use crate::row::page_summary;
use crate::row::top_channels::TopChannels;

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
/// - `pages` with `tokens` (Quest's page summaries): one row per `tokens` consecutive positions
///   (a page of the key pool holds `page_tokens / tokens` of them), `[0, 2 dim)` the element-wise
///   minima of their keys, `[2 dim, 4 dim)` the maxima, bf16 rounded outward. A key is written
///   as a box of one point and folded into its page's box ([`IndexKeyLayout::fold`]); a query
///   scores every position of a page by the largest product over the box
///   ([`page_upper_bound`](crate::page_upper_bound)).
/// - `channels` with `keep` and `group`: of every `group` values the `keep` of largest
///   magnitude (ties to the lower place); per group their places (u8, ascending), then per group
///   their e4m3 codes, then one fp32 scale for the key (a power of two); the other values read
///   as zero, so a query's product is over the kept ones.
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
    /// The bf16 minimum and maximum of every `tokens` positions' keys (Quest's page summaries).
    Pages {
        /// Positions per summary (at least 2, dividing `4 * dim` and the pool's page).
        tokens: usize,
    },
    /// Of every `group` values of a key, the `keep` of largest magnitude (their places and e4m3
    /// codes, one fp32 scale); the rest read as zero.
    Channels {
        /// Values kept per group (1..=group).
        keep: usize,
        /// Values per group (1..=256, dividing the key's dims).
        group: usize,
    },
}

impl IndexKeyFormat {
    /// The 4-bit and 2-bit formats' group when none is given.
    pub const DEFAULT_INT4_GROUP: usize = 32;

    /// Positions per page summary when none is given.
    pub const DEFAULT_PAGE_SUMMARY_TOKENS: usize = 16;

    /// Top-channel keys' `(keep, group)` when none is given.
    pub const DEFAULT_CHANNELS: (usize, usize) = (16, 64);

    /// Its name on the command line (`fp8`, `int4:GROUP`, `int2:GROUP`, `pages:TOKENS`).
    pub fn name(&self) -> String {
        match self {
            Self::Fp8 => "fp8".to_owned(),
            Self::Int4 { group } => format!("int4:{group}"),
            Self::Int2 { group } => format!("int2:{group}"),
            Self::Pages { tokens } => format!("pages:{tokens}"),
            Self::Channels { keep, group } => format!("channels:{keep}:{group}"),
        }
    }

    /// Positions one stored row describes: `tokens` for page summaries, 1 otherwise.
    pub fn positions_per_row(&self) -> usize {
        match *self {
            Self::Pages { tokens } => tokens,
            _ => 1,
        }
    }

    /// An integer format's codes and group (`None` for fp8).
    fn int_codes(&self) -> Option<(IntCodes, usize)> {
        match *self {
            Self::Fp8 | Self::Pages { .. } | Self::Channels { .. } => None,
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
    /// `fp8`, `int4` or `int2` (groups of [`Self::DEFAULT_INT4_GROUP`]), `int4:GROUP`,
    /// `int2:GROUP`, `pages` ([`Self::DEFAULT_PAGE_SUMMARY_TOKENS`] positions), `pages:TOKENS`,
    /// `channels` ([`Self::DEFAULT_CHANNELS`]), `channels:KEEP` (of 64) or
    /// `channels:KEEP:GROUP`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            MemoryError::invalid(
                "index_format",
                s,
                "expected fp8, int4, int4:GROUP, int2, int2:GROUP, pages, pages:TOKENS, channels, channels:KEEP                  or channels:KEEP:GROUP",
            )
        };
        if let Some(rest) = s.strip_prefix("channels") {
            let (keep, group) = Self::DEFAULT_CHANNELS;
            let num = |x: &str| x.parse::<usize>().map_err(|_| bad());
            return match rest.strip_prefix(':').map(|r| r.split_once(':')) {
                None if rest.is_empty() => Ok(Self::Channels { keep, group }),
                Some(None) => Ok(Self::Channels { keep: num(&rest[1..])?, group }),
                Some(Some((k, g))) => Ok(Self::Channels { keep: num(k)?, group: num(g)? }),
                None => Err(bad()),
            };
        }
        let (name, n) = match s.split_once(':') {
            None => (s, None),
            Some((name, g)) => (name, Some(g.parse().map_err(|_| bad())?)),
        };
        let group = n.unwrap_or(Self::DEFAULT_INT4_GROUP);
        match name {
            "fp8" if n.is_none() => Ok(Self::Fp8),
            "int4" => Ok(Self::Int4 { group }),
            "int2" => Ok(Self::Int2 { group }),
            "pages" => Ok(Self::Pages { tokens: n.unwrap_or(Self::DEFAULT_PAGE_SUMMARY_TOKENS) }),
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
    /// dividing `dim`; for `int2`, `group` a multiple of 4 dividing `dim` (whole bytes of codes);
    /// for `pages`, `tokens` at least 2 and dividing the summary's `4 * dim` bytes (whole bytes
    /// per position).
    pub fn with_format(dim: usize, format: IndexKeyFormat) -> Result<Self> {
        if dim == 0 {
            return Err(MemoryError::invalid("index_dim", dim, "must be at least 1"));
        }
        if let IndexKeyFormat::Pages { tokens } = format
            && (tokens < 2 || !page_summary::row_bytes(dim).is_multiple_of(tokens))
        {
            return Err(MemoryError::invalid(
                "index_format",
                format,
                format!(
                    "a page summary covers at least 2 positions, dividing its {} bytes (keys of {dim} dims)",
                    page_summary::row_bytes(dim)
                ),
            ));
        }
        if let IndexKeyFormat::Channels { keep, group } = format
            && !(group > 0 && group <= 256 && dim.is_multiple_of(group) && keep > 0 && keep <= group)
        {
            return Err(MemoryError::invalid(
                "index_format",
                format,
                format!(
                    "a channel group holds 1 to 256 values, dividing the key's {dim} dims, and keeps 1 to all of them"
                ),
            ));
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

    /// Bytes per stored row: `dim + 4` (fp8), `dim * bits / 8 + 4 * dim / group` (int4, int2),
    /// `4 * dim` (a page summary, for [`IndexKeyFormat::positions_per_row`] positions). A key
    /// handed to the cache is one row of this size (a page summary's: a box of one point).
    pub fn row_bytes(&self) -> usize {
        match (self.format, self.format.int_codes()) {
            (IndexKeyFormat::Pages { .. }, _) => page_summary::row_bytes(self.dim),
            (IndexKeyFormat::Channels { keep, group }, _) => TopChannels { dim: self.dim, keep, group }.row_bytes(),
            (_, None) => self.dim + 4,
            (_, Some((codes, group))) => self.codes_bytes(codes) + 4 * (self.dim / group),
        }
    }

    /// Positions one stored row describes ([`IndexKeyFormat::positions_per_row`]).
    pub fn positions_per_row(&self) -> usize {
        self.format.positions_per_row()
    }

    /// Device bytes per position: `row_bytes / positions_per_row` (exact: `with_format` checks
    /// the division).
    pub fn bytes_per_position(&self) -> usize {
        self.row_bytes() / self.positions_per_row()
    }

    /// Bytes of a pool page of `page_tokens` positions; refused where a page summary's
    /// positions do not divide the page.
    pub fn page_bytes(&self, page_tokens: usize) -> Result<usize> {
        let q = self.positions_per_row();
        if !page_tokens.is_multiple_of(q) {
            return Err(MemoryError::invalid(
                "index_format",
                self.format,
                format!("its summaries of {q} positions must divide a page of {page_tokens}"),
            ));
        }
        (page_tokens / q)
            .checked_mul(self.row_bytes())
            .ok_or_else(|| MemoryError::invalid("page_tokens", page_tokens, "its key bytes overflow"))
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
        match (self.format, self.format.int_codes()) {
            (IndexKeyFormat::Pages { .. }, _) => page_summary::encode(values, row),
            (IndexKeyFormat::Channels { keep, group }, _) => {
                TopChannels { dim: self.dim, keep, group }.encode(values, row)
            }
            (_, None) => {
                let (codes, scale) = row.split_at_mut(self.dim);
                let s = quantize_block(values, codes);
                scale.copy_from_slice(&s.to_le_bytes());
            }
            (_, Some((int, group))) => {
                let (codes, scales) = row.split_at_mut(self.codes_bytes(int));
                int.encode(values, group, codes, scales);
            }
        }
        Ok(())
    }

    /// Widens the page summary `into` to hold the summary `from` (a key's box of one point, or
    /// another page's): the box of both. Refused for the formats with a row per position.
    pub fn fold(&self, into: &mut [u8], from: &[u8]) -> Result<()> {
        check_len("into", self.row_bytes(), into.len())?;
        check_len("from", self.row_bytes(), from.len())?;
        if !matches!(self.format, IndexKeyFormat::Pages { .. }) {
            return Err(MemoryError::invalid("index_format", self.format, "keeps a row per position: nothing folds"));
        }
        page_summary::fold(self.dim, into, from);
        Ok(())
    }

    /// The page summaries of consecutive positions' keys (`keys`: one row each, the first at a
    /// summary's first position): a row per `positions_per_row` of them, the last maybe partial.
    pub fn fold_positions(&self, keys: &[u8]) -> Result<Vec<u8>> {
        let (rb, q) = (self.row_bytes(), self.positions_per_row());
        if !keys.len().is_multiple_of(rb) {
            return Err(MemoryError::invalid("keys", keys.len(), format!("not a whole number of {rb}-byte rows")));
        }
        let mut out = Vec::with_capacity(keys.len().div_ceil(rb * q) * rb);
        for page in keys.chunks(rb * q) {
            let mut sum = page[..rb].to_vec();
            for k in page[rb..].chunks_exact(rb) {
                self.fold(&mut sum, k)?;
            }
            out.extend_from_slice(&sum);
        }
        Ok(out)
    }

    /// The box of a page summary whose row was checked ([`Self::check_scales`]): `mins` and
    /// `maxs` hold `dim` values each. Refused for the formats with a row per position.
    pub fn bounds(&self, row: &[u8], mins: &mut [f32], maxs: &mut [f32]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        check_len("mins", self.dim, mins.len())?;
        check_len("maxs", self.dim, maxs.len())?;
        if !matches!(self.format, IndexKeyFormat::Pages { .. }) {
            return Err(MemoryError::invalid("index_format", self.format, "stores keys, not bounds"));
        }
        self.bounds_checked(row, mins, maxs);
        Ok(())
    }

    /// [`Self::bounds`] of a page summary's row whose length and bounds were checked
    /// ([`Self::check_scales`]): the kernels' form. `mins` and `maxs` hold `dim` values.
    pub fn bounds_checked(&self, row: &[u8], mins: &mut [f32], maxs: &mut [f32]) {
        page_summary::bounds(row, mins, maxs);
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
    /// positive; a page summary's bounds, that they are numbers and each minimum at most its
    /// maximum.
    pub fn check_scales(&self, row: &[u8]) -> Result<()> {
        check_len("row", self.row_bytes(), row.len())?;
        match (self.format, self.format.int_codes()) {
            (IndexKeyFormat::Pages { .. }, _) => page_summary::check(self.dim, row),
            (IndexKeyFormat::Channels { keep, group }, _) => TopChannels { dim: self.dim, keep, group }.check(row),
            (_, None) => self.scale(row).map(|_| ()),
            (_, Some((codes, group))) => {
                let scales = &row[self.codes_bytes(codes)..];
                (0..self.dim / group).try_for_each(|g| read_scale(&scales[4 * g..], "index_key", g).map(|_| ()))
            }
        }
    }

    /// [`Self::check_scales`] of every row of `rows` (whole rows, one after another), the format
    /// matched once: for fp8 keys a loop over their scales alone.
    pub fn check_scales_of_rows(&self, rows: &[u8]) -> Result<()> {
        let rb = self.row_bytes();
        if !rows.len().is_multiple_of(rb) {
            return Err(MemoryError::invalid("rows", rows.len(), format!("not whole rows of {rb} bytes")));
        }
        if let IndexKeyFormat::Channels { keep, group } = self.format {
            // The first row that fails, if any, checked again for its error.
            let shape = TopChannels { dim: self.dim, keep, group };
            return match rows.chunks_exact(rb).find(|row| !shape.is_valid(row)) {
                Some(row) => shape.check(row),
                None => Ok(()),
            };
        }
        if self.format != IndexKeyFormat::Fp8 {
            return rows.chunks_exact(rb).try_for_each(|row| self.check_scales(row));
        }
        match rows.chunks_exact(rb).find(|row| read_scale(&row[self.dim..], "index_key", 0).is_err()) {
            Some(row) => read_scale(&row[self.dim..], "index_key", 0).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Decodes `row` into `out` (`dim` f32): code value times its scale; every scale checked. A
    /// page summary holds bounds, not a key: refused ([`Self::bounds`] reads it).
    pub fn decode(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        check_len("out", self.dim, out.len())?;
        if matches!(self.format, IndexKeyFormat::Pages { .. }) {
            return Err(MemoryError::invalid("index_format", self.format, "holds bounds, not keys: read its bounds"));
        }
        self.check_scales(row)?;
        self.decode_checked(row, out);
        Ok(())
    }

    /// A checked top-channel key's kept values, written to `values` (`dim / group * keep`,
    /// group by group), and their places within their groups, in the same order: what a score
    /// over the kept channels alone reads. `None` for the other formats (`values` untouched).
    pub fn decode_kept<'r>(&self, row: &'r [u8], values: &mut [f32]) -> Option<&'r [u8]> {
        match self.format {
            IndexKeyFormat::Channels { keep, group } => {
                Some(TopChannels { dim: self.dim, keep, group }.decode_kept(row, values))
            }
            _ => None,
        }
    }

    /// [`Self::decode`] of a row whose length and scales were checked ([`Self::check_scales`]):
    /// the kernels' form, which decodes the same key many times. `out` holds `dim` values; a page
    /// summary decodes to its box's centre.
    pub fn decode_checked(&self, row: &[u8], out: &mut [f32]) {
        match (self.format, self.format.int_codes()) {
            (IndexKeyFormat::Pages { .. }, _) => {
                let mut maxs = vec![0f32; self.dim];
                page_summary::bounds(row, out, &mut maxs);
                for (o, m) in out.iter_mut().zip(&maxs) {
                    *o = 0.5 * *o + 0.5 * m;
                }
            }
            (IndexKeyFormat::Channels { keep, group }, _) => {
                TopChannels { dim: self.dim, keep, group }.decode(row, out)
            }
            (_, None) => {
                let at = self.dim;
                let s = f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
                decode_e4m3_scaled(&row[..self.dim], s, out);
            }
            (_, Some((int, group))) => {
                let (codes, scales) = row.split_at(self.codes_bytes(int));
                int.decode(codes, scales, group, out);
            }
        }
    }
}
