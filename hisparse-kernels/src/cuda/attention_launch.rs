//! The sparse MLA attention's launch (`attention.cu`: the kernel and the split merge), shared by
//! [`super::CudaBackend`] (rows already in the pool) and [`super::CudaSwapIn`] (the attention
//! that also brings in the misses its swap-in left, `miss_fill = "attention"`): the kernels, their
//! reused scratch, the argument struct, and the host-side checks that run before any launch.

use super::facts::AttnParams;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum};
use cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig};
use hisparse_memory::KvRowFormat;
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::host_tier::MappedHostTier;

use super::buffers::{room, upload_cached};
use super::device::CudaDevice;
use super::driver_error;
use super::facts::GpuSpan;
use super::facts::{ATTN_SMEM, ATTN_THREADS, HEAD_BLOCK, TILE, WG_SMEM, WG_SMEM_FP8, WG_TILE};
use super::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result, check_len};
use crate::swap_in::AttentionQuery;

/// Where the attention reads the selected rows.
pub(crate) enum AttnRows<'a> {
    /// Every row is in the pool already.
    Pool(&'a CudaSlice<u8>),
    /// The pool (`hot`) holds the hits; a location whose fill word in `fills` is non-zero is a
    /// miss, read from `host` (row `fill - 1`) and written into `hot` at its location.
    Fill { hot: &'a mut CudaSlice<u8>, fills: &'a CudaSlice<u64>, host: &'a MappedHostTier },
    /// As `Fill`, but the misses are only read (the deferred swap-in brings them in later).
    Read { hot: &'a CudaSlice<u8>, fills: &'a CudaSlice<u64>, host: &'a MappedHostTier },
    /// As `Read`, but a non-zero fill word names a row of `staging` (device memory) plus one:
    /// the misses the locate gathered there.
    Staged { hot: &'a CudaSlice<u8>, fills: &'a CudaSlice<u64>, staging: &'a CudaView<'a, u8> },
}

/// Reused buffers of the attention's launches: the spans, the split partials.
pub(crate) struct AttnScratch {
    pub(crate) sels: CudaSlice<GpuSpan>,
    sels_c: Vec<GpuSpan>,
    pub(crate) part_out: CudaSlice<f32>,
    pub(crate) part_lse: CudaSlice<f32>,
}

impl AttnScratch {
    pub(crate) fn new(dev: &CudaDevice) -> Result<Self> {
        let s = dev.stream();
        let a = |e| driver_error("attention scratch")(e);
        Ok(Self {
            sels: s.alloc_zeros(64).map_err(a)?,
            sels_c: Vec::new(),
            part_out: s.alloc_zeros(1).map_err(a)?,
            part_lse: s.alloc_zeros(1).map_err(a)?,
        })
    }
}

/// The attention's kernels, loaded, and how it splits a batch.
#[derive(Clone)]
pub(crate) struct AttentionKernels {
    attention: CudaFunction,
    /// The warpgroup-MMA forms (`kernels/attention_wgmma.cu`) for bf16 and fp8 rows.
    attention_wgmma: CudaFunction,
    attention_wgmma_fp8: CudaFunction,
    merge: CudaFunction,
    sms: usize,
    /// Split count (0: chosen per call from the batch and the SM count).
    pub(crate) splits: usize,
    /// Use the warpgroup-MMA forms (the default) rather than `attention` (mma.sync).
    pub(crate) wgmma: bool,
}

/// Splits of each (request, head group) over `max_len` selected rows, for `blocks` such pairs on
/// `sms` SMs (`fixed`: the count asked for, else about one block per SM). The mma.sync kernel
/// keeps at least two of its 32-row tiles per split, so that the fetch of one overlaps the
/// other; the warpgroup-MMA one takes 64-row tiles, down to one per split (at one request, 32
/// splits of one tile measured 17.6 us against 19.7 with 16 of two: BENCHMARKS.md), and
/// its splits hold equal numbers of tiles, so that none is empty (17 splits of 32 tiles left
/// one empty and measured 26.6 us against 22.1 with 16, at 8 requests of 64 heads).
fn split_count(wgmma: bool, sms: usize, fixed: usize, blocks: usize, max_len: usize) -> usize {
    let want = if fixed > 0 { fixed } else { (sms as f64 / blocks.max(1) as f64).round() as usize };
    if !wgmma {
        return want.clamp(1, max_len.div_ceil(TILE).div_ceil(2).max(1));
    }
    let tiles = max_len.div_ceil(WG_TILE).max(1);
    let per = tiles.div_ceil(want.clamp(1, tiles));
    tiles.div_ceil(per)
}

/// Where an attention launch writes.
pub(crate) struct AttnOutputs<'a> {
    /// Each request's head outputs.
    pub out: &'a mut CudaSlice<f32>,
    /// Each request's heads' log-sum-exp.
    pub lse: &'a mut CudaSlice<f32>,
    /// Raised by a bad location or fill.
    pub fault: &'a mut CudaSlice<u32>,
}

impl AttentionKernels {
    /// The kernels of `dev` (its module is loaded once), shared memory opted in.
    pub(crate) fn load(dev: &CudaDevice) -> Result<Self> {
        let sms = dev
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error("SM count"))?;
        let attention = dev.function("attention", "sparse_mla_decode")?;
        attention
            .set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ATTN_SMEM as i32)
            .map_err(driver_error("attention shared memory opt-in"))?;
        let attention_wgmma = dev.function("attention", "sparse_mla_decode_wgmma")?;
        let attention_wgmma_fp8 = dev.function("attention", "sparse_mla_decode_wgmma_fp8")?;
        for (f, smem) in [(&attention_wgmma, WG_SMEM), (&attention_wgmma_fp8, WG_SMEM_FP8)] {
            f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(driver_error("wgmma attention shared memory opt-in"))?;
        }
        let merge = dev.function("attention", "merge_splits")?;
        Ok(Self {
            attention,
            attention_wgmma,
            attention_wgmma_fp8,
            merge,
            sms: usize::try_from(sms).unwrap_or(1).max(1),
            splits: 0,
            wgmma: true,
        })
    }

    /// The split count for `blocks` (request, head group) pairs of `max_len` selected rows.
    pub(crate) fn choose_splits(&self, blocks: usize, max_len: usize) -> usize {
        split_count(self.wgmma, self.sms, self.splits, blocks, max_len)
    }

    /// The kernel for rows of `format` and its dynamic shared memory.
    pub(crate) fn kernel(&self, format: KvRowFormat) -> (&CudaFunction, usize) {
        match (self.wgmma, format) {
            (true, KvRowFormat::Bf16) => (&self.attention_wgmma, WG_SMEM),
            (true, KvRowFormat::Fp8) => (&self.attention_wgmma_fp8, WG_SMEM_FP8),
            (false, _) => (&self.attention, ATTN_SMEM),
        }
    }

    /// Sparse attention of `q`'s requests over `rows` into `outs`; a bad location or fill
    /// raises `outs.fault` (the row reads as zeros). Every size is checked before any launch.
    pub(crate) fn launch(
        &self,
        dev: &CudaDevice,
        sc: &mut AttnScratch,
        q: &AttentionQuery<'_, CudaMemory>,
        rows: AttnRows<'_>,
        outs: AttnOutputs<'_>,
    ) -> Result<()> {
        let AttnOutputs { out, lse, fault } = outs;
        let rb = q.layout.row_bytes();
        let pool_len = match &rows {
            AttnRows::Pool(r) => r.len(),
            AttnRows::Fill { hot, .. } => hot.len(),
            AttnRows::Read { hot, .. } | AttnRows::Staged { hot, .. } => hot.len(),
        };
        let (max_len, sel_end) = check_query(q, out, lse)?;
        let (heads, layout, n) = (q.heads, q.layout, q.selections.len());
        let (host_base, host_rows) = match &rows {
            AttnRows::Pool(_) => (0, 0),
            AttnRows::Fill { fills, host, .. } | AttnRows::Read { fills, host, .. } => {
                if fills.len() < sel_end {
                    return Err(KernelError::invalid("fills", fills.len(), format!("the selections reach {sel_end}")));
                }
                if host.layout().row_bytes != rb {
                    return Err(KernelError::invalid(
                        "host",
                        host.layout().row_bytes,
                        format!("the host tier's rows are not the attention's {rb} bytes"),
                    ));
                }
                (host.device_ptr(), host.layout().rows())
            }
            AttnRows::Staged { fills, staging, .. } => {
                if fills.len() < sel_end {
                    return Err(KernelError::invalid("fills", fills.len(), format!("the selections reach {sel_end}")));
                }
                (super::printed_launch::addr(*staging, dev.stream()), (staging.len() / rb) as u64)
            }
        };
        if n == 0 {
            return Ok(());
        }
        let groups = heads.div_ceil(HEAD_BLOCK);
        let splits = self.choose_splits(n * groups, max_len);
        let params = AttnParams {
            splits: splits as u32,
            write_back: u32::from(matches!(rows, AttnRows::Fill { .. })),
            host_base,
            host_rows,
            ..base_params(q, pool_len)
        };
        sc.upload_spans(dev, q)?;
        let s = dev.stream();
        let (kernel, smem) = self.kernel(layout.format());
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, groups as u32, n as u32),
            block_dim: (ATTN_THREADS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        if splits > 1 {
            room(dev, &mut sc.part_out, n * heads * splits * 512)?;
            room(dev, &mut sc.part_lse, n * heads * splits)?;
        }
        let null = 0u64;
        let mut b = PrintedLaunch::new(&dev.print, s, kernel);
        b.arg(q.queries);
        match rows {
            AttnRows::Pool(r) => b.arg(r).arg(q.locations).arg(&null),
            AttnRows::Fill { hot, fills, .. } => b.arg_mut(hot).arg(q.locations).arg(fills),
            AttnRows::Read { hot, fills, .. } | AttnRows::Staged { hot, fills, .. } => {
                b.arg(hot).arg(q.locations).arg(fills)
            }
        };
        b.arg(&sc.sels).params(&params);
        if splits > 1 {
            b.arg_mut(&mut sc.part_out).arg_mut(&mut sc.part_lse);
        } else {
            b.arg_mut(&mut *out).arg_mut(&mut *lse);
        }
        b.arg_mut(fault);
        // SAFETY: queries, out and lse hold n requests' heads (checked); selections lie within
        // `locations` and `fills` (checked); locations are checked against the pool and fills
        // against the registered host tier (alive while its handle is) or the staging rows
        // (borrowed for the call; a graph that replays this launch is keyed by its address) in
        // the kernel, which
        // writes the pool only at checked locations and only given `Fill` (write_back); partials hold n * heads * splits entries.
        unsafe { b.launch(cfg) }.map_err(driver_error("attention launch"))?;
        if splits > 1 {
            self.launch_merge(dev, sc, n * heads, splits, out, lse)?;
        }
        Ok(())
    }

    /// Merges `splits` partials of each of `rows` (request, head) rows in `sc` into `out`/`lse`.
    pub(crate) fn launch_merge(
        &self,
        dev: &CudaDevice,
        sc: &AttnScratch,
        rows: usize,
        splits: usize,
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_len("out", rows * 512, out.len())?;
        check_len("lse", rows, lse.len())?;
        if sc.part_out.len() < rows * splits * 512 || sc.part_lse.len() < rows * splits {
            return Err(KernelError::invalid("splits", splits, "more partials than the scratch holds"));
        }
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let sp = splits as u32;
        let mut b = PrintedLaunch::new(&dev.print, dev.stream(), &self.merge);
        b.arg(&sc.part_out).arg(&sc.part_lse).arg(&sp).arg_mut(out).arg_mut(lse);
        // SAFETY: the partials hold `rows * splits` entries and out and lse `rows` (checked).
        unsafe { b.launch(cfg) }.map_err(driver_error("merge launch"))?;
        Ok(())
    }
}

