//! The launches of [`GpuSwapInState`]: a layer's swap-in step (decisions, then the missed rows'
//! copies) and a prefetch (nominated tokens brought in before a selection is known, then their
//! rows' copies). Every size the host holds is checked here, with checked arithmetic, before any
//! launch; what only the device holds is checked by the kernels (fault flag).

use crate::cuda::driver_error;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, LaunchConfig};
use hisparse_memory::c_layout::{ConstPtr, DevPtr};

use super::args::{FusedSwapArgs, PrefetchArgs, SwapArgs, cdev, dev};
use super::io::{LayerLaunch, MissSource, Nominations, ProtectSpans, Selections, SwapTargets};
use super::state::{GpuSwapInState, SwapBatch, SwapOutputs, SwapParams};
use crate::cuda::printed_launch::PrintedLaunch;

use crate::error::{KernelError, Result};
use crate::swap_in::SWAP_COUNTS;
use hisparse_memory::device_tier::hot_buffer_rows_of;

fn u32_of(field: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| KernelError::invalid(field, v, "does not fit the kernel's 32-bit field"))
}

impl GpuSwapInState {
    /// Checks what a launch of `layer` over `batch` reads (the host tier and its page list, the
    /// entries `0..entries` of the per-selection buffers, the scores) and returns the kernels'
    /// parameters.
    pub(crate) fn checked_params(
        &self,
        layer: usize,
        batch: &SwapBatch,
        entries: usize,
        scores: Option<&CudaView<'_, f32>>,
        src: MissSource<'_>,
    ) -> Result<SwapParams> {
        let MissSource { pages: host_pages, host } = src;
        let lay = host.layout();
        let reqs = batch.requests();
        if layer >= self.layers || layer >= lay.layers {
            return Err(KernelError::invalid(
                "layer",
                layer,
                format!("the swap-in holds {} layers, the host tier {}", self.layers, lay.layers),
            ));
        }
        let row_bytes = lay.row_bytes;
        if !row_bytes.is_multiple_of(16) || u32::try_from(row_bytes).is_err() {
            return Err(KernelError::invalid("row_bytes", row_bytes, "must be a multiple of 16 below 2^32"));
        }
        let pages_len = u32::try_from(host_pages.len())
            .map_err(|_| KernelError::invalid("host_pages", host_pages.len(), "more than 2^32 - 1 entries"))?;
        for (i, r) in reqs.iter().enumerate() {
            let need = (r.seq_len as usize).div_ceil(lay.page_tokens);
            if (r.page_offset as usize).checked_add(need).is_none_or(|end| end > host_pages.len()) {
                return Err(KernelError::invalid(
                    "reqs",
                    i,
                    format!(
                        "pages from {} for {} tokens run past the {pages_len} host pages",
                        r.page_offset, r.seq_len
                    ),
                ));
            }
            if let Some(sc) = scores
                && (r.score_offset as usize).checked_add(r.seq_len as usize).is_none_or(|e| e > sc.len())
            {
                return Err(KernelError::invalid("reqs", i, "its scores run past the score buffer"));
            }
        }
        let sel_end = batch.selection_end();
        if sel_end > entries {
            return Err(KernelError::invalid("selections", entries, format!("the batch reads {sel_end}")));
        }
        Ok(SwapParams {
            layer: u32_of("layer", layer)?,
            layers: u32_of("layers", self.layers)?,
            device_buffer_size: u32_of("device_buffer_size", self.device_buffer_size)?,
            row_bytes: u32_of("row_bytes", row_bytes)?,
            page_tokens: u32_of("page_tokens", lay.page_tokens)?,
            host_pages_per_layer: u32_of("host pages per layer", lay.pages_per_layer)?,
            host_pages_len: pages_len,
            word_tokens: u32_of("max_tokens", self.word_tokens)?,
            host_base: host.device_ptr(),
            seed: self.policy.seed(),
        })
    }

