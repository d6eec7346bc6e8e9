//! `CudaBackend`: the [`Backend`] of one GPU — its state (kernels, reused scratch buffers,
//! event timer), the trait's methods (the launches themselves live in `decode_launch.rs` and
//! `step_launch.rs`), stage timing with CUDA events, and the device swap-in
//! ([`super::GpuSwapInState`]) for the engine.
//!
//! Shapes are checked on the host before anything is launched (typed errors naming the field).
//! What only the device holds (page ids, row locations) is checked by the kernels as they read
//! it: an out-of-range entry is never dereferenced, it is read as a zero row and raises a fault
//! flag that [`StepControl::finish_step`] turns into an error.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute_enum};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use half::bf16;
use hisparse_memory::cuda::CudaMemory;

use super::attention_launch::{AttentionKernels, AttnOutputs, AttnRows, AttnScratch};
use super::decode_launch::FixedHeadIndexer;
use super::device::CudaDevice;
use super::driver_error;
use super::launch_graph::LaunchGraph;
use crate::backend::{Backend, Kernels, ModelKernels, StepControl};
use crate::batch::{AttentionBatch, IndexerBatch, KernelStage, Span, StageSeconds};
use crate::error::{KernelError, Result};

pub(crate) use super::buffers::lock;
use super::decode_launch::DecodeLaunch;
pub(crate) use super::facts::TOPK_SMEM;
use super::gemm_launch::GemmLaunch;
pub(crate) use super::scratch::Scratch;
use super::step_launch::StepLaunch;

/// Event pairs recorded per stage since the last `finish_step`.
#[derive(Default)]
pub(crate) struct Timer {
    open: Option<(KernelStage, CudaEvent)>,
    done: Vec<(KernelStage, CudaEvent, CudaEvent)>,
    pool: Vec<CudaEvent>,
}

/// The CUDA backend of one GPU.
pub struct CudaBackend {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) mem: CudaMemory,
    pub(crate) sms: usize,
    /// The indexer's kernels (exact and fp8 queries).
    pub(crate) indexer: super::decode_launch::IndexerKernels,
    pub(crate) top_k: CudaFunction,
    /// Top-k over several blocks per request (small batches).
    pub(crate) top_k_split: super::topk_launch::TopKSplit,
    pub(crate) attention: AttentionKernels,
    /// The grouped-query rows' attention (`kernels/gqa_attention.cu`).
    gqa: super::gqa_attention_launch::GqaAttention,
    /// The oracle's scores (`kernels/oracle_index.cu`).
    oracle: super::oracle_launch::OracleKernels,
    pub(crate) write_rows: CudaFunction,
    pub(crate) locate_rows: CudaFunction,
    pub(crate) fill_unit: CudaFunction,
    pub(crate) fill_new_rows: CudaFunction,
    pub(crate) scratch: Mutex<Scratch>,
    pub(crate) timer: Mutex<Timer>,
    /// cuBLAS, made on first use (`gemm_launch.rs`).
    pub(crate) blas: std::sync::OnceLock<super::gemm_launch::Blas>,
    /// The launch sequence last captured, and its key.
    pub(crate) graph: Mutex<Option<(u64, LaunchGraph)>>,
    /// Who brings each layer's missed rows into its hot buffer ([`CudaBackend::with_miss_fill`]).
    miss_fill: crate::MissFill,
}