impl AttnScratch {
    /// Uploads `q`'s selection spans into `sels` (skipped when they are what it holds).
    pub(crate) fn upload_spans(&mut self, dev: &CudaDevice, q: &AttentionQuery<'_, CudaMemory>) -> Result<()> {
        let host: Vec<GpuSpan> =
            q.selections.iter().map(|s| GpuSpan { offset: s.offset as u64, len: s.len as u64 }).collect();
        upload_cached(dev, &mut self.sels, &mut self.sels_c, &host)
    }
}

/// The parameters every launch over `q` shares (one split, no fills, partials as `splits` says).
pub(crate) fn base_params(q: &AttentionQuery<'_, CudaMemory>, pool_len: usize) -> AttnParams {
    let rb = q.layout.row_bytes();
    AttnParams {
        heads: q.heads as u32,
        row_bytes: rb as u32,
        fp8: u32::from(q.layout.format() == KvRowFormat::Fp8),
        splits: 1,
        pool_rows: (pool_len / rb) as u64,
        scale_log2: q.softmax_scale * std::f32::consts::LOG2_E,
        ..AttnParams::default()
    }
}

/// Checks `q` and the outputs against each other; returns the longest selection and the end of
/// the furthest one.
pub(crate) fn check_query(
    q: &AttentionQuery<'_, CudaMemory>,
    out: &CudaSlice<f32>,
    lse: &CudaSlice<f32>,
) -> Result<(usize, usize)> {
    let (heads, layout) = (q.heads, q.layout);
    let n = q.selections.len();
    if heads == 0 {
        return Err(KernelError::invalid("heads", heads, "must be at least 1"));
    }
    if let hisparse_memory::RowHeads::Gqa { kv_heads, head_dim } = layout.heads() {
        return Err(KernelError::invalid(
            "layout",
            format!("gqa ({kv_heads} KV heads of {head_dim})"),
            "the attention that fills the swap-in's misses reads MLA rows only: let the swap-in copy grouped-query rows (miss_fill)",
        ));
    }
    let (d_latent, d_rope) = (layout.blocked_dims(), layout.bf16_dims());
    if (d_latent, d_rope) != (super::facts::MLA_D_LATENT, super::facts::MLA_D_ROPE) {
        return Err(KernelError::invalid(
            "layout",
            format!("{d_latent}+{d_rope}"),
            "the CUDA attention is built for 512 latent + 64 rope dims",
        ));
    }
    if !q.softmax_scale.is_finite() {
        return Err(KernelError::invalid("softmax_scale", q.softmax_scale, "must be finite"));
    }
    check_len("queries", n * heads * super::facts::MLA_D_QK, q.queries.len())?;
    check_len("out", n * heads * super::facts::MLA_D_LATENT, out.len())?;
    check_len("lse", n * heads, lse.len())?;
    // The pool's whole rows are `pool_rows` (`base_params`); bytes past the last are never read.
    check_selections(q)
}