    /// Checks that `out` and `hot_rows` (a layer's pool) hold what a launch over `batch` writes.
    fn check_outputs(
        &self,
        batch: &SwapBatch,
        out: &SwapOutputs,
        hot_rows: &CudaSlice<u8>,
        row_bytes: u32,
    ) -> Result<()> {
        let sel_end = batch.selection_end();
        let hot_need = self
            .seats
            .checked_mul(hot_buffer_rows_of(self.device_buffer_size))
            .and_then(|n| n.checked_mul(row_bytes as usize));
        if [out.locations.len(), out.miss_tokens.len(), out.miss_slots.len(), out.evicted.len(), out.fills.len()]
            .iter()
            .any(|&n| n < sel_end)
            || out.counts.len() < SWAP_COUNTS * batch.requests().len()
            || hot_need.is_none_or(|n| hot_rows.len() < n)
        {
            return Err(KernelError::invalid("out", sel_end, "output or hot-row buffers too small"));
        }
        Ok(())
    }

    /// Launches the swap-in of `layer` for `batch` (from [`GpuSwapInState::upload_requests`]) on
    /// the swap-in's stream: `sel` holds each request's positions (and, for policies that read
    /// them, scores), missed rows are read from `src` into `dst.hot_rows`, this layer's
    /// hot-buffer pool; decisions go to `dst.out`. Every size is checked here; a selection or
    /// page id the device holds out of range is skipped by the kernels and raises the fault
    /// flag.
    pub fn launch(
        &mut self,
        layer: usize,
        batch: &SwapBatch,
        sel: Selections<'_, '_>,
        src: MissSource<'_>,
        dst: SwapTargets<'_>,
    ) -> Result<()> {
        let stream = Arc::clone(&self.stream);
        self.launch_counted(LayerLaunch { stream: &stream, layer, batch }, sel, src, dst, None)
    }

    /// [`GpuSwapInState::launch`] as `at` says (its stream, layer and batch). A batch of at most
    /// [`GpuSwapInState::set_fused_max`] requests runs as one launch (decisions and copies),
    /// larger ones as two; given `staged`, the misses are copied from those staging rows
    /// (device to device) instead of the host tier, after a decision launch.
    pub(crate) fn launch_counted(
        &mut self,
        at: LayerLaunch<'_>,
        sel: Selections<'_, '_>,
        src: MissSource<'_>,
        dst: SwapTargets<'_>,
        staged: Option<&super::staging::StagedRows<'_>>,
    ) -> Result<()> {
        let LayerLaunch { stream, layer, batch } = at;
        let Selections { positions: selections, scores } = sel;
        let SwapTargets { hot_rows, out, counts } = dst;
        let host_pages = src.pages;
        let params = self.checked_params(layer, batch, selections.len(), scores, src)?;
        self.check_outputs(batch, out, hot_rows, params.row_bytes)?;
        if let Some(st) = staged {
            st.check(batch, params.row_bytes)?;
        }
        let n = batch.requests().len();
        if n == 0 {
            return Ok(());
        }
        let SwapOutputs { locations, counts: own_counts, miss_tokens, miss_slots, evicted, fills } = out;
        let (counts, at) = counts.unwrap_or((own_counts, 0));
        if at.checked_add(SWAP_COUNTS * n).is_none_or(|end| end > counts.len()) {
            return Err(KernelError::invalid("counts", at, format!("no room for {n} requests' counts there")));
        }
        // Misses copied from staging rows need the lists of the two-launch form.
        let fill = self.copies && self.fills(n) && staged.is_none();
        let fused = self.copies && n <= self.fused_max && !fill && staged.is_none();
        if fused && 3 * n > self.sync.len() {
            return Err(KernelError::invalid("reqs", n, format!("more requests than the {} seats", self.seats)));
        }
        let per_request = if fused { (2048 / (n * self.block as usize / 32)).clamp(1, 16) as u32 } else { 1 };
        let cfg = LaunchConfig {
            grid_dim: (u32_of("requests", n)?, per_request, 1),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: Self::shared_bytes(self.device_buffer_size, self.max_sel) as u32,
        };
        let GpuSwapInState {
            print, funcs, slot_tokens, records, scalars, ready, prefetched, words, fault, sync, ..
        } = &mut *self;
        let counts_at = counts.slice(at..at + SWAP_COUNTS * n);
        let s = stream.as_ref();
        let words = words.as_ref().map_or(DevPtr::null(), |w| dev(w, s));
        let scores = scores.map_or(ConstPtr::null(), |sc| cdev(sc, s));
        let mut b = PrintedLaunch::new(print, stream, if fused { &funcs.fused } else { &funcs.decide });
        let args = SwapArgs {
            reqs: cdev(batch.device(), s),
            selections: cdev(selections, s),
            slot_tokens: dev(slot_tokens, s),
            records: dev(records, s),
            scalars: dev(scalars, s),
            ready: dev(ready, s),
            prefetched: dev(prefetched, s),
            words,
            scores,
            locations: dev(locations, s),
            counts: dev(&counts_at, s),
            miss_tokens: dev(miss_tokens, s),
            miss_slots: dev(miss_slots, s),
            evicted: dev(evicted, s),
            host_pages: cdev(host_pages, s),
            fills: if fill && !fused { dev(fills, s) } else { DevPtr::null() },
            fault: dev(fault, s),
            p: params,
        };
        let fused_args;
        if fused {
            fused_args = FusedSwapArgs { decide: args, hot_rows: dev(hot_rows, s), sync: dev(sync, s) };
            b.params(&fused_args);
        } else {
            b.params(&args);
        }
        // SAFETY: the batch was validated against this swap-in when made (seats within the state
        // arrays, selection ranges within `sel_end`), and every buffer was checked above to hold
        // what the kernel indexes (the sync words: three per request); selections out of range
        // are skipped by the kernel (fault); the one-launch form's host rows are reached only
        // through the registered tier, at page ids it checks (fault otherwise); host page ids
        // are read within `host_pages_len` (checked against the list above) and `fills`
        // holds `sel_end` entries (checked).
        unsafe { b.launch(cfg) }.map_err(driver_error("swap-in launch"))?;
        drop(b);
        if fused || fill || !self.copies {
            return Ok(());
        }
        let lists = (&counts_at, &*miss_tokens, &*miss_slots);
        match staged {
            Some(st) => self.launch_staged_copies(stream, batch, st, hot_rows, lists, &params),
            None => self.launch_copies(stream, batch, host_pages, hot_rows, lists, &params),
        }
    }

