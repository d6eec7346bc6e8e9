//! CUDA memory (feature `cuda`): [`CudaMemory`], the device tier's buffers in GPU memory;
//! [`HostRegistration`], which registers a host range with the driver as mapped pinned memory
//! so that kernels read it directly, and unregisters it when dropped; and [`MappedHostTier`],
//! the typed handle through which kernels reach the host tier: it keeps the mapping and its
//! registration alive, and carries the tier's layout so that launches can bound every access.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use memmap2::MmapRaw;

use crate::device_memory::{DeviceMemory, Element};
use crate::error::{MemoryError, Result};
use crate::host_tier::HostTierLayout;

fn driver(what: &str) -> impl FnOnce(cudarc::driver::DriverError) -> MemoryError + '_ {
    move |e| MemoryError::Io { what: format!("CUDA {what}"), message: e.to_string() }
}

fn check(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(MemoryError::Io { what: format!("CUDA {what}"), message: format!("{r:?}") })
    }
}

/// GPU memory through one stream: buffers are `CudaSlice`s; copies are ordered on the stream.
#[derive(Clone, Debug)]
pub struct CudaMemory {
    stream: Arc<CudaStream>,
}

impl CudaMemory {
    /// Memory of the stream's device, copied through `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Self { stream }
    }

    /// The stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

fn bounds(field: &'static str, offset: usize, n: usize, len: usize) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(MemoryError::OutOfBounds { field, start: offset, end: offset.saturating_add(n), len }),
    }
}

impl DeviceMemory for CudaMemory {
    type Buffer<T: Element> = CudaSlice<T>;

    fn kind(&self) -> &'static str {
        "cuda"
    }

    /// A zero-length request gets one element (the driver refuses empty allocations); pools
    /// that may be empty (a resident-mode tier's hot buffers) are never indexed.
    fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<CudaSlice<T>> {
        T::cuda_alloc_zeros(&self.stream, len.max(1)).map_err(driver("alloc"))
    }

    fn len<T: Element>(&self, buf: &CudaSlice<T>) -> usize {
        buf.len()
    }

    fn write<T: Element>(&self, dst: &mut CudaSlice<T>, offset: usize, src: &[T]) -> Result<()> {
        let r = bounds("dst", offset, src.len(), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        T::cuda_htod(&self.stream, src, &mut dst.slice_mut(r)).map_err(driver("memcpy host to device"))
    }

    fn read<T: Element>(&self, src: &CudaSlice<T>, offset: usize, dst: &mut [T]) -> Result<()> {
        let r = bounds("src", offset, dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        T::cuda_dtoh(&self.stream, &src.slice(r), dst).map_err(driver("memcpy device to host"))?;
        self.stream.synchronize().map_err(driver("synchronize"))
    }
}

/// A host range registered with the CUDA driver as mapped pinned memory (`cuMemHostRegister`
/// with DEVICEMAP | PORTABLE); unregistered when dropped, which must happen before the range is
/// unmapped (the owner keeps this guard in a field declared before the mapping).
#[derive(Debug)]
pub struct HostRegistration {
    ptr: *mut c_void,
    len: usize,
    device_ptr: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the registration only records an address; the driver calls it makes are thread-safe.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; no method mutates through the pointer.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` with `ctx`'s device.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is a live mapping that outlives the returned guard.
    pub unsafe fn register(ctx: &Arc<CudaContext>, ptr: *mut u8, len: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(driver("bind context"))?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller guarantees the range is mapped for the guard's life.
        check(unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) }, "cuMemHostRegister")?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` was just registered; `dptr` is a valid out pointer.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr.cast(), 0) };
        if let Err(e) = check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: registered above, not yet handed out.
            unsafe { sys::cuMemHostUnregister(ptr.cast()) };
            return Err(e);
        }
        Ok(Self { ptr: ptr.cast(), len, device_ptr: dptr, ctx: Arc::clone(ctx) })
    }

    /// The address kernels use for the range's first byte (a plain `u64` kernel argument; never
    /// wrap it in a `CudaSlice`, whose drop would free it as device memory).
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is registered (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: registered in `register`, unregistered once, before the owner unmaps it.
        unsafe { sys::cuMemHostUnregister(self.ptr) };
    }
}

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
