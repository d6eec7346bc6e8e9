//! The CUDA swap-in's prefetch: the nominations of a prefetcher whose candidates are a layer's
//! own selection, for later layers of the same step (the built-ins `shared-index`, exact under
//! IndexShare, and `adjacent-layer`, speculative), applied by the prefetch kernel
//! (`hisparse_policy::SwapInState::prefetch`, exactly) off the main stream: after a layer's
//! swap-in, its selection is copied aside, the transfer stream waits for that copy and runs the
//! decisions and row copies of every target, recording an event per target; the main stream
//! waits for a target's event just before that layer's swap-in — so the prefetch overlaps the
//! nominating layer's attention, the model's GEMMs between them and the target's own indexer
//! and top-k. In serial mode the same launches run in the same order on the main stream.
//!
//! One exception keeps the results those of the CPU swap-in: a score-aware policy's hooks read
//! the target layer's scores, which a full target layer computes only in its own indexer, so a
//! prefetch into a full layer under such a policy runs on the main stream at the target, before
//! its swap-in (as the CPU applies it).
//!
//! Invariant: every prefetch of a step is waited for by the main stream before the step's end
//! (at its target, or by [`GpuPrefetch::settle`]); the candidate copy is rewritten only after
//! every prefetch that read it was waited for (each nomination's targets precede the next one).

use crate::cuda::driver_error;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream};
use hisparse_policy::prefetch::{Candidates, LayerSelection, When};

use super::io::{LayerLaunch, MissSource, Nominations, ProtectSpans, SwapTargets};
use super::state::{GpuSwapInState, SwapBatch, SwapOutputs, SwapReq};
use crate::cuda::device::CudaDevice;
use crate::cuda::printed_launch::{LaunchPrint, addr};
use crate::error::{KernelError, Result};
use crate::swap_in::{DeviceSwapInConfig, SWAP_COUNTS, SwapCounts};

/// The prefetch state of a CUDA swap-in: see the module documentation.
pub(crate) struct GpuPrefetch {
    cfg: DeviceSwapInConfig,
    print: Arc<LaunchPrint>,
    main: Arc<CudaStream>,
    /// The transfer stream (`None`: serial, on the main stream).
    transfer: Option<Arc<CudaStream>>,
    /// Test hook: the delay kernel and its nanoseconds, before every transfer.
    delay: Option<(CudaFunction, u64)>,
    /// Per layer, the layers its nominations target.
    targets: Vec<Vec<usize>>,
    /// Per layer: prefetched at its own swap-in, on the main stream (see the module docs).
    at_target: Vec<bool>,
    batch: Option<SwapBatch>,
    prot: ProtectSpans,
    cand: CudaSlice<u32>,
    out: SwapOutputs,
    /// Per target layer and request, the prefetch's counts.
    counts: CudaSlice<u32>,
    /// Per target layer, the event of its prefetch on the transfer stream.
    pending: Vec<Option<CudaEvent>>,
    n: usize,
}

/// The nominations of `cfg.prefetcher` after layer `layer` for a selection of `len` positions:
/// `(target, budget)`. Refused unless they name the selection, this step (what the GPU runs).
fn nominations(cfg: &DeviceSwapInConfig, layer: usize, len: usize) -> Result<Vec<(usize, usize)>> {
    let g = &cfg.geometry;
    let sources: Vec<u32> = (0..g.layers).map(|l| g.index_source(l) as u32).collect();
    // The built-in selection prefetchers read the selection's length, not its positions.
    let selected = vec![0u32; len];
    let sel = LayerSelection {
        layer: layer as u32,
        layers: g.layers as u32,
        step: 1,
        seq_len: len.max(1),
        top_k: g.top_k,
        selected: &selected,
        near: &[],
        index_source: &sources,
    };
    let mut noms = Vec::new();
    cfg.prefetcher.nominate(&sel, &mut noms);
    let mut out = Vec::new();
    for n in noms {
        if n.when != When::ThisStep || n.candidates != Candidates::Selection {
            return Err(KernelError::invalid(
                "prefetcher",
                cfg.prefetcher.name(),
                "the CUDA swap-in prefetches a layer's selection into later layers of the step \
                 (shared-index, adjacent-layer); next-step prefetch needs near-cut candidates on \
                 the device, not built yet: use the CPU backend",
            ));
        }
        let t = n.target as usize;
        if t > layer && t < g.layers {
            out.push((t, n.budget));
        }
    }
    Ok(out)
}

