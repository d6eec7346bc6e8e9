//! `DeviceMemory`: the memory a backend's kernels read and write (CUDA global memory, or plain
//! host memory for the CPU emulation), as typed buffers with bounds-checked copies in and out.

use crate::error::{MemoryError, Result};

/// The element types' private side. Under the `cuda` feature each type also knows its CUDA
/// copies here, so that turning the feature on adds nothing to [`Element`]'s bounds (the
/// feature is additive: code that compiles without it compiles with it).
mod sealed {
    #[cfg(feature = "cuda")]
    use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DriverError};

    pub trait Sealed: Sized {
        #[cfg(feature = "cuda")]
        fn cuda_alloc_zeros(stream: &std::sync::Arc<CudaStream>, len: usize) -> Result<CudaSlice<Self>, DriverError>;
        #[cfg(feature = "cuda")]
        fn cuda_htod(
            stream: &std::sync::Arc<CudaStream>,
            src: &[Self],
            dst: &mut CudaViewMut<'_, Self>,
        ) -> Result<(), DriverError>;
        #[cfg(feature = "cuda")]
        fn cuda_dtoh(
            stream: &std::sync::Arc<CudaStream>,
            src: &CudaView<'_, Self>,
            dst: &mut [Self],
        ) -> Result<(), DriverError>;
    }

    macro_rules! sealed {
        ($($t:ty),*) => {$(
            impl Sealed for $t {
                #[cfg(feature = "cuda")]
                fn cuda_alloc_zeros(stream: &std::sync::Arc<CudaStream>, len: usize) -> Result<CudaSlice<Self>, DriverError> {
                    stream.alloc_zeros::<$t>(len)
                }
                #[cfg(feature = "cuda")]
                fn cuda_htod(stream: &std::sync::Arc<CudaStream>, src: &[Self], dst: &mut CudaViewMut<'_, Self>) -> Result<(), DriverError> {
                    stream.memcpy_htod(src, dst)
                }
                #[cfg(feature = "cuda")]
                fn cuda_dtoh(stream: &std::sync::Arc<CudaStream>, src: &CudaView<'_, Self>, dst: &mut [Self]) -> Result<(), DriverError> {
                    stream.memcpy_dtoh(src, dst)
                }
            }
        )*};
    }
    sealed!(u8, u16, u32, u64, i32, i64, f32, half::bf16);
}

/// A plain-old-data element type that kernels read and write: `u8`, `u16`, `u32`, `u64`, `i32`,
/// `i64`, `f32` and `bf16` (sealed: the kernels know exactly these).
pub trait Element: bytemuck::Pod + Default + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed {}

impl Element for u8 {}
impl Element for u16 {}
impl Element for u32 {}
impl Element for u64 {}
impl Element for i32 {}
impl Element for i64 {}
impl Element for f32 {}
impl Element for half::bf16 {}

/// Memory on the device a backend computes on. Kernels take `Buffer<T>`s of their backend's
/// memory; data enters and leaves through [`DeviceMemory::write`] and [`DeviceMemory::read`].
///
/// The CPU backend uses [`EmulatedDevice`], whose buffers are plain `Vec`s.
pub trait DeviceMemory: Send + Sync + 'static {
    /// A buffer of `T` on the device.
    type Buffer<T: Element>: Send + Sync;

    /// A short name of the memory kind (`"cpu"`, `"cuda"`).
    fn kind(&self) -> &'static str;

    /// A new buffer of `len` zeroed elements.
    fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<Self::Buffer<T>>;

    /// Number of elements of `buf`.
    fn len<T: Element>(&self, buf: &Self::Buffer<T>) -> usize;

    /// Copies `src` into `dst[offset..offset + src.len()]`.
    fn write<T: Element>(&self, dst: &mut Self::Buffer<T>, offset: usize, src: &[T]) -> Result<()>;

    /// Copies `src[offset..offset + dst.len()]` into `dst`.
    fn read<T: Element>(&self, src: &Self::Buffer<T>, offset: usize, dst: &mut [T]) -> Result<()>;

    /// A new buffer holding a copy of `src`.
    fn upload<T: Element>(&self, src: &[T]) -> Result<Self::Buffer<T>> {
        let mut buf = self.alloc_zeroed(src.len())?;
        self.write(&mut buf, 0, src)?;
        Ok(buf)
    }

    /// A host copy of the whole buffer.
    fn download<T: Element>(&self, src: &Self::Buffer<T>) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len(src)];
        self.read(src, 0, &mut out)?;
        Ok(out)
    }
}

/// The CPU emulation of a device: buffers are host `Vec`s, copies are `memcpy`s.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmulatedDevice;

fn range(field: &'static str, offset: usize, n: usize, len: usize) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(offset..end),
        _ => Err(MemoryError::OutOfBounds { field, start: offset, end: offset.saturating_add(n), len }),
    }
}

impl DeviceMemory for EmulatedDevice {
    type Buffer<T: Element> = Vec<T>;

    fn kind(&self) -> &'static str {
        "cpu"
    }

    /// Host memory: a refused allocation is an error, never an abort.
    fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|e| MemoryError::Io {
            what: format!("allocating {len} elements of emulated device memory"),
            message: e.to_string(),
        })?;
        v.resize(len, T::zeroed());
        Ok(v)
    }

    fn len<T: Element>(&self, buf: &Vec<T>) -> usize {
        buf.len()
    }

    fn write<T: Element>(&self, dst: &mut Vec<T>, offset: usize, src: &[T]) -> Result<()> {
        let r = range("dst", offset, src.len(), dst.len())?;
        dst[r].copy_from_slice(src);
        Ok(())
    }

    fn read<T: Element>(&self, src: &Vec<T>, offset: usize, dst: &mut [T]) -> Result<()> {
        let r = range("src", offset, dst.len(), src.len())?;
        dst.copy_from_slice(&src[r]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulated_copies_are_bounds_checked() {
        let m = EmulatedDevice;
        let mut b = m.alloc_zeroed::<f32>(8).unwrap();
        m.write(&mut b, 5, &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(m.download(&b).unwrap(), vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
        let e = m.write(&mut b, 6, &[1.0, 2.0, 3.0]).unwrap_err();
        assert_eq!(e, MemoryError::OutOfBounds { field: "dst", start: 6, end: 9, len: 8 });
        let mut out = [0f32; 2];
        m.read(&b, 6, &mut out).unwrap();
        assert_eq!(out, [2.0, 3.0]);
        assert!(m.read(&b, usize::MAX, &mut out).is_err());
        assert_eq!(m.upload(&[7u8, 9]).unwrap(), vec![7u8, 9]);
    }
}
