//! The grouped-query attention's launches (`kernels/gqa_attention.cu`) over rows in a pool: the
//! host-side checks that run before them (heads and groups, head size, buffer lengths), the
//! argument struct and the chunks' partials in scratch.

use std::sync::OnceLock;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::{KvRowFormat, RowHeads};

use super::attention_launch::{AttnOutputs, AttnScratch};
use super::buffers::room;
use super::device::CudaDevice;
use super::driver_error;
use super::facts::{GQA_CHUNK, GQA_MAX_GROUP, GQA_MAX_HEAD_DIM, GQA_THREADS, GqaParams};
use super::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result, check_len};
use crate::swap_in::AttentionQuery;

/// The kernels (the chunks' partials, their merge), loaded on first use: a backend that never
/// meets grouped-query rows never compiles them.
#[derive(Clone, Default)]
pub(crate) struct GqaAttention {
    kernels: OnceLock<[CudaFunction; 2]>,
}

impl GqaAttention {
    fn kernels(&self, dev: &CudaDevice) -> Result<&[CudaFunction; 2]> {
        if let Some(k) = self.kernels.get() {
            return Ok(k);
        }
        let f = |k| dev.function("gqa_attention", k);
        let loaded = [f("sparse_gqa_split")?, f("sparse_gqa_merge")?];
        Ok(self.kernels.get_or_init(|| loaded))
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
        if heads / kv_heads > GQA_MAX_GROUP {
            return Err(KernelError::invalid(
                "heads",
                heads,
                format!("at most {GQA_MAX_GROUP} query heads per KV head ({kv_heads} KV heads)"),
            ));
        }
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
        let (max_len, _) = super::attention_launch::check_selections(q)?;
        let chunks = max_len.div_ceil(GQA_CHUNK).max(1);
        let part_len = [heads, chunks, head_dim + 2]
            .iter()
            .try_fold(n, |a, &b| a.checked_mul(b))
            .ok_or_else(|| KernelError::invalid("selections", max_len, "the attention's partials overflow"))?;
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
        room(dev, &mut sc.part_out, part_len)?;
        let [split, merge] = self.kernels(dev)?;
        let block = (GQA_THREADS as u32, 1, 1);
        let mut b = PrintedLaunch::new(&dev.print, dev.stream(), split);
        b.arg(q.queries)
            .arg(pool)
            .arg(q.locations)
            .arg(&sc.sels)
            .params(&params)
            .arg_mut(&mut sc.part_out)
            .arg_mut(fault);
        let grid = (kv_heads as u32, n as u32, chunks as u32);
        // SAFETY: queries hold n requests' heads of `head_dim` (checked), every selection lies
        // within `locations` (checked), each location is checked against the pool in the kernel
        // (fault otherwise), the partials hold n x heads x chunks x (head_dim + 2) (sized above);
        // the group and the head fit the kernel's static shared memory (checked).
        unsafe { b.launch(LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: 0 }) }
            .map_err(driver_error("grouped-query attention launch"))?;
        drop(b);
        let mut b = PrintedLaunch::new(&dev.print, dev.stream(), merge);
        let chunks = chunks as u32;
        b.arg(&sc.sels).params(&params).arg(&sc.part_out).arg_mut(out).arg_mut(lse).arg(&chunks);
        // SAFETY: the partials were written for every chunk of every request's selection; out
        // and lse hold n requests' heads (checked).
        unsafe {
            b.launch(LaunchConfig { grid_dim: (heads as u32, n as u32, 1), block_dim: block, shared_mem_bytes: 0 })
        }
        .map_err(driver_error("grouped-query attention merge launch"))?;
        Ok(())
    }
}