impl CudaBackend {
    /// The backend of GPU `ordinal` on a stream of its own: opens it and compiles (NVRTC) and
    /// loads the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::on(Arc::new(CudaDevice::with_own_stream(ordinal)?))
    }

    /// The backend of an opened device.
    pub fn on(dev: Arc<CudaDevice>) -> Result<Self> {
        let sms = dev
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error("SM count"))?;
        let indexer = super::decode_launch::IndexerKernels::load(&dev)?;
        let top_k = dev.function("topk", "top_k_select")?;
        let attention = AttentionKernels::load(&dev)?;
        let write_rows = dev.function("rows", "write_rows")?;
        let locate_rows = dev.function("rows", "locate_rows")?;
        let fill_unit = dev.function("rows", "fill_unit_bf16")?;
        let fill_new_rows = dev.function("rows", "fill_new_rows")?;
        top_k
            .set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, TOPK_SMEM as i32)
            .map_err(driver_error("top-k shared memory opt-in"))?;
        let sms = usize::try_from(sms).unwrap_or(1).max(1);
        let top_k_split = super::topk_launch::TopKSplit::load(&dev, sms)?;
        let s = dev.stream().clone();
        let a = |e| driver_error("scratch alloc")(e);
        let scratch = Scratch {
            fault: s.alloc_zeros(1).map_err(a)?,
            reqs: s.alloc_zeros(64).map_err(a)?,
            spans: s.alloc_zeros(64).map_err(a)?,
            attn: AttnScratch::new(&dev)?,
            rows_data: s.alloc_zeros(64).map_err(a)?,
            locate: s.alloc_zeros(64).map_err(a)?,
            seeds: s.alloc_zeros(64).map_err(a)?,
            oracle_logits: s.alloc_zeros(1).map_err(a)?,
            oracle_stats: s.alloc_zeros(1).map_err(a)?,
            oracle_partials: s.alloc_zeros(1).map_err(a)?,
            oracle_chunks: s.alloc_zeros(1).map_err(a)?,
            oracle_queries: s.alloc_zeros(1).map_err(a)?,
            oracle_scales: s.alloc_zeros(1).map_err(a)?,
            reqs_c: Vec::new(),
            spans_c: Vec::new(),
            locate_c: Vec::new(),
        };
        Ok(Self {
            mem: CudaMemory::new(s),
            sms,
            indexer,
            top_k,
            top_k_split,
            attention,
            gqa: Default::default(),
            oracle: Default::default(),
            write_rows,
            locate_rows,
            fill_unit,
            fill_new_rows,
            scratch: Mutex::new(scratch),
            timer: Mutex::new(Timer::default()),
            graph: Mutex::new(None),
            blas: std::sync::OnceLock::new(),
            miss_fill: crate::MissFill::SwapIn,
            dev,
        })
    }

    /// This backend with `fill` as its miss-fill form (the swap-in's own copies by default);
    /// refused, naming the field, where its parameters are out of range.
    pub fn with_miss_fill(mut self, fill: crate::MissFill) -> Result<Self> {
        fill.validate()?;
        self.miss_fill = fill;
        Ok(self)
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// Fixes how many blocks a request's top-k may use: 0 chooses per call (the default: several
    /// for requests of 64k positions or more at small batches, where it measured faster on the
    /// H200), 1 always one, more at most that many. The selection is the same either way.
    pub fn with_top_k_blocks(self, blocks: usize) -> Self {
        self.set_top_k_blocks(blocks);
        self
    }

    /// Which kernel scores fp8 queries of 32 or 64 heads ([`FixedHeadIndexer`]; the default,
    /// `Auto`, takes the faster on the H200 for each count). The scores are the same either way.
    pub fn with_indexer_fixed_heads(self, choice: FixedHeadIndexer) -> Self {
        self.set_indexer_fixed_heads(choice);
        self
    }

    /// [`CudaBackend::with_indexer_fixed_heads`] on a backend in use (later launches).
    pub fn set_indexer_fixed_heads(&self, choice: FixedHeadIndexer) {
        self.indexer.set_fixed_heads(choice);
    }

    /// Scores 32 and 64 heads over pages of a multiple of 64 positions on Hopper's warpgroup MMA
    /// (`kernels/indexer_wgmma.cu`, the default: f16 tensor cores, keys converted exactly in
    /// registers, exact and fp8 queries), before the choice of [`FixedHeadIndexer`]; given
    /// `false`, those take the mma.sync kernels too. Scores agree within fp32 rounding either
    /// way (sum orders differ), so runs compared bit for bit use one setting.
    pub fn with_wgmma_indexer(self, on: bool) -> Self {
        self.set_wgmma_indexer(on);
        self
    }

    /// [`CudaBackend::with_wgmma_indexer`] on a backend in use (later launches).
    pub fn set_wgmma_indexer(&self, on: bool) {
        self.indexer.set_wgmma(on);
    }

    /// The device's streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// [`CudaBackend::with_top_k_blocks`] on a backend in use (later launches; a captured launch
    /// sequence keeps the form it was captured with, and its print changes with the form).
    pub fn set_top_k_blocks(&self, blocks: usize) {
        self.top_k_split.choice.blocks.store(blocks, std::sync::atomic::Ordering::Relaxed);
    }

    /// Fixes the attention's split count (0: automatic). Results depend on it in their last
    /// bits, so runs compared bit for bit use the same value.
    pub fn with_splits(mut self, splits: usize) -> Self {
        self.attention.splits = splits;
        self
    }

    /// Runs the attention (bf16 or fp8 rows, in the pool or read from the host tier or staging
    /// rows) on Hopper's warpgroup MMA (`kernels/attention_wgmma.cu`, the default: 2.2-3.0x the
    /// mma.sync kernel's throughput at batch 64 and 128 heads on the H200) or, given `false`, on
    /// mma.sync (`kernels/attention.cu`). Both agree with the CPU within the same bf16
    /// tolerance, not bit for bit with each other: runs compared bit for bit use one kernel.
    pub fn with_wgmma_attention(mut self, on: bool) -> Self {
        self.attention.wgmma = on;
        self
    }
}

