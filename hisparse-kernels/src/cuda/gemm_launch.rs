//! The GEMMs of [`CudaBackend`] through cuBLAS: one handle per backend, made on first use on
//! the backend's stream with a workspace of its own (so that the calls can be captured into a
//! launch graph), and row-major batches mapped onto cuBLAS's column-major strided batches.

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig, sys as blas};
use cudarc::driver::{CudaSlice, DevicePtrMut};
use half::bf16;

use super::driver_error;
use super::printed_launch::addr;
use crate::error::{KernelError, Result};
use crate::gemm::GemmShape;

/// cuBLAS workspace (enough for its bf16 kernels on Hopper).
const WORKSPACE: usize = 32 << 20;

/// A cuBLAS handle and the workspace it was given.
pub(crate) struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

fn blas_error(context: &'static str) -> impl FnOnce(cudarc::cublas::result::CublasError) -> KernelError {
    move |e| KernelError::Cuda { context: context.into(), message: e.to_string() }
}

/// What the GEMM launches use of the backend: its device and its cuBLAS handle, made on first
/// use.
pub(crate) struct GemmLaunch<'a> {
    pub(crate) dev: &'a std::sync::Arc<super::device::CudaDevice>,
    pub(crate) blas: &'a std::sync::OnceLock<Blas>,
}

impl GemmLaunch<'_> {
    /// The backend's cuBLAS handle, made on first use; `CudaUnavailable` without libcublas.
    fn blas(&self) -> Result<&Blas> {
        if let Some(b) = self.blas.get() {
            return Ok(b);
        }
        if !super::blas_available() {
            return Err(KernelError::CudaUnavailable {
                reason: "libcublas not found (add the CUDA lib64 folder to LD_LIBRARY_PATH)".into(),
            });
        }
        let s = self.dev.stream();
        let handle = CudaBlas::new(s.clone()).map_err(blas_error("cublasCreate"))?;
        let mut ws = s.alloc_zeros::<u8>(WORKSPACE).map_err(driver_error("cuBLAS workspace"))?;
        {
            let (p, _guard) = ws.device_ptr_mut(s);
            // SAFETY: the workspace lives as long as the handle (both in `Blas`), on its stream.
            unsafe { blas::cublasSetWorkspace_v2(*handle.handle(), p as *mut _, WORKSPACE) }
                .result()
                .map_err(blas_error("cublasSetWorkspace"))?;
        }
        // Another thread may have won the race; either handle works.
        let _ = self.blas.set(Blas { handle, _workspace: ws });
        self.blas.get().ok_or_else(|| KernelError::invalid("blas", "unset", "the cuBLAS handle was not kept"))
    }

    pub(crate) fn launch_gemm(
        &self,
        g: &GemmShape,
        a: &CudaSlice<bf16>,
        b: &CudaSlice<bf16>,
        c: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        g.check(a.len(), b.len(), c.len())?;
        if g.is_empty() {
            return Ok(());
        }
        let blas = self.blas()?;
        let s = self.dev.stream();
        // Dimensions fit in 32 bits (checked).
        let (m, n, k) = (g.m as i32, g.n as i32, g.k as i32);
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B's memory is Bᵀ (n × k, leading n),
        // A's is Aᵀ (k × m, leading k), C's is Cᵀ (n × m, leading n).
        let cfg = GemmConfig {
            transa: blas::cublasOperation_t::CUBLAS_OP_N,
            transb: blas::cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: bf16::ONE,
            lda: n,
            ldb: k,
            beta: bf16::ZERO,
            ldc: n,
        };
        // A cuBLAS call, not one of our launches: its print is every input of the call (the
        // shape, from which `cfg` and the strides follow, and the three operands).
        let words = [0x6765_6d6d, g.m as u64, g.n as u64, g.k as u64, g.batch as u64, addr(a, s), addr(b, s)];
        self.dev.print.fold(&[&words[..], &[addr(&*c, s)]].concat());
        let r = if g.batch == 1 {
            // SAFETY: the buffers hold the shape's operands (checked above).
            unsafe { blas.handle.gemm(cfg, b, a, c) }
        } else {
            let cfg = StridedBatchedConfig {
                gemm: cfg,
                batch_size: g.batch as i32,
                stride_a: (g.k * g.n) as i64,
                stride_b: (g.m * g.k) as i64,
                stride_c: (g.m * g.n) as i64,
            };
            // SAFETY: as above, for every GEMM of the batch.
            unsafe { blas.handle.gemm_strided_batched(cfg, b, a, c) }
        };
        r.map_err(blas_error("cublasGemmEx"))
    }
}
