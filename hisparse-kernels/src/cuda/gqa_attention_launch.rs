//! The grouped-query attention's launch (`kernels/gqa_attention.cu`) over rows in a pool: the
//! host-side checks that run before it (heads and groups, head size, buffer lengths, the shared
//! memory a request's selection needs) and the argument struct.

use std::sync::OnceLock;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::{KvRowFormat, RowHeads};

use super::attention_launch::{AttnOutputs, AttnScratch};
use super::device::CudaDevice;
use super::driver_error;
use super::facts::{GQA_MAX_HEAD_DIM, GQA_THREADS, GqaParams};
use super::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result, check_len};
use crate::swap_in::AttentionQuery;

/// The most dynamic shared memory the kernel opts into (the 227 KiB a block may have on sm_90,
/// less room for its static words).
const GQA_MAX_SMEM: usize = 227 * 1024 - 1024;

/// The kernel, loaded (with its shared memory opted in) on first use: a backend that never
/// meets grouped-query rows never compiles it.
#[derive(Clone, Default)]
pub(crate) struct GqaAttention {
    kernel: OnceLock<CudaFunction>,
}

impl GqaAttention {
    fn kernel(&self, dev: &CudaDevice) -> Result<&CudaFunction> {
        if let Some(k) = self.kernel.get() {
            return Ok(k);
        }
        let kernel = dev.function("gqa_attention", "sparse_gqa_decode")?;
        kernel
            .set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                GQA_MAX_SMEM as i32,
            )
            .map_err(driver_error("grouped-query attention shared memory opt-in"))?;
        Ok(self.kernel.get_or_init(|| kernel))
    }

    /// Sparse attention of `q`'s requests over the grouped-query rows of `pool` into `outs`; a
    /// location outside the pool raises `outs.fault` (the row reads as zeros). Every size is
    /// checked before the launch.
    pub(crate) fn launch(
        &self,
        dev: &CudaDevice,
        sc: &mut AttnScratch,
        q: &AttentionQuery<'_, CudaMemory>,
        pool: &CudaSlice<u8>,
        outs: AttnOutputs<'_>,
    ) -> Result<()> {
        let AttnOutputs { out, lse, fault } = outs;
        let (heads, layout, n) = (q.heads, q.layout, q.selections.len());
        let RowHeads::Gqa { kv_heads, head_dim } = layout.heads() else {
            return Err(KernelError::invalid("layout", layout.format(), "not a grouped-query row"));
        };
        if heads == 0 {
            return Err(KernelError::invalid("heads", heads, "must be at least 1"));
        }
        layout.check_query_heads(heads)?;
        if head_dim == 0 || head_dim > GQA_MAX_HEAD_DIM {
            return Err(KernelError::invalid("head_dim", head_dim, format!("must be in 1..={GQA_MAX_HEAD_DIM}")));
        }
        if !q.softmax_scale.is_finite() {
            return Err(KernelError::invalid("softmax_scale", q.softmax_scale, "must be finite"));
        }
        let rb = layout.row_bytes();
        check_len("queries", n * heads * head_dim, q.queries.len())?;
        check_len("out", n * heads * head_dim, out.len())?;
        check_len("lse", n * heads, lse.len())?;
        if !pool.len().is_multiple_of(rb) {
            return Err(KernelError::invalid("rows", pool.len(), format!("not a multiple of the {rb}-byte row")));
        }
        let (max_len, _) = super::attention_launch::check_selections(q)?;
        let smem = (head_dim + max_len) * 4;
        if smem > GQA_MAX_SMEM {
            return Err(KernelError::invalid(
                "selections",
                max_len,
                format!(
                    "more selected rows than the attention's shared memory holds ({})",
                    GQA_MAX_SMEM / 4 - head_dim
                ),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let params = GqaParams {
            pool_rows: (pool.len() / rb) as u64,
            heads: heads as u32,
            kv_heads: kv_heads as u32,
            head_dim: head_dim as u32,
            row_bytes: rb as u32,
            fp8: u32::from(layout.format() == KvRowFormat::Fp8),
            scales_at: layout.scales_offset().unwrap_or(0) as u32,
            scale: q.softmax_scale,
            pad: 0,
        };
        sc.upload_spans(dev, q)?;
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, n as u32, 1),
            block_dim: (GQA_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = PrintedLaunch::new(&dev.print, dev.stream(), self.kernel(dev)?);
        b.arg(q.queries)
            .arg(pool)
            .arg(q.locations)
            .arg(&sc.sels)
            .params(&params)
            .arg_mut(out)
            .arg_mut(lse)
            .arg_mut(fault);
        // SAFETY: queries, out and lse hold n requests' heads of `head_dim` (checked), every
        // selection lies within `locations` (checked), each location is checked against the pool
        // in the kernel (fault otherwise), and the shared memory holds the query and the longest
        // selection's logits (sized above, within the opted-in bound).
        unsafe { b.launch(cfg) }.map_err(driver_error("grouped-query attention launch"))?;
        Ok(())
    }
}