impl CudaBackend {
    /// The indexer and top-k launches' view of the backend.
    fn decode(&self) -> DecodeLaunch<'_> {
        DecodeLaunch {
            dev: &self.dev,
            scratch: &self.scratch,
            sms: self.sms,
            indexer: &self.indexer,
            top_k: &self.top_k,
            top_k_split: &self.top_k_split,
        }
    }

    /// The row and unit-stream launches' view of the backend.
    fn steps(&self) -> StepLaunch<'_> {
        StepLaunch {
            dev: &self.dev,
            scratch: &self.scratch,
            sms: self.sms,
            write_rows: &self.write_rows,
            locate_rows: &self.locate_rows,
            fill_unit: &self.fill_unit,
            fill_new_rows: &self.fill_new_rows,
        }
    }

    /// The GEMM launches' view of the backend.
    fn gemm(&self) -> GemmLaunch<'_> {
        GemmLaunch { dev: &self.dev, blas: &self.blas }
    }
}

impl Kernels for CudaBackend {
    type Memory = CudaMemory;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn memory(&self) -> &CudaMemory {
        &self.mem
    }

    fn indexer_scores(&self, batch: &IndexerBatch<'_, CudaMemory>, scores: &mut CudaSlice<f32>) -> Result<()> {
        if let crate::IndexScore::Oracle(oracle) = batch.score {
            return self.oracle.launch(&self.dev, &self.scratch, batch, oracle, scores);
        }
        self.decode().launch_indexer(batch, scores)
    }

    fn top_k(&self, scores: &CudaSlice<f32>, spans: &[Span], k: usize, out: &mut CudaSlice<i32>) -> Result<()> {
        self.decode().launch_top_k(scores, spans, k, out)
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, CudaMemory>,
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let mut sc = lock(&self.scratch)?;
        let Scratch { attn, fault, .. } = &mut *sc;
        let outs = AttnOutputs { out, lse, fault };
        if let hisparse_memory::RowHeads::Gqa { .. } = batch.layout.heads() {
            return self.gqa.launch(&self.dev, attn, &batch.query(), batch.rows, outs);
        }
        self.attention.launch(&self.dev, attn, &batch.query(), AttnRows::Pool(batch.rows), outs)
    }

    fn write_rows(&self, pool: &mut CudaSlice<u8>, row_bytes: usize, rows: &[u32], data: &[u8]) -> Result<()> {
        self.steps().launch_write_rows(pool, row_bytes, rows, data)
    }

    fn locate_rows(
        &self,
        selections: &CudaSlice<i32>,
        spans: &[Span],
        page_table: &CudaSlice<u32>,
        first_pages: &[usize],
        page_tokens: usize,
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        self.steps().launch_locate_rows(selections, spans, page_table, first_pages, page_tokens, out)
    }

    fn scatter_rows(
        &self,
        pool: &mut CudaSlice<u8>,
        row_bytes: usize,
        rows: &CudaSlice<u32>,
        data: &CudaSlice<u8>,
    ) -> Result<()> {
        self.steps().launch_scatter_rows(pool, row_bytes, rows, data)
    }
}