    /// Copies `spans` into `prot` (in place while they fit: a captured launch reads them
    /// there), remembering how far into a protect buffer they reach.
    pub fn set_protect(&self, prot: &mut ProtectSpans, spans: &[(u32, u32)]) -> Result<()> {
        let mut end = 0usize;
        for &(o, l) in spans {
            let e = (o as usize)
                .checked_add(l as usize)
                .ok_or_else(|| KernelError::invalid("protect_spans", o, "overflows"))?;
            end = end.max(e);
        }
        let flat: Vec<u32> = spans.iter().flat_map(|&(o, l)| [o, l]).collect();
        if prot.dev.len() < flat.len() {
            prot.dev =
                self.stream.alloc_zeros(flat.len().next_power_of_two()).map_err(driver_error("protect spans"))?;
        }
        if !flat.is_empty() {
            self.stream
                .memcpy_htod(&flat, &mut prot.dev.slice_mut(..flat.len()))
                .map_err(driver_error("protect spans"))?;
        }
        prot.n = spans.len();
        prot.end = end;
        Ok(())
    }

    /// Brings nominated tokens into `at.layer`'s buffers before their selection is known
    /// (`hisparse_policy::SwapInState::prefetch`): `at.batch`'s requests name their candidates
    /// (`noms.candidates` from `sel_offset`, `sel_len` of them) and their budget (`pad`); each
    /// request's protected positions (never evicted) are at its span of `noms.protect`. The
    /// fills go to `dst.out` (`miss_tokens`, `miss_slots`, `evicted` from `sel_offset`; counts
    /// `{0, fills, evictions, 0, wasted}`) and their rows from `src` into `dst.hot_rows`.
    pub fn prefetch_on(
        &mut self,
        at: LayerLaunch<'_>,
        noms: Nominations<'_, '_>,
        src: MissSource<'_>,
        dst: SwapTargets<'_>,
    ) -> Result<()> {
        let LayerLaunch { stream, layer, batch } = at;
        let Nominations { candidates, protect, spans: prot, scores } = noms;
        let SwapTargets { hot_rows, out, .. } = dst;
        let params = self.checked_params(layer, batch, candidates.len(), scores, src)?;
        self.check_outputs(batch, out, hot_rows, params.row_bytes)?;
        let n = batch.requests().len();
        if prot.n != n {
            return Err(KernelError::invalid("protect_spans", prot.n, format!("{n} requests")));
        }
        if prot.end > protect.len() {
            return Err(KernelError::invalid("protect_spans", prot.end, "past the protect buffer"));
        }
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (u32_of("requests", n)?, 1, 1),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: Self::prefetch_shared_bytes(self.device_buffer_size, self.max_sel) as u32,
        };
        let GpuSwapInState { print, funcs, slot_tokens, records, scalars, ready, prefetched, words, fault, .. } =
            &mut *self;
        let s = stream.as_ref();
        let args = PrefetchArgs {
            reqs: cdev(batch.device(), s),
            candidates: cdev(candidates, s),
            protect: cdev(protect, s),
            prot: cdev(&prot.dev, s),
            slot_tokens: dev(slot_tokens, s),
            records: dev(records, s),
            scalars: dev(scalars, s),
            ready: dev(ready, s),
            prefetched: dev(prefetched, s),
            words: words.as_ref().map_or(DevPtr::null(), |w| dev(w, s)),
            scores: scores.map_or(ConstPtr::null(), |sc| cdev(sc, s)),
            counts: dev(&out.counts, s),
            miss_tokens: dev(&out.miss_tokens, s),
            miss_slots: dev(&out.miss_slots, s),
            evicted: dev(&out.evicted, s),
            fault: dev(fault, s),
            p: params,
        };
        let mut b = PrintedLaunch::new(print, stream, &funcs.prefetch);
        b.params(&args);
        // SAFETY: as for the swap-in: the batch was validated (seats, candidate ranges within
        // `sel_end`, at most max_sel candidates: the shared memory is sized for that), the
        // protect spans (checked when set) lie within `protect`, and the outputs hold `sel_end`
        // entries; candidates out of range are skipped by the kernel (fault).
        unsafe { b.launch(cfg) }.map_err(driver_error("prefetch launch"))?;
        if !self.copies {
            return Ok(());
        }
        let lists = (&out.counts.as_view(), &out.miss_tokens, &out.miss_slots);
        self.launch_copies(stream, batch, src.pages, hot_rows, lists, &params)
    }

    /// The copies of the rows a launch decided to bring in: enough blocks per request for about
    /// 4096 warps in all.
    fn launch_copies(
        &mut self,
        stream: &Arc<CudaStream>,
        batch: &SwapBatch,
        host_pages: &CudaSlice<u32>,
        hot_rows: &mut CudaSlice<u8>,
        (counts, miss_tokens, miss_slots): (&CudaView<'_, u32>, &CudaSlice<u32>, &CudaSlice<u32>),
        params: &SwapParams,
    ) -> Result<()> {
        let n = batch.requests().len();
        let per_request = (4096 / (n * 8)).clamp(1, 512) as u32;
        let cfg = LaunchConfig {
            grid_dim: (u32_of("requests", n)?, per_request, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let GpuSwapInState { print, funcs, fault, .. } = &mut *self;
        let mut b = PrintedLaunch::new(print, stream, &funcs.copy);
        b.arg(batch.device())
            .arg(counts)
            .arg(miss_tokens)
            .arg(miss_slots)
            .arg(host_pages)
            .arg_mut(hot_rows)
            .arg_mut(fault)
            .params(params);
        // SAFETY: the decision kernel just wrote the lists for these requests; host rows are
        // reached only through the registered tier (alive while the caller's handle is), at page
        // ids the kernel checks against `host_pages_len` and the layout (fault otherwise).
        unsafe { b.launch(cfg) }.map_err(driver_error("copy launch"))?;
        Ok(())
    }
}
