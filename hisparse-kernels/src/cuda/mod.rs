//! The CUDA side of the kernels (feature `cuda`): availability checks that never panic, NVRTC
//! compilation of the embedded `.cu` sources for `sm_90a`, and a device handle that loads each
//! module once.
//!
//! With cudarc's dynamic loading this module always compiles; on a machine without a driver or
//! NVRTC every entry point returns [`KernelError::CudaUnavailable`].

pub(crate) mod attention_launch;
pub(crate) mod backend;
pub(crate) mod backup;
pub(crate) mod buffers;
pub(crate) mod decode_launch;
pub(crate) mod device;
pub mod facts;
mod gemm_launch;
pub(crate) mod gqa_attention_launch;
mod launch_graph;
mod libs;
#[cfg(feature = "nccl")]
mod nccl;
mod nvrtc;
pub(crate) mod oracle_launch;
pub(crate) mod printed_launch;
mod scratch;
pub(crate) mod sources;
pub(crate) mod step_launch;
pub mod swap_in;
pub(crate) mod topk_launch;

#[cfg(feature = "nccl")]
pub use crate::collectives::NcclId;
pub use backend::CudaBackend;
pub use backup::{BackupRows, CudaRowBackup, GpuBackup};
pub use decode_launch::FixedHeadIndexer;
pub use device::CudaDevice;
pub use launch_graph::LaunchGraph;
#[cfg(feature = "nccl")]
pub use libs::nccl_available;
pub use libs::{blas_available, driver_available, library_present, nvrtc_available};
#[cfg(feature = "nccl")]
pub use nccl::NcclRank;
pub use nvrtc::{ARCH, CompiledKernel, compile, cuda_include_dir, nvrtc_version};
pub use printed_launch::LaunchPrint;
pub use sources::{KernelSource, fixed_sources, source};

pub use swap_in::{
    CopyEngineStaging, CudaSwapIn, FUSED_MAX_REQUESTS, GpuNomination, GpuPolicyEnv, GpuPolicyScalars,
    GpuPrefetchSource, GpuSlotRecord, GpuStepCtx, GpuSwapInState, GpuSwapInStateShape, GpuVictimKey, LayerLaunch,
    LocateTargets, MissSource, Nominations, ProtectSpans, Selections, SwapBatch, SwapOutputs, SwapParams, SwapReq,
    SwapTargets, policy_harness, prefetcher_harness, swap_in_source,
};

use crate::error::KernelError;

/// Every kernel source of the workspace: the fixed ones, then the swap-in's (a policy-hook
/// harness and a swap-in module per GPU-capable built-in policy, a nomination harness per
/// built-in prefetcher with a GPU form).
pub fn all_sources() -> Vec<KernelSource> {
    let mut v = fixed_sources();
    v.extend(swap_in::sources());
    v
}

/// Free and total bytes of GPU `ordinal`'s memory.
pub fn memory_info(ordinal: usize) -> Result<(u64, u64), KernelError> {
    let d = CudaDevice::new(ordinal)?;
    let (free, total) = d.context().mem_get_info().map_err(driver_error("cuMemGetInfo"))?;
    Ok((free as u64, total as u64))
}

pub(crate) fn driver_error(context: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> KernelError {
    let context = context.into();
    move |e| KernelError::Cuda { context, message: e.to_string() }
}
