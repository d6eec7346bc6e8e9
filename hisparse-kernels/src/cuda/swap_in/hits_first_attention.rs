//! The attention of `miss_fill = "hits-first"`: a layer's attention over its hits starts while
//! its misses are still being copied (on the transfer stream, `gather_misses`); then, once they
//! have landed, the attention over the misses alone (their staging rows, listed in selection
//! order), and the LSE merge of both into the layer's output.
//!
//! The hits' launch is the warpgroup-MMA kernel over the whole selection with `skip_filled` (a
//! row whose fill word is set is masked, not read), in the splits the plain attention would use;
//! the misses' launch the same kernel over the staging rows in one split, its partial placed
//! after the hits' (`part_base`, `part_stride`); `merge_splits` combines them. The summation is
//! partitioned differently from the resident attention's (which sees one list), and each tile's
//! probabilities are rounded to bf16 against its own partition's running maximum, so the output
//! equals it within the attention's bf16 tolerance (1.2e-3 of the largest output measured on
//! the H200), not bit for bit; it depends only on the selection and on which
//! rows are misses, so a run is reproducible (eager, replayed, with the transfer stream slowed).

use cudarc::driver::{CudaEvent, CudaSlice, CudaView, LaunchConfig};
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::host_tier::MappedHostTier;

use crate::cuda::attention_launch::{AttentionKernels, AttnOutputs, AttnScratch, base_params, check_query};
use crate::cuda::buffers::room;
use crate::cuda::device::CudaDevice;
use crate::cuda::driver_error;
use crate::cuda::facts::AttnParams;
use crate::cuda::facts::GpuSpan;
use crate::cuda::facts::HEAD_BLOCK;
use crate::cuda::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result};
use crate::swap_in::AttentionQuery;

/// What the transfer stream left for a layer's attention over its misses.
pub(crate) struct LandedMisses<'a> {
    /// The layer's staging rows (row `sel_offset + j` holds selected token `j`'s row if it was a
    /// miss).
    pub(crate) staging: CudaView<'a, u8>,
    /// Per request, its misses' staging rows in selection order, from its `sel_offset`.
    pub(crate) list: &'a CudaSlice<i32>,
    /// Per request `{sel_offset, misses}` of `list`.
    pub(crate) spans: &'a CudaSlice<GpuSpan>,
    /// Recorded on the transfer stream once the rows, the list and the spans are written.
    pub(crate) landed: &'a CudaEvent,
}

impl AttentionKernels {
    /// The hits-first attention of `q`'s requests into `outs`: the hits (`fills` 0) from
    /// `hot` now, the misses from `misses` once it has landed, and the merge. Refused for the
    /// mma.sync kernel. Every size is checked before any launch.
    pub(crate) fn launch_hits_first(
        &self,
        dev: &CudaDevice,
        sc: &mut AttnScratch,
        q: &AttentionQuery<'_, CudaMemory>,
        (hot, fills, host): (&CudaSlice<u8>, &CudaSlice<u64>, &MappedHostTier),
        misses: &LandedMisses<'_>,
        outs: AttnOutputs<'_>,
    ) -> Result<()> {
        let AttnOutputs { out, lse, fault } = outs;
        if !self.wgmma {
            return Err(KernelError::invalid(
                "miss_fill",
                crate::MissFillMode::HitsFirst,
                "needs the warpgroup-MMA attention (not --attention-kernel mma-sync)",
            ));
        }
        let rb = q.layout.row_bytes();
        let (max_len, sel_end) = check_query(q, out, lse)?;
        if fills.len() < sel_end {
            return Err(KernelError::invalid("fills", fills.len(), format!("the selections reach {sel_end}")));
        }
        if host.layout().row_bytes != rb {
            return Err(KernelError::invalid("host", host.layout().row_bytes, format!("rows are not {rb} bytes")));
        }
        let n = q.selections.len();
        let staged_rows = misses.staging.len() / rb;
        if staged_rows < sel_end || misses.list.len() < sel_end || misses.spans.len() < n {
            return Err(KernelError::invalid(
                "staging",
                staged_rows,
                format!("the misses' rows, list and spans must cover {sel_end} selections of {n} requests"),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let heads = q.heads;
        let groups = heads.div_ceil(HEAD_BLOCK);
        let splits = self.choose_splits(n * groups, max_len);
        let stride = splits + 1;
        room(dev, &mut sc.part_out, n * heads * stride * 512)?;
        room(dev, &mut sc.part_lse, n * heads * stride)?;
        sc.upload_spans(dev, q)?;
        let (kernel, smem) = self.kernel(q.layout.format());
        let grid = |splits: usize| LaunchConfig {
            grid_dim: (splits as u32, groups as u32, n as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let s = dev.stream();
        let hits = AttnParams {
            splits: splits as u32,
            host_base: host.device_ptr(),
            host_rows: host.layout().rows(),
            skip_filled: 1,
            part_stride: stride as u32,
            ..base_params(q, hot.len())
        };
        let mut b = PrintedLaunch::new(&dev.print, s, kernel);
        b.arg(q.queries).arg(hot).arg(q.locations).arg(fills).arg(&sc.sels).params(&hits);
        b.arg_mut(&mut sc.part_out).arg_mut(&mut sc.part_lse).arg_mut(fault);
        // SAFETY: queries hold n requests' heads and the partials n * heads * stride rows
        // (checked, grown above); selections lie within `locations` and `fills` (checked);
        // locations are checked against the pool in the kernel, which reads no row whose fill
        // word is set (skip_filled) and writes nothing but the partials and the fault flag.
        unsafe { b.launch(grid(splits)) }.map_err(driver_error("attention over the hits"))?;
        s.wait(misses.landed).map_err(driver_error("wait for the misses"))?;
        let null = 0u64;
        let miss =
            AttnParams { part_base: splits as u32, part_stride: stride as u32, ..base_params(q, misses.staging.len()) };
        let mut b = PrintedLaunch::new(&dev.print, s, kernel);
        b.arg(q.queries).arg(&misses.staging).arg(misses.list).arg(&null).arg(misses.spans).params(&miss);
        b.arg_mut(&mut sc.part_out).arg_mut(&mut sc.part_lse).arg_mut(fault);
        // SAFETY: the spans hold n entries, each within `list` (the gather wrote them for the
        // same requests: offset sel_offset, at most sel_len misses, and `list` covers sel_end);
        // the list's staging rows are checked against the staging rows in the kernel; one split
        // writes partial `splits` of n * heads * stride rows.
        unsafe { b.launch(grid(1)) }.map_err(driver_error("attention over the misses"))?;
        self.launch_merge(dev, sc, n * heads, stride, out, lse)
    }
}
