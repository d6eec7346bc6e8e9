//! The lightning-indexer key: `dim` e4m3 values and one fp32 scale (132 B for dim 128), as
//! DeepGEMM's fp8 indexer cache stores it per token.

use crate::error::{MemoryError, Result, check_len};
use crate::fp8::E4M3_TABLE;
use crate::row::fp8::{quantize_block, read_scale};

/// The byte layout of one index key: `[0, dim)` e4m3 codes, `[dim, dim + 4)` the fp32 scale
/// (little-endian, power of two when written by [`IndexKeyLayout::encode`]).
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
}

impl IndexKeyLayout {
    /// A layout for keys of `dim` values (`dim >= 1`).
    pub fn new(dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(MemoryError::invalid("index_dim", dim, "must be at least 1"));
        }
        Ok(Self { dim })
    }

    /// Values per key.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Bytes per key: `dim + 4`.
    pub fn row_bytes(&self) -> usize {
        self.dim + 4
    }

    /// Encodes `values` (`dim` finite f32) into `row` (`row_bytes`).
    pub fn encode(&self, values: &[f32], row: &mut [u8]) -> Result<()> {
        check_len("values", self.dim, values.len())?;
        check_len("row", self.row_bytes(), row.len())?;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(MemoryError::NonFinite { field: "values", index, value });
        }
        let (codes, scale) = row.split_at_mut(self.dim);
        let s = quantize_block(values, codes);
        scale.copy_from_slice(&s.to_le_bytes());
        Ok(())
    }

    /// The key's scale, checked to be finite and positive.
    pub fn scale(&self, row: &[u8]) -> Result<f32> {
        check_len("row", self.row_bytes(), row.len())?;
        read_scale(&row[self.dim..], "index_key", 0)
    }

    /// Decodes `row` into `out` (`dim` f32): code value times scale.
    pub fn decode(&self, row: &[u8], out: &mut [f32]) -> Result<()> {
        check_len("out", self.dim, out.len())?;
        let s = self.scale(row)?;
        for (o, &c) in out.iter_mut().zip(&row[..self.dim]) {
            *o = E4M3_TABLE[usize::from(c)] * s;
        }
        Ok(())
    }
}
