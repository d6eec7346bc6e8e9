//! [`MappedHostTier`] (feature `cuda`): the host tier's mapping registered with the CUDA driver
//! (`crate::cuda::HostRegistration`) together with its layout — the typed handle through which
//! kernels reach host rows.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use memmap2::MmapRaw;

use super::HostTierLayout;
use crate::cuda::HostRegistration;
use crate::error::{MemoryError, Result};

/// A registration and the mapping it covers; the registration is dropped first (field order).
#[derive(Debug)]
struct Mapped {
    reg: HostRegistration,
    map: Arc<MmapRaw>,
}

/// The host tier as kernels see it: its device address, length and layout. Cloning shares one
/// registration; the mapping stays mapped and registered while any clone lives, so a kernel
/// handed this handle can never read or write unmapped memory.
///
/// Invariant: `layout().rows() * layout().row_bytes <= len()`.
#[derive(Clone, Debug)]
pub struct MappedHostTier {
    inner: Arc<Mapped>,
    layout: HostTierLayout,
}

impl MappedHostTier {
    /// Registers `map` (whose first `layout.rows() * layout.row_bytes` bytes hold the rows).
    pub(crate) fn register(ctx: &Arc<CudaContext>, map: Arc<MmapRaw>, layout: HostTierLayout) -> Result<Self> {
        let rows_bytes = layout.rows().checked_mul(layout.row_bytes as u64);
        if rows_bytes.is_none_or(|b| b > map.len() as u64) {
            return Err(MemoryError::invalid("layout", format!("{layout:?}"), "larger than the mapping"));
        }
        // SAFETY: `map` is a live mapping kept alive by `Mapped` for as long as the registration.
        let reg = unsafe { HostRegistration::register(ctx, map.as_mut_ptr(), map.len())? };
        Ok(Self { inner: Arc::new(Mapped { reg, map }), layout })
    }

    /// The address kernels use for the mapping's first byte.
    pub fn device_ptr(&self) -> u64 {
        self.inner.reg.device_ptr()
    }

    /// Bytes mapped and registered.
    pub fn len(&self) -> usize {
        self.inner.reg.len()
    }

    /// Whether nothing is mapped (never).
    pub fn is_empty(&self) -> bool {
        self.inner.reg.is_empty()
    }

    /// The tier's layout (layers, pages per layer, row size, positions per page).
    pub fn layout(&self) -> HostTierLayout {
        self.layout
    }

    /// Copies row `row` into `dst` (exactly `row_bytes` long) on the host: the bytes a kernel
    /// reads at `device_ptr() + row * row_bytes` (the host side of a copy-engine staging path).
    /// Names `row` past the tier, or a `dst` of another length.
    pub fn read_row(&self, row: u64, dst: &mut [u8]) -> Result<()> {
        let rb = self.layout.row_bytes;
        if dst.len() != rb {
            return Err(MemoryError::invalid("dst", dst.len(), format!("a row is {rb} bytes")));
        }
        if row >= self.layout.rows() {
            return Err(MemoryError::invalid("row", row, format!("the host tier has {} rows", self.layout.rows())));
        }
        // Invariant (the struct's): rows() * row_bytes <= the mapping's length, so the row lies
        // inside the live mapping `inner` keeps; row < rows() makes the product fit in usize.
        let at = row as usize * rb;
        // SAFETY: `at..at + rb` lies inside the mapping (above), which outlives `self`; `dst`
        // is a distinct Rust buffer. Rows a swap-in reads are not written while it reads them
        // (a row is written once, when its token is made, before any selection can name it).
        unsafe { std::ptr::copy_nonoverlapping(self.inner.map.as_ptr().add(at), dst.as_mut_ptr(), rb) };
        Ok(())
    }

    /// Checks that every row index of `rows` lies inside the mapping (row `i` at byte
    /// `i * row_bytes`); names `field` otherwise.
    pub fn check_rows(&self, field: &'static str, rows: &[u64]) -> Result<()> {
        let total = self.layout.rows();
        match rows.iter().find(|&&r| r >= total) {
            Some(&bad) => Err(MemoryError::invalid(field, bad, format!("the host tier has {total} rows"))),
            None => Ok(()),
        }
    }
}
