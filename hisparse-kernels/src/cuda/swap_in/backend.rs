//! `CudaSwapIn`: [`GpuSwapInState`] behind the backend-neutral [`DeviceSwapIn`] interface the engine
//! drives — the host tier registered as mapped memory, the step's requests and host pages
//! uploaded once per step, each layer's hit/miss counts gathered on the device and read once at
//! the end of the step. It holds the tier's [`MappedHostTier`], so it cannot outlive the mapping
//! it reads.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use hisparse_memory::HostTier;
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::host_tier::MappedHostTier;
use hisparse_policy::OnlinePolicy;

use crate::MissFill;

use super::deferred::{DeferredFill, DeferredSwapStream, DeferredTargets};
use super::io::{LayerLaunch, MissSource, Selections, SwapTargets};
use super::prefetch::GpuPrefetch;
use super::state::{GpuSwapInState, GpuSwapInStateShape, SwapBatch, SwapOutputs};
use crate::cuda::attention_launch::{AttentionKernels, AttnOutputs, AttnRows, AttnScratch};
use crate::cuda::device::CudaDevice;
use crate::cuda::driver_error;
use crate::error::{KernelError, Result};
use crate::swap_in::{AttentionQuery, DeviceSwapIn, DeviceSwapInConfig, DeviceSwapReq, SWAP_COUNTS, SwapCounts};

/// The CUDA device swap-in.
pub struct CudaSwapIn {
    dev: Arc<CudaDevice>,
    gpu: GpuSwapInState,
    host: MappedHostTier,
    batch: Option<SwapBatch>,
    pages_d: CudaSlice<u32>,
    out: SwapOutputs,
    /// Hits, misses, evictions of every request of every launched layer of the step.
    counts: CudaSlice<u32>,
    launched: usize,
    layers: usize,
    /// Prefetch of later layers' rows (a prefetcher other than `none`).
    prefetch: Option<GpuPrefetch>,
    /// The attention that brings the misses in (`fill_in_attention`), and its scratch.
    attention: AttentionKernels,
    attn_scratch: AttnScratch,
    /// The layer whose fills `out.fills` holds (the last launched with misses left to attend).
    fills_of: Option<usize>,
    /// The deferred swap-in (`miss_fill = "deferred"` or `"auto"`), for batches of at most
    /// `fill_max` while the policy reads no scores (else the attention fills those misses).
    deferred: Option<DeferredSwapStream>,
    /// The largest batch whose misses the attention fills or reads.
    fill_max: usize,
    /// The policy reads scores (which the next layer overwrites before a deferred swap-in).
    reads_scores: bool,
}

