//! [`PinnedHost`]: pinned host memory mapped into the device's address space, owned (freed when
//! dropped), for buffers that kernels write and the host reads or that the copy engine reads
//! (the copy-engine staging path's lists and landing rows).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, sys};

use crate::cuda::driver_error;
use crate::error::{KernelError, Result};

/// A driver call's result as this crate's error, naming `what`.
pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(KernelError::Cuda { context: what.to_owned(), message: format!("{r:?}") })
    }
}

/// Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with DEVICEMAP |
/// PORTABLE), zeroed, freed when dropped.
pub(crate) struct PinnedHost {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) device_ptr: u64,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; who reads and writes it when is
// ordered by the stream (the module's invariant).
unsafe impl Send for PinnedHost {}
// SAFETY: as above; no method mutates through a shared reference.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let len = len.max(16);
        ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: `p` is a valid out pointer; the driver allocates `len` bytes.
        check(unsafe { sys::cuMemHostAlloc(&mut p, len, flags) }, "cuMemHostAlloc (copy-engine staging)")?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `p` was just allocated as mapped memory.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
        let me = Self { ptr: p.cast(), len, device_ptr: d, ctx: Arc::clone(ctx) };
        check(r, "cuMemHostGetDevicePointer (copy-engine staging)")?;
        // SAFETY: `len` bytes at `ptr` are ours.
        unsafe { std::ptr::write_bytes(me.ptr, 0, len) };
        Ok(me)
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
        unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
    }
}