impl GpuPrefetch {
    /// The prefetch of `cfg` (`None` for `none`), on a transfer stream of its own unless
    /// `serial`; `delay_ns` (a test hook) slows every transfer.
    pub fn new(dev: &Arc<CudaDevice>, cfg: &DeviceSwapInConfig, serial: bool, delay_ns: u64) -> Result<Option<Self>> {
        if cfg.prefetcher.name() == "none" {
            return Ok(None);
        }
        if cfg.prefetcher.needs_near() {
            return Err(KernelError::invalid(
                "prefetcher",
                cfg.prefetcher.name(),
                "next-step prefetch needs near-cut candidates on the device, not built yet: use the \
                 CPU backend",
            ));
        }
        let g = &cfg.geometry;
        let mut targets = vec![Vec::new(); g.layers];
        let mut at_target = vec![false; g.layers];
        for (l, t) in targets.iter_mut().enumerate() {
            *t = nominations(cfg, l, g.top_k)?.into_iter().map(|(t, _)| t).collect();
            for &x in t.iter() {
                at_target[x] |= cfg.policy.needs_scores() && g.is_full(x);
            }
        }
        let main = Arc::clone(dev.stream());
        let transfer =
            if serial { None } else { Some(dev.context().new_stream().map_err(driver_error("transfer stream"))?) };
        let delay = match delay_ns {
            0 => None,
            ns => Some((dev.function("backup", "delay_ns")?, ns)),
        };
        Ok(Some(Self {
            cfg: cfg.clone(),
            print: Arc::clone(&dev.print),
            prot: ProtectSpans::new(&main)?,
            cand: main.alloc_zeros(1).map_err(driver_error("prefetch candidates"))?,
            out: SwapOutputs::new(&main, 1, 1)?,
            counts: main.alloc_zeros(SWAP_COUNTS * g.layers).map_err(driver_error("prefetch counts"))?,
            pending: (0..g.layers).map(|_| None).collect(),
            main,
            transfer,
            delay,
            targets,
            at_target,
            batch: None,
            n: 0,
        }))
    }

    /// The step's prefetch requests: each request's candidates are its selection span, its
    /// budget the nominations'; the counts are cleared.
    pub fn begin_step(&mut self, gpu: &GpuSwapInState, reqs: &[SwapReq]) -> Result<()> {
        let mut pf = reqs.to_vec();
        let mut spans = Vec::with_capacity(reqs.len());
        let first = self.targets.iter().position(|t| !t.is_empty());
        for r in &mut pf {
            // Every built-in nominates the same budget for all its targets.
            r.prefetch_budget = match first {
                Some(l) => nominations(&self.cfg, l, r.sel_len as usize)?.first().map_or(0, |&(_, b)| b) as u32,
                None => 0,
            };
            spans.push((r.sel_offset, r.sel_len));
        }
        match self.batch.as_mut() {
            Some(b) => gpu.update_requests(b, &pf)?,
            None => self.batch = Some(gpu.upload_requests(&pf)?),
        }
        gpu.set_protect(&mut self.prot, &spans)?;
        let (n, sel_end) = (reqs.len(), self.batch.as_ref().map_or(0, SwapBatch::selection_end));
        let s = &self.main;
        if self.cand.len() < sel_end {
            self.cand = s.alloc_zeros(sel_end.next_power_of_two()).map_err(driver_error("prefetch candidates"))?;
        }
        if self.out.miss_tokens.len() < sel_end || self.out.counts.len() < SWAP_COUNTS * n {
            self.out = SwapOutputs::new(s, n.next_power_of_two(), sel_end.next_power_of_two())?;
        }
        let need = SWAP_COUNTS * n * self.targets.len();
        if self.counts.len() < need {
            self.counts = s.alloc_zeros(need).map_err(driver_error("prefetch counts"))?;
        }
        s.memset_zeros(&mut self.counts).map_err(driver_error("prefetch counts"))?;
        self.n = n;
        Ok(())
    }

    /// Before `layer`'s swap-in (main stream): its prefetch has landed, or runs now when it
    /// waits for the layer's own scores.
    pub fn before_layer(
        &mut self,
        gpu: &mut GpuSwapInState,
        layer: usize,
        scores: Option<&CudaSlice<f32>>,
        src: MissSource<'_>,
        hot: &mut [CudaSlice<u8>],
    ) -> Result<()> {
        if let Some(e) = self.pending.get_mut(layer).and_then(Option::take) {
            self.main.wait(&e).map_err(driver_error("wait for a prefetch"))?;
        }
        if self.at_target.get(layer) == Some(&true) && self.nominated_into(layer) {
            let main = Arc::clone(&self.main);
            self.launch(gpu, &main, layer, scores, src, hot)?;
        }
        Ok(())
    }

    /// Whether some earlier layer of the step nominates into `layer` (its candidates are then
    /// the last nominating layer's selection, still in the copy).
    fn nominated_into(&self, layer: usize) -> bool {
        self.targets[..layer].iter().any(|t| t.contains(&layer))
    }