impl StepControl for CudaBackend {
    fn mark_stage(&self, stage: KernelStage, begin: bool) -> Result<()> {
        if self.dev.capturing() {
            // Inside a capture the events would be recorded into the graph: the replay is
            // timed as a whole instead (`KernelStage::Graph`).
            return Ok(());
        }
        let mut t = lock(&self.timer)?;
        let ev = match t.pool.pop() {
            Some(e) => e,
            None => {
                self.dev.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver_error("event"))?
            }
        };
        ev.record(self.dev.stream()).map_err(driver_error("event record"))?;
        if begin {
            if let Some((_, old)) = t.open.replace((stage, ev)) {
                t.pool.push(old);
            }
        } else if let Some((st, start)) = t.open.take() {
            t.done.push((st, start, ev));
        } else {
            t.pool.push(ev);
        }
        Ok(())
    }

    fn finish_step(&self) -> Result<Option<StageSeconds>> {
        let s = self.dev.stream();
        s.synchronize().map_err(driver_error("synchronize"))?;
        self.dev.context().check_err().map_err(driver_error("deferred error"))?;
        let mut secs = StageSeconds::default();
        {
            let mut t = lock(&self.timer)?;
            let done = std::mem::take(&mut t.done);
            for (stage, a, b) in done {
                secs.add(stage, f64::from(a.elapsed_ms(&b).map_err(driver_error("event time"))?) / 1e3);
                t.pool.push(a);
                t.pool.push(b);
            }
        }
        let mut sc = lock(&self.scratch)?;
        let mut flag = [0u32];
        s.memcpy_dtoh(&sc.fault, &mut flag).map_err(driver_error("fault flag"))?;
        s.synchronize().map_err(driver_error("synchronize"))?;
        if flag[0] != 0 {
            s.memset_zeros(&mut sc.fault).map_err(driver_error("fault flag"))?;
            return Err(KernelError::invalid(
                "page_table/locations",
                "out of range",
                "a kernel met a page id or row location outside its pool (read as zeros)",
            ));
        }
        Ok(Some(secs))
    }

    fn launch_print(&self) -> u64 {
        self.dev.take_print()
    }

    fn begin_capture(&self) -> Result<bool> {
        self.dev.begin_capture()?;
        Ok(true)
    }

    fn end_capture(&self, key: u64) -> Result<()> {
        let mut g = lock(&self.graph)?;
        *g = None;
        *g = self.dev.end_capture()?.map(|graph| (key, graph));
        Ok(())
    }

    fn replay(&self, key: u64) -> Result<bool> {
        match &*lock(&self.graph)? {
            Some((k, g)) if *k == key => g.launch().map(|()| true),
            _ => Ok(false),
        }
    }
}

impl ModelKernels for CudaBackend {
    fn fill_new_rows(
        &self,
        fill: &crate::NewRows<'_, CudaMemory>,
        rows: &mut CudaSlice<u8>,
        keys: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        self.steps().launch_fill_new_rows(fill, rows, keys)
    }

    fn fill_unit_bf16(&self, seeds: &[u64], len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        self.steps().launch_fill_unit(seeds, len, out)
    }

    fn fill_unit_bf16_seeded(&self, seeds: &CudaSlice<u64>, len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        self.steps().launch_fill_unit_seeded(seeds, len, out)
    }

    fn gemm_bf16(
        &self,
        shape: &crate::GemmShape,
        a: &CudaSlice<bf16>,
        b: &CudaSlice<bf16>,
        c: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        self.gemm().launch_gemm(shape, a, b, c)
    }

    fn join_group(
        &self,
        member: crate::collectives::RankMember,
    ) -> Result<Box<dyn crate::collectives::Collectives<CudaMemory>>> {
        match member {
            #[cfg(feature = "nccl")]
            crate::collectives::RankMember::Nccl { id, rank, ranks } => {
                Ok(Box::new(super::NcclRank::join(&self.dev, rank, ranks, &id)?))
            }
            m @ crate::collectives::RankMember::Cpu(_) => Err(KernelError::invalid(
                "gpus",
                m.ranks(),
                "a CPU rank on the CUDA backend: ranks of GPUs use NCCL (feature `nccl`)",
            )),
        }
    }
}

impl Backend for CudaBackend {
    type SwapIn = crate::cuda::swap_in::CudaSwapIn;
    type Backup = super::backup::CudaRowBackup;

    fn device_swap_in(
        &self,
        cfg: &crate::DeviceSwapInConfig,
        host: &mut hisparse_memory::HostTier,
    ) -> Result<Self::SwapIn> {
        crate::cuda::swap_in::CudaSwapIn::new(&self.dev, cfg, host, self.attention.clone(), self.miss_fill)
    }

    fn miss_fill(&self) -> crate::MissFill {
        self.miss_fill
    }

    fn row_backup(&self, cfg: &crate::RowBackupConfig, host: &mut hisparse_memory::HostTier) -> Result<Self::Backup> {
        super::backup::CudaRowBackup::new(&self.dev, cfg, host)
    }
}
