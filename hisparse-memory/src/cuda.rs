//! CUDA memory (feature `cuda`): [`CudaMemory`], the device tier's buffers in GPU memory;
//! [`HostRegistration`], which registers a host range with the driver as mapped pinned memory
//! so that kernels read it directly, and unregisters it when dropped (the host tier's own
//! registered mapping is `crate::host_tier::MappedHostTier`).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use crate::device_memory::{DeviceMemory, Element};
use crate::error::{MemoryError, Result};

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