impl CudaSwapIn {
    /// Registers `host` with the device and sets up the swap-in state; `attention` (the
    /// backend's, with its split count) attends when the misses are left to it, as `fill` (the
    /// backend's miss-fill form) says.
    pub(crate) fn new(
        dev: &Arc<CudaDevice>,
        cfg: &DeviceSwapInConfig,
        host: &mut HostTier,
        attention: AttentionKernels,
        fill: MissFill,
    ) -> Result<Self> {
        let delay_ns = cfg.transfer_delay.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let prefetch = GpuPrefetch::new(dev, cfg, cfg.serial_prefetch, delay_ns)?;
        let mapped = host.register_cuda(dev.context())?;
        let shape = GpuSwapInStateShape {
            seats: cfg.seats,
            layers: cfg.geometry.layers,
            device_buffer_size: cfg.device_buffer_size,
            block_size: cfg.block_size,
            max_sel: cfg.geometry.top_k,
            max_tokens: cfg.max_tokens,
        };
        let mut gpu = GpuSwapInState::new(dev, Arc::clone(cfg.policy.get()), shape)?;
        if fill.hits_first() && !attention.wgmma {
            return Err(KernelError::invalid(
                "miss_fill",
                crate::MissFillMode::HitsFirst,
                "needs the warpgroup-MMA attention (not --attention-kernel mma-sync)",
            ));
        }
        // Grouped-query rows are read from the pool only (`gqa_attention_launch.rs`): the swap-in
        // copies every miss itself.
        if cfg.geometry.kv_heads().is_some() && fill.fill_max_batch() > 0 {
            return Err(KernelError::invalid(
                "miss_fill",
                format!("{fill:?}"),
                "grouped-query rows are brought in by the swap-in's own copies (swap-in): the forms that leave misses to the attention read MLA rows only",
            ));
        }
        let rb = mapped.layout().row_bytes;
        let form = match fill {
            MissFill::CopyEngine { share, host_threads } => {
                Some(DeferredFill::CopyEngine(mapped.clone(), share, MissFill::gather_threads(host_threads)))
            }
            MissFill::HitsFirst => Some(DeferredFill::HitsFirst(rb)),
            MissFill::DeferredGather => Some(DeferredFill::Gather(rb)),
            // The bound defers its (copyless) decisions where `auto` would defer them.
            MissFill::NoCopies { max_batch } => (max_batch > 0).then_some(DeferredFill::HostReads),
            f => f.deferred().then_some(DeferredFill::HostReads),
        };
        let deferred = match form {
            Some(fill) => Some(DeferredSwapStream::new(dev, cfg.geometry.layers, delay_ns, fill)?),
            None => None,
        };
        let reads_scores = cfg.policy.needs_scores();
        // Without copies nobody fills: the attention reads the hot rows the decisions left.
        let attention_fills = fill.copies() && (deferred.is_none() || reads_scores);
        gpu.set_fill_max(if attention_fills { fill.fill_max_batch() } else { 0 });
        gpu.set_copies(fill.copies());
        let s = dev.stream();
        Ok(Self {
            dev: Arc::clone(dev),
            gpu,
            host: mapped,
            batch: None,
            pages_d: s.alloc_zeros(1).map_err(driver_error("host pages"))?,
            out: SwapOutputs::new(s, 1, 1)?,
            counts: s.alloc_zeros(3).map_err(driver_error("swap-in counts"))?,
            launched: 0,
            layers: cfg.geometry.layers,
            prefetch,
            attention,
            attn_scratch: AttnScratch::new(dev)?,
            fills_of: None,
            deferred,
            fill_max: fill.fill_max_batch(),
            reads_scores,
        })
    }

    /// Whether the swap-in of a batch of `n` requests is deferred.
    fn defers(&self, n: usize) -> bool {
        self.deferred.is_some() && !self.reads_scores && n <= self.fill_max
    }

    /// What follows a layer's launch: its fills noted, its nominations prefetched.
    fn after_launch(
        &mut self,
        layer: usize,
        selections: &CudaSlice<i32>,
        scores: Option<&CudaSlice<f32>>,
        hot_pools: &mut [CudaSlice<u8>],
    ) -> Result<()> {
        self.fills_of = Some(layer);
        self.launched = self.launched.max(layer + 1);
        if let Some(p) = self.prefetch.as_mut() {
            let src = MissSource { pages: &self.pages_d, host: &self.host };
            p.after_layer(&mut self.gpu, layer, selections, scores, src, hot_pools)?;
        }
        Ok(())
    }
}

impl DeviceSwapIn<CudaMemory> for CudaSwapIn {
    fn reset_seat(&mut self, seat: usize, preload: usize) -> Result<()> {
        self.gpu.reset_seat(seat, preload)
    }

    fn set_policy(&mut self, policy: OnlinePolicy) -> Result<()> {
        self.reads_scores = policy.needs_scores();
        let attention_fills = self.gpu.copies && (self.deferred.is_none() || self.reads_scores);
        self.gpu.set_fill_max(if attention_fills { self.fill_max } else { 0 });
        self.gpu.reset_policy(Arc::clone(policy.get()), &self.dev)
    }

