//! The swap-in's kernel module: its source with an eviction policy's hooks spliced in
//! (`kernels/swap_in.cu`, `swap_common.cu`, `swap_fused.cu`, `swap_locate.cu`: also the hits-first
//! gather and the copy-engine scatter, `prefetch.cu`), and its loaded
//! functions with their shared memory opted in.

use crate::cuda::driver_error;
use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute_enum;
use hisparse_policy::EvictionPolicy;

use super::facts::{harness_prelude, prelude};
use super::facts::{prefetch_smem_bytes, swap_smem_bytes};
use crate::cuda::device::CudaDevice;
use crate::cuda::sources::{KernelSource, module_name};
use crate::error::{KernelError, Result};

/// The source of the swap-in module with `policy`'s hooks (the step kernel, the miss copies, the
/// prefetch kernel), or `None` for a CPU-only policy.
pub fn swap_in_source(policy: &dyn EvictionPolicy) -> Option<KernelSource> {
    let template = include_str!("../../../kernels/swap_in/swap_in.cu")
        .replace("//@COMMON@", include_str!("../../../kernels/swap_in/swap_common.cu"))
        + include_str!("../../../kernels/swap_in/swap_fused.cu")
        + include_str!("../../../kernels/swap_in/swap_locate.cu")
        + include_str!("../../../kernels/swap_in/prefetch.cu");
    // The policy's program (its records' types and hooks), then the generated prelude, whose
    // argument structs hold pointers to those records.
    let program = hisparse_policy::policy::cuda::program(policy)?;
    let code = template.replace("//@POLICY@", &(program + "\n" + &prelude()));
    Some(KernelSource {
        name: module_name("swap_in", &code),
        code,
        kernels: &[
            "swap_in",
            "copy_misses",
            "gather_rows",
            "prefetch_in",
            "swap_in_fused",
            "locate_in_hot",
            "copy_staged_misses",
            "gather_misses",
            "scatter_landed_misses",
        ],
    })
}

/// The swap-in's kernel sources: per GPU-capable built-in policy its hook harness and its
/// swap-in module, per built-in prefetcher with a GPU form its nomination harness.
pub(crate) fn sources() -> Vec<KernelSource> {
    let mut v = Vec::new();
    for p in hisparse_policy::policy::builtin(0) {
        v.extend(policy_harness(p.as_ref()));
        v.extend(swap_in_source(p.as_ref()));
    }
    for b in hisparse_policy::prefetch::BuiltinPrefetcher::ALL {
        let p = (b.spec().make)(&hisparse_policy::prefetch::PrefetcherConfig { budget: 0 });
        v.extend(prefetcher_harness(p.as_ref()));
    }
    v
}

/// `template` with `policy`'s CUDA program (prelude, hooks, defaults:
/// `hisparse_policy::policy::cuda::program`) spliced in at `//@POLICY@`, or `None` for a
/// CPU-only policy.
fn splice_policy(template: &str, policy: &dyn EvictionPolicy) -> Option<String> {
    let program = hisparse_policy::policy::cuda::program(policy)?;
    Some(template.replace("//@POLICY@", &program))
}

/// The hook harness of `policy` (named by its source), or `None` for a CPU-only policy.
pub fn policy_harness(policy: &dyn EvictionPolicy) -> Option<KernelSource> {
    let code = splice_policy(include_str!("../../../kernels/swap_in/policy_harness.cu"), policy)?;
    Some(KernelSource { name: module_name("policy", &code), code, kernels: &["policy_hooks"] })
}

/// The nomination harness of `prefetcher` (named by its source), or `None` for a CPU-only
/// prefetcher.
pub fn prefetcher_harness(prefetcher: &dyn hisparse_policy::prefetch::Prefetcher) -> Option<KernelSource> {
    let program = hisparse_policy::prefetch::cuda::program(prefetcher)?;
    let code = harness_prelude()
        + &include_str!("../../../kernels/swap_in/prefetch_harness.cu").replace("//@PREFETCHER@", &program);
    Some(KernelSource { name: module_name("prefetch", &code), code, kernels: &["prefetch_nominations"] })
}

/// Batches of at most this many requests run the swap-in as one launch by default
/// (`GpuSwapInState::set_fused_max`).
pub const FUSED_MAX_REQUESTS: usize = 8;

/// The most dynamic shared memory a swap-in block may opt into on sm_90: the 227 KiB a block
/// may have, less 2 KiB for the kernels' static shared memory (warp sums, a 256-bin histogram
/// and a few words: about 1.2 KiB).
pub(crate) const MAX_SHARED_BYTES: usize = 227 * 1024 - 2048;

/// The kernels of one policy's swap-in module, with their shared memory opted in.
pub(crate) struct SwapFunctions {
    pub decide: CudaFunction,
    pub copy: CudaFunction,
    pub prefetch: CudaFunction,
    pub fused: CudaFunction,
    pub locate: CudaFunction,
    pub copy_staged: CudaFunction,
    pub gather: CudaFunction,
    pub scatter_landed: CudaFunction,
}

impl SwapFunctions {
    pub(crate) fn load(
        dev: &CudaDevice,
        policy: &dyn EvictionPolicy,
        device_buffer_size: usize,
        max_sel: usize,
    ) -> Result<Self> {
        let src = swap_in_source(policy)
            .ok_or_else(|| KernelError::invalid("eviction_policy", policy.name(), "has no GPU form"))?;
        let name = src.name.clone();
        let get = |k: &str| dev.function_of(&name, k, || Some(src.clone()));
        let f = Self {
            decide: get("swap_in")?,
            copy: get("copy_misses")?,
            prefetch: get("prefetch_in")?,
            fused: get("swap_in_fused")?,
            locate: get("locate_in_hot")?,
            copy_staged: get("copy_staged_misses")?,
            gather: get("gather_misses")?,
            scatter_landed: get("scatter_landed_misses")?,
        };
        let opt_in = |func: &CudaFunction, bytes: usize| {
            func.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
                .map_err(driver_error("shared memory opt-in"))
        };
        let (b, k) = (device_buffer_size as u64, max_sel as u64);
        opt_in(&f.prefetch, prefetch_smem_bytes(b, k.next_power_of_two(), k) as usize)?;
        opt_in(&f.decide, swap_smem_bytes(b, k) as usize)?;
        opt_in(&f.fused, swap_smem_bytes(b, k) as usize)?;
        Ok(f)
    }
}