    /// After `layer`'s swap-in (main stream): its selection copied aside and its nominations
    /// launched, on the transfer stream where there is one.
    pub fn after_layer(
        &mut self,
        gpu: &mut GpuSwapInState,
        layer: usize,
        selections: &CudaSlice<i32>,
        scores: Option<&CudaSlice<f32>>,
        src: MissSource<'_>,
        hot: &mut [CudaSlice<u8>],
    ) -> Result<()> {
        let targets = self.targets.get(layer).cloned().unwrap_or_default();
        let sel_end = self.batch.as_ref().map_or(0, SwapBatch::selection_end);
        if targets.is_empty() || self.n == 0 || sel_end == 0 {
            return Ok(());
        }
        if selections.len() < sel_end {
            return Err(KernelError::invalid("selections", selections.len(), format!("the batch reads {sel_end}")));
        }
        // SAFETY: positions are non-negative i32s; u32 has the same size and alignment.
        let sels = unsafe { selections.transmute::<u32>(sel_end) }
            .ok_or_else(|| KernelError::invalid("selections", selections.len(), "cannot be viewed as u32"))?;
        let m = &self.main;
        m.memcpy_dtod(&sels, &mut self.cand.slice_mut(..sel_end)).map_err(driver_error("prefetch candidates"))?;
        self.print.copy(addr(&sels, m), addr(&self.cand, m), 4 * sel_end as u64);
        let stream = match self.transfer.clone() {
            Some(t) => {
                t.join(m).map_err(driver_error("the transfer stream waits for the selection"))?;
                if let Some((f, ns)) = &self.delay {
                    crate::cuda::backup::launch_delay(&self.print, &t, f, ns)?;
                }
                t
            }
            None => Arc::clone(m),
        };
        for t in targets {
            if self.at_target[t] {
                continue;
            }
            self.launch(gpu, &stream, t, scores, src, hot)?;
            if self.transfer.is_some() {
                let e = stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(driver_error("prefetch event"))?;
                self.pending[t] = Some(e);
            }
        }
        Ok(())
    }

    /// The prefetch into `target` on `stream`, and its counts kept.
    fn launch(
        &mut self,
        gpu: &mut GpuSwapInState,
        stream: &Arc<CudaStream>,
        target: usize,
        scores: Option<&CudaSlice<f32>>,
        src: MissSource<'_>,
        hot: &mut [CudaSlice<u8>],
    ) -> Result<()> {
        let Some(batch) = self.batch.as_ref() else { return Ok(()) };
        let pool = hot
            .get_mut(target)
            .ok_or_else(|| KernelError::invalid("hot", target, "no hot-buffer pool for that layer"))?;
        let cand = self.cand.as_view();
        let score_view = scores.map(|s| s.as_view());
        gpu.prefetch_on(
            LayerLaunch { stream, layer: target, batch },
            Nominations { candidates: &cand, protect: &cand, spans: &self.prot, scores: score_view.as_ref() },
            src,
            SwapTargets { hot_rows: pool, out: &mut self.out, counts: None },
        )?;
        let n5 = SWAP_COUNTS * self.n;
        let at = target * n5;
        stream
            .memcpy_dtod(&self.out.counts.slice(..n5), &mut self.counts.slice_mut(at..at + n5))
            .map_err(driver_error("prefetch counts"))?;
        self.print.copy(addr(&self.out.counts, stream), addr(&self.counts, stream) + 4 * at as u64, 4 * n5 as u64);
        Ok(())
    }

    /// Orders every prefetch queued so far before the main stream's later work.
    pub fn settle(&mut self) -> Result<()> {
        for e in self.pending.iter_mut().filter_map(Option::take) {
            self.main.wait(&e).map_err(driver_error("wait for a prefetch"))?;
        }
        Ok(())
    }

    /// Adds the step's prefetch counts (read after the main stream synchronised) to `c`.
    pub fn add_counts(&self, c: &mut SwapCounts, row_bytes: u64) -> Result<()> {
        let need = SWAP_COUNTS * self.n * self.targets.len();
        if need == 0 {
            return Ok(());
        }
        let mut host = vec![0u32; need];
        self.main.memcpy_dtoh(&self.counts.slice(..need), &mut host).map_err(driver_error("prefetch counts"))?;
        self.main.synchronize().map_err(driver_error("synchronize"))?;
        for x in host.chunks_exact(SWAP_COUNTS) {
            c.prefetched += u64::from(x[1]);
            c.prefetch_wasted += u64::from(x[4]);
        }
        c.bytes_h2d_prefetch = c.prefetched * row_bytes;
        c.bytes_h2d += c.bytes_h2d_prefetch;
        Ok(())
    }
}