    fn begin_step(&mut self, reqs: &[DeviceSwapReq], host_pages: &[u32]) -> Result<()> {
        self.launched = 0;
        self.fills_of = None;
        // Into the same buffers while they fit: a captured launch sequence reads them there.
        match self.batch.as_mut() {
            Some(b) => self.gpu.update_requests(b, reqs)?,
            None => self.batch = Some(self.gpu.upload_requests(reqs)?),
        }
        if reqs.is_empty() {
            return Ok(());
        }
        let s = self.dev.stream();
        if self.pages_d.len() < host_pages.len() {
            self.pages_d = s.alloc_zeros(host_pages.len().next_power_of_two()).map_err(driver_error("host pages"))?;
        }
        if !host_pages.is_empty() {
            s.memcpy_htod(host_pages, &mut self.pages_d.slice_mut(..host_pages.len()))
                .map_err(driver_error("host pages"))?;
        }
        let selected = self.batch.as_ref().map_or(0, SwapBatch::selection_end);
        if self.out.miss_tokens.len() < selected || self.out.counts.len() < SWAP_COUNTS * reqs.len() {
            self.out = SwapOutputs::new(s, reqs.len().next_power_of_two(), selected.next_power_of_two())?;
        }
        let need = SWAP_COUNTS * reqs.len() * self.layers;
        if self.counts.len() < need {
            self.counts = s.alloc_zeros(need).map_err(driver_error("swap-in counts"))?;
        }
        if let Some(p) = self.prefetch.as_mut() {
            p.begin_step(&self.gpu, reqs)?;
        }
        if let Some(d) = self.deferred.as_mut() {
            d.begin_step(reqs.len(), selected)?;
        }
        Ok(())
    }

    fn launch(
        &mut self,
        layer: usize,
        selections: &CudaSlice<i32>,
        scores: Option<&CudaSlice<f32>>,
        hot_pools: &mut [CudaSlice<u8>],
        locations: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let Some(batch) = self.batch.as_ref() else {
            return Err(KernelError::invalid("begin_step", "missing", "launch before the step's requests"));
        };
        let n = batch.requests().len();
        self.fills_of = None;
        if n == 0 {
            // Nothing to fill: the attention of no request may follow.
            self.fills_of = Some(layer);
            return Ok(());
        }
        if layer >= self.layers {
            return Err(KernelError::invalid("layer", layer, format!("the swap-in holds {} layers", self.layers)));
        }
        if let Some(p) = self.prefetch.as_mut() {
            let src = MissSource { pages: &self.pages_d, host: &self.host };
            p.before_layer(&mut self.gpu, layer, scores, src, hot_pools)?;
        }
        let hot = hot_pools
            .get_mut(layer)
            .ok_or_else(|| KernelError::invalid("hot", layer, "no hot-buffer pool for that layer"))?;
        // SAFETY: positions are non-negative i32s; u32 has the same size and alignment.
        let sels = unsafe { selections.transmute::<u32>(selections.len()) }
            .ok_or_else(|| KernelError::invalid("selections", selections.len(), "cannot be viewed as u32"))?;
        let at = layer * SWAP_COUNTS * n;
        if self.defers(n)
            && let Some(d) = self.deferred.as_mut()
        {
            let src = MissSource { pages: &self.pages_d, host: &self.host };
            let dst = DeferredTargets {
                hot_rows: hot,
                locations,
                fills: &mut self.out.fills,
                counts: (&mut self.counts, at),
            };
            d.launch(&mut self.gpu, layer, batch, &sels, src, dst)?;
            return self.after_launch(layer, selections, scores, hot_pools);
        }
        // The kernel writes locations into the swap-in's output; lend it the caller's buffer.
        std::mem::swap(&mut self.out.locations, locations);
        let score_view = scores.map(|s| s.as_view());
        // Counts straight into this layer's place in the step's counts (no copy launch).
        let main = Arc::clone(self.dev.stream());
        let r = self.gpu.launch_counted(
            LayerLaunch { stream: &main, layer, batch },
            Selections { positions: &sels, scores: score_view.as_ref() },
            MissSource { pages: &self.pages_d, host: &self.host },
            SwapTargets { hot_rows: hot, out: &mut self.out, counts: Some((&mut self.counts, at)) },
            None,
        );
        std::mem::swap(&mut self.out.locations, locations);
        r?;
        self.after_launch(layer, selections, scores, hot_pools)
    }

    fn fills_in_attention(&self) -> bool {
        let n = self.batch.as_ref().map_or(0, |b| b.requests().len());
        // The bound (no copies) never reads the host tier: its attention reads the locations
        // alone, a miss's being its request's placeholder slot.
        self.gpu.copies && (self.gpu.fills(n) || self.defers(n))
    }

