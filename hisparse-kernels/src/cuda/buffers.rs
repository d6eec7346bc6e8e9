//! Small helpers every CUDA launch module uses: a lock that reports poisoning as a typed error,
//! and device buffers grown to fit (and uploads skipped when a buffer already holds the data).

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::device::CudaDevice;
use super::driver_error;
use crate::error::{KernelError, Result};

pub(crate) fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| KernelError::Cuda { context: "backend state".into(), message: "poisoned lock".into() })
}

/// `buf` with room for `len` elements (reallocated, uninitialised contents, when too small).
/// Copies `host` into `buf` unless `cache` says `buf` already holds it.
pub(crate) fn upload_cached<T: DeviceRepr + ValidAsZeroBits + Clone + PartialEq>(
    dev: &CudaDevice,
    buf: &mut CudaSlice<T>,
    cache: &mut Vec<T>,
    host: &[T],
) -> Result<()> {
    if cache.as_slice() == host {
        return Ok(());
    }
    if buf.len() < host.len() {
        *buf = dev.stream().alloc_zeros(host.len().next_power_of_two()).map_err(driver_error("scratch alloc"))?;
    }
    dev.stream().memcpy_htod(host, &mut buf.slice_mut(..host.len())).map_err(driver_error("upload"))?;
    cache.clear();
    cache.extend_from_slice(host);
    Ok(())
}

pub(crate) fn room<T: DeviceRepr + ValidAsZeroBits>(
    dev: &CudaDevice,
    buf: &mut CudaSlice<T>,
    len: usize,
) -> Result<()> {
    if buf.len() < len {
        *buf = dev.stream().alloc_zeros(len.next_power_of_two()).map_err(driver_error("scratch alloc"))?;
    }
    Ok(())
}