/// Checks that every selection of `q` lies within its locations; returns the longest selection
/// and the end of the furthest one.
pub(crate) fn check_selections(q: &AttentionQuery<'_, CudaMemory>) -> Result<(usize, usize)> {
    let mut max_len = 0;
    let mut sel_end = 0;
    for s in q.selections {
        if s.end() > q.locations.len() {
            return Err(hisparse_memory::MemoryError::OutOfBounds {
                field: "locations",
                start: s.offset,
                end: s.end(),
                len: q.locations.len(),
            }
            .into());
        }
        max_len = max_len.max(s.len);
        sel_end = sel_end.max(s.end());
    }
    Ok((max_len, sel_end))
}

#[cfg(test)]
mod tests {
    use super::{WG_TILE, split_count};

    #[test]
    fn warpgroup_splits_hold_equal_tiles_and_none_is_empty() {
        // 132 SMs: one request of two head groups takes a tile per split; eight requests of one
        // group 16 splits of two tiles (17 would leave one empty); 64 requests no split.
        assert_eq!(split_count(true, 132, 0, 2, 2048), 32);
        assert_eq!(split_count(true, 132, 0, 8, 2048), 16);
        assert_eq!(split_count(true, 132, 0, 128, 2048), 1);
        for blocks in 1..300 {
            for len in [1usize, 63, 64, 65, 1000, 2048, 4097] {
                let s = split_count(true, 132, 0, blocks, len);
                let tiles = len.div_ceil(WG_TILE);
                let per = tiles.div_ceil(s);
                assert!(s >= 1 && s <= tiles && (s - 1) * per < tiles, "{blocks} blocks, {len} rows: {s} splits");
                // The kernel's own partition (attention_wgmma.cu: whole tiles of len / splits).
                let rows = len.div_ceil(s).div_ceil(WG_TILE) * WG_TILE;
                assert!((s - 1) * rows < len, "{blocks} blocks, {len} rows: the kernel's last split is empty");
            }
        }
        // A fixed count is kept where the tiles divide evenly, the mma.sync rule is unchanged.
        assert_eq!(split_count(true, 132, 8, 128, 2048), 8);
        assert_eq!(split_count(false, 132, 0, 2, 2048), 32);
        assert_eq!(split_count(false, 132, 0, 8, 2048), 17);
    }
}