    fn attend(
        &mut self,
        layer: usize,
        query: &AttentionQuery<'_, CudaMemory>,
        hot: &mut [CudaSlice<u8>],
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if !self.fills_in_attention() {
            return Err(KernelError::invalid("miss_fill", layer, "this swap-in copied the misses already"));
        }
        if self.fills_of != Some(layer) {
            return Err(KernelError::invalid(
                "layer",
                layer,
                format!("the last swap-in launch was of layer {:?}; attend right after it", self.fills_of),
            ));
        }
        let hot = hot
            .get_mut(layer)
            .ok_or_else(|| KernelError::invalid("hot", layer, "no hot-buffer pool for that layer"))?;
        let n = self.batch.as_ref().map_or(0, |b| b.requests().len());
        let (fills, host) = (&self.out.fills, &self.host);
        let deferred = self.deferred.as_ref().filter(|_| self.defers(n));
        if let Some(misses) = deferred.and_then(|d| d.landed_misses(layer)) {
            let outs = AttnOutputs { out, lse, fault: &mut self.gpu.fault };
            let rows = (&*hot, &self.out.fills, &self.host);
            return self.attention.launch_hits_first(&self.dev, &mut self.attn_scratch, query, rows, &misses, outs);
        }
        let staging = self.deferred.as_ref().and_then(|d| d.staging_of(layer));
        let rows = match (self.defers(n), staging.as_ref()) {
            (true, Some(staging)) => AttnRows::Staged { hot, fills, staging },
            (true, None) => AttnRows::Read { hot, fills, host },
            (false, _) => AttnRows::Fill { hot, fills, host },
        };
        let outs = AttnOutputs { out, lse, fault: &mut self.gpu.fault };
        self.attention.launch(&self.dev, &mut self.attn_scratch, query, rows, outs)
    }

    fn settle(&mut self) -> Result<()> {
        if let Some(d) = self.deferred.as_mut() {
            d.settle()?;
        }
        match self.prefetch.as_mut() {
            Some(p) => p.settle(),
            None => Ok(()),
        }
    }

    fn note_replayed(&mut self, layers: usize) {
        self.launched = self.launched.max(layers.min(self.layers));
    }

    fn end_step(&mut self, _hot: &mut [CudaSlice<u8>]) -> Result<SwapCounts> {
        self.settle()?;
        let n3 = SWAP_COUNTS * self.batch.as_ref().map_or(0, |b| b.requests().len()) * self.launched;
        let mut c = SwapCounts::default();
        if n3 == 0 {
            return Ok(c);
        }
        let mut host = vec![0u32; n3];
        let s = self.dev.stream();
        s.memcpy_dtoh(&self.counts.slice(..n3), &mut host).map_err(driver_error("swap-in counts"))?;
        s.synchronize().map_err(driver_error("synchronize"))?;
        let copy_engine = self.deferred.as_ref().and_then(DeferredSwapStream::take_copy_engine);
        if let Some((true, _, _)) = copy_engine {
            return Err(KernelError::invalid(
                "host gather",
                "failed",
                "the copy-engine path's host gather met a list out of its bounds or a row outside the tier",
            ));
        }
        if self.gpu.take_fault()? {
            return Err(KernelError::invalid(
                "selections",
                "out of range",
                "the swap-in met a selected position beyond its sequence or a host page outside the tier",
            ));
        }
        for x in host.chunks_exact(SWAP_COUNTS) {
            c.hits += u64::from(x[0]);
            c.misses += u64::from(x[1]);
            c.max_misses = c.max_misses.max(u64::from(x[1]));
            c.prefetch_useful += u64::from(x[3]);
            c.prefetch_wasted += u64::from(x[4]);
        }
        let rb = self.host.layout().row_bytes as u64;
        c.bytes_h2d = c.misses * rb;
        if let Some((_, landed, overflow)) = copy_engine {
            c.copy_engine_rows = landed;
            c.copy_engine_overflow = overflow;
        }
        if let Some(p) = self.prefetch.as_ref() {
            p.add_counts(&mut c, rb)?;
        }
        Ok(c)
    }
}
