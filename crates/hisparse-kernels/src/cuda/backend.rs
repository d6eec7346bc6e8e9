//! `CudaBackend`: the [`Backend`] of one GPU — the indexer, top-k and sparse MLA decode kernels
//! launched on the device's stream over [`CudaMemory`], stage timing with CUDA events, and the
//! device swap-in ([`super::GpuSwapIn`]) for the engine.
//!
//! Shapes are checked on the host before anything is launched (typed errors naming the field).
//! What only the device holds (page ids, row locations) is checked by the kernels as they read
//! it: an out-of-range entry is never dereferenced, it is read as a zero row and raises a fault
//! flag that [`Backend::finish_step`] turns into an error.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute_enum};
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use half::bf16;
use hisparse_memory::KvRowFormat;
use hisparse_memory::cuda::CudaMemory;

use super::device::CudaDevice;
use super::driver_error;
use crate::backend::{AttentionBatch, Backend, IndexerBatch, KernelStage, Span, StageSeconds};
use crate::error::{KernelError, Result, check_len};

/// Heads of one attention block; rows per tile (the kernel's `HB`, `TILE`).
const HEAD_BLOCK: usize = 64;
const TILE: usize = 32;
/// Shared memory of the attention kernel: Q and K tiles (stride 584 bf16), P, partial S, two
/// tiles of locations, raw rows.
const ATTN_SMEM: usize = 64 * 584 * 2 + 32 * 584 * 2 + 64 * 40 * 2 + 2 * 64 * 40 * 4 + 2 * 32 * 4 + 32 * 1152;

/// Dynamic shared memory of top-k: eight copies of a 2048-bin histogram.
const TOPK_SMEM: usize = 8 * 2048 * 4;

/// Most indexer heads (shared memory of the query fragments).
const MAX_INDEX_HEADS: usize = 256;

/// Shared memory of the indexer: query fragments and weights, two staging tiles per warp.
fn indexer_smem(heads: usize) -> usize {
    heads * 260 + 4 * 2 * 32 * 33 * 4
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GpuIndexerReq {
    first_page: u32,
    seq_len: u32,
    score_offset: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GpuSpan {
    offset: u64,
    len: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct LocateReq {
    sel_offset: u64,
    sel_len: u64,
    first_page: u64,
    pages: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AttnParams {
    heads: u32,
    row_bytes: u32,
    fp8: u32,
    splits: u32,
    pool_rows: u64,
    scale_log2: f32,
    pad: u32,
}

// SAFETY: #[repr(C)] structs of plain numbers, laid out as the kernels' structs of the same name.
unsafe impl DeviceRepr for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl DeviceRepr for GpuSpan {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuSpan {}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for LocateReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for LocateReq {}

/// Buffers reused across calls (small per-call arrays, split partials, the fault flag).
struct Scratch {
    fault: CudaSlice<u32>,
    reqs: CudaSlice<GpuIndexerReq>,
    spans: CudaSlice<GpuSpan>,
    sels: CudaSlice<GpuSpan>,
    part_out: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
    rows_data: CudaSlice<u8>,
    locate: CudaSlice<LocateReq>,
    seeds: CudaSlice<u64>,
    /// What the per-call arrays above hold (they are the same for every layer of a step).
    reqs_c: Vec<GpuIndexerReq>,
    spans_c: Vec<GpuSpan>,
    sels_c: Vec<GpuSpan>,
    locate_c: Vec<LocateReq>,
}

/// Event pairs recorded per stage since the last `finish_step`.
#[derive(Default)]
struct Timer {
    open: Option<(KernelStage, CudaEvent)>,
    done: Vec<(KernelStage, CudaEvent, CudaEvent)>,
    pool: Vec<CudaEvent>,
}

/// The CUDA backend of one GPU.
pub struct CudaBackend {
    dev: Arc<CudaDevice>,
    mem: CudaMemory,
    sms: usize,
    indexer: CudaFunction,
    top_k: CudaFunction,
    attention: CudaFunction,
    merge: CudaFunction,
    write_rows: CudaFunction,
    locate_rows: CudaFunction,
    fill_unit: CudaFunction,
    scratch: Mutex<Scratch>,
    timer: Mutex<Timer>,
    /// Split count of the attention (0: chosen per call from the batch and the SM count).
    splits: usize,
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| KernelError::Cuda { context: "backend state".into(), message: "poisoned lock".into() })
}

/// `buf` with room for `len` elements (reallocated, uninitialised contents, when too small).
/// Copies `host` into `buf` unless `cache` says `buf` already holds it.
fn upload_cached<T: DeviceRepr + ValidAsZeroBits + Clone + PartialEq>(
    dev: &CudaDevice,
    buf: &mut CudaSlice<T>,
    cache: &mut Vec<T>,
    host: &[T],
) -> Result<()> {
    if cache.as_slice() == host {
        return Ok(());
    }
    if buf.len() < host.len() {
        *buf = dev.stream().alloc_zeros(host.len().next_power_of_two()).map_err(driver_error("scratch alloc"))?;
    }
    dev.stream().memcpy_htod(host, &mut buf.slice_mut(..host.len())).map_err(driver_error("upload"))?;
    cache.clear();
    cache.extend_from_slice(host);
    Ok(())
}

fn room<T: DeviceRepr + ValidAsZeroBits>(dev: &CudaDevice, buf: &mut CudaSlice<T>, len: usize) -> Result<()> {
    if buf.len() < len {
        *buf = dev.stream().alloc_zeros(len.next_power_of_two()).map_err(driver_error("scratch alloc"))?;
    }
    Ok(())
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
        let indexer = dev.function("indexer", "indexer_scores")?;
        let top_k = dev.function("topk", "top_k_select")?;
        let attention = dev.function("attention", "sparse_mla_decode")?;
        let merge = dev.function("attention", "merge_splits")?;
        let write_rows = dev.function("rows", "write_rows")?;
        let locate_rows = dev.function("rows", "locate_rows")?;
        let fill_unit = dev.function("rows", "fill_unit_bf16")?;
        indexer
            .set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                indexer_smem(MAX_INDEX_HEADS) as i32,
            )
            .map_err(driver_error("indexer shared memory opt-in"))?;
        top_k
            .set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, TOPK_SMEM as i32)
            .map_err(driver_error("top-k shared memory opt-in"))?;
        attention
            .set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ATTN_SMEM as i32)
            .map_err(driver_error("attention shared memory opt-in"))?;
        let s = dev.stream().clone();
        let a = |e| driver_error("scratch alloc")(e);
        let scratch = Scratch {
            fault: s.alloc_zeros(1).map_err(a)?,
            reqs: s.alloc_zeros(64).map_err(a)?,
            spans: s.alloc_zeros(64).map_err(a)?,
            sels: s.alloc_zeros(64).map_err(a)?,
            part_out: s.alloc_zeros(1).map_err(a)?,
            part_lse: s.alloc_zeros(1).map_err(a)?,
            rows_data: s.alloc_zeros(64).map_err(a)?,
            locate: s.alloc_zeros(64).map_err(a)?,
            seeds: s.alloc_zeros(64).map_err(a)?,
            reqs_c: Vec::new(),
            spans_c: Vec::new(),
            sels_c: Vec::new(),
            locate_c: Vec::new(),
        };
        Ok(Self {
            mem: CudaMemory::new(s),
            sms: usize::try_from(sms).unwrap_or(1).max(1),
            indexer,
            top_k,
            attention,
            merge,
            write_rows,
            locate_rows,
            fill_unit,
            scratch: Mutex::new(scratch),
            timer: Mutex::new(Timer::default()),
            splits: 0,
            dev,
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// Fixes the attention's split count (0: automatic). Results depend on it in their last
    /// bits, so runs compared bit for bit use the same value.
    pub fn with_splits(mut self, splits: usize) -> Self {
        self.splits = splits;
        self
    }

    /// The split count for `blocks` (request, head group) pairs of `max_len` selected rows.
    fn choose_splits(&self, blocks: usize, max_len: usize) -> usize {
        let tiles = max_len.div_ceil(TILE).max(1);
        let want = if self.splits > 0 { self.splits } else { (self.sms as f64 / blocks as f64).round() as usize };
        // At least two tiles per split, so that the fetch of one overlaps the other.
        want.clamp(1, tiles.div_ceil(2).max(1))
    }
}

impl Backend for CudaBackend {
    type Memory = CudaMemory;
    type SwapIn = super::swap_in_backend::CudaSwapIn;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn memory(&self) -> &CudaMemory {
        &self.mem
    }

    fn indexer_scores(&self, batch: &IndexerBatch<'_, CudaMemory>, scores: &mut CudaSlice<f32>) -> Result<()> {
        let (heads, dim, kb, p) =
            (batch.heads, batch.key_layout.dim(), batch.key_layout.row_bytes(), batch.page_tokens);
        if heads == 0 || !heads.is_multiple_of(8) {
            return Err(KernelError::invalid("heads", heads, "the CUDA indexer needs a multiple of 8"));
        }
        if dim != 128 {
            return Err(KernelError::invalid("key_layout.dim", dim, "the CUDA indexer is built for 128"));
        }
        if p == 0 {
            return Err(KernelError::invalid("page_tokens", p, "must be at least 1"));
        }
        let n = batch.requests.len();
        check_len("queries", n * heads * dim, batch.queries.len())?;
        check_len("weights", n * heads, batch.weights.len())?;
        if !batch.keys.len().is_multiple_of(kb * p) {
            return Err(KernelError::invalid("keys", batch.keys.len(), "not a whole number of key pages"));
        }
        let pool_pages = batch.keys.len() / (kb * p);
        let mut reqs = Vec::with_capacity(n);
        let mut max_len = 0;
        for (i, r) in batch.requests.iter().enumerate() {
            if r.first_page + r.seq_len.div_ceil(p) > batch.page_table.len() {
                return Err(KernelError::invalid(
                    "requests.first_page",
                    r.first_page,
                    format!("request {i}: pages leave the page table"),
                ));
            }
            if r.score_offset + r.seq_len > scores.len() {
                return Err(KernelError::invalid(
                    "requests.score_offset",
                    r.score_offset,
                    format!("request {i}: scores leave the output"),
                ));
            }
            let fit = |x: usize, f| u32::try_from(x).map_err(|_| KernelError::invalid(f, x, "must fit in 32 bits"));
            reqs.push(GpuIndexerReq {
                first_page: fit(r.first_page, "requests.first_page")?,
                seq_len: fit(r.seq_len, "requests.seq_len")?,
                score_offset: fit(r.score_offset, "requests.score_offset")?,
                pad: 0,
            });
            max_len = max_len.max(r.seq_len);
        }
        if n == 0 || max_len == 0 {
            return Ok(());
        }
        let mut sc = lock(&self.scratch)?;
        let Scratch { reqs: rd, reqs_c, .. } = &mut *sc;
        upload_cached(&self.dev, rd, reqs_c, &reqs)?;
        let s = self.dev.stream();
        // About four blocks per SM in all; each warp then walks many 32-position chunks.
        let chunks = max_len.div_ceil(32);
        // At most one wave of four blocks per SM (a second, nearly empty wave would double the time).
        let per_request = (4 * self.sms / n).clamp(1, chunks.div_ceil(4));
        if heads > MAX_INDEX_HEADS {
            return Err(KernelError::invalid(
                "heads",
                heads,
                format!("the CUDA indexer takes at most {MAX_INDEX_HEADS}"),
            ));
        }
        let smem = indexer_smem(heads);
        let cfg = LaunchConfig {
            grid_dim: (per_request as u32, n as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (h, pt, pp, pin) = (heads as u32, p as u32, pool_pages as u32, u32::from(batch.pin_newest));
        let Scratch { fault, reqs: reqs_d, .. } = &mut *sc;
        let mut b = s.launch_builder(&self.indexer);
        b.arg(batch.queries)
            .arg(batch.weights)
            .arg(batch.keys)
            .arg(batch.page_table)
            .arg(&*reqs_d)
            .arg(scores)
            .arg(&h)
            .arg(&pt)
            .arg(&pp)
            .arg(&pin)
            .arg(fault);
        // SAFETY: queries/weights hold n requests (checked); every request's page-table entries
        // and score span lie within their buffers (checked); page ids are checked in the kernel.
        unsafe { b.launch(cfg) }.map_err(driver_error("indexer launch"))?;
        Ok(())
    }

    fn top_k(&self, scores: &CudaSlice<f32>, spans: &[Span], k: usize, out: &mut CudaSlice<i32>) -> Result<()> {
        if k > 0 && !spans.is_empty() {
            check_len("out", spans.len() * k, out.len())?;
        }
        for (request, s) in spans.iter().enumerate() {
            if s.len < k {
                return Err(KernelError::TopKExceedsLength { request, top_k: k, seq_len: s.len });
            }
            if s.len > i32::MAX as usize {
                return Err(KernelError::invalid("spans.len", s.len, "positions must fit in an i32"));
            }
            if s.end() > scores.len() {
                return Err(hisparse_memory::MemoryError::OutOfBounds {
                    field: "scores",
                    start: s.offset,
                    end: s.end(),
                    len: scores.len(),
                }
                .into());
            }
        }
        if k == 0 || spans.is_empty() {
            return Ok(());
        }
        let n = spans.len();
        let host: Vec<GpuSpan> = spans.iter().map(|s| GpuSpan { offset: s.offset as u64, len: s.len as u64 }).collect();
        let mut sc = lock(&self.scratch)?;
        let Scratch { spans: sd, spans_c, .. } = &mut *sc;
        upload_cached(&self.dev, sd, spans_c, &host)?;
        let s = self.dev.stream();
        let cfg =
            LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: TOPK_SMEM as u32 };
        let k32 = k as u32;
        let mut b = s.launch_builder(&self.top_k);
        b.arg(scores).arg(&sc.spans).arg(&k32).arg(out);
        // SAFETY: every span lies within `scores` and `out` holds n * k positions (checked).
        unsafe { b.launch(cfg) }.map_err(driver_error("top-k launch"))?;
        Ok(())
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, CudaMemory>,
        out: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (heads, layout) = (batch.heads, batch.layout);
        let n = batch.selections.len();
        if heads == 0 {
            return Err(KernelError::invalid("heads", heads, "must be at least 1"));
        }
        if layout.d_latent() != 512 || layout.d_rope() != 64 {
            return Err(KernelError::invalid(
                "layout",
                format!("{}+{}", layout.d_latent(), layout.d_rope()),
                "the CUDA attention is built for 512 latent + 64 rope dims",
            ));
        }
        if !batch.softmax_scale.is_finite() {
            return Err(KernelError::invalid("softmax_scale", batch.softmax_scale, "must be finite"));
        }
        check_len("queries", n * heads * 576, batch.queries.len())?;
        check_len("out", n * heads * 512, out.len())?;
        check_len("lse", n * heads, lse.len())?;
        let rb = layout.row_bytes();
        if !batch.rows.len().is_multiple_of(rb) {
            return Err(KernelError::invalid("rows", batch.rows.len(), format!("not a multiple of the row size {rb}")));
        }
        let mut max_len = 0;
        for s in batch.selections {
            if s.end() > batch.locations.len() {
                return Err(hisparse_memory::MemoryError::OutOfBounds {
                    field: "locations",
                    start: s.offset,
                    end: s.end(),
                    len: batch.locations.len(),
                }
                .into());
            }
            max_len = max_len.max(s.len);
        }
        if n == 0 {
            return Ok(());
        }
        let groups = heads.div_ceil(HEAD_BLOCK);
        let splits = self.choose_splits(n * groups, max_len);
        let params = AttnParams {
            heads: heads as u32,
            row_bytes: rb as u32,
            fp8: u32::from(layout.format() == KvRowFormat::Fp8),
            splits: splits as u32,
            pool_rows: (batch.rows.len() / rb) as u64,
            scale_log2: batch.softmax_scale * std::f32::consts::LOG2_E,
            pad: 0,
        };
        let host: Vec<GpuSpan> =
            batch.selections.iter().map(|s| GpuSpan { offset: s.offset as u64, len: s.len as u64 }).collect();
        let mut sc = lock(&self.scratch)?;
        let Scratch { sels: sd, sels_c, .. } = &mut *sc;
        upload_cached(&self.dev, sd, sels_c, &host)?;
        let s = self.dev.stream();
        let cfg = LaunchConfig {
            grid_dim: (splits as u32, groups as u32, n as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: ATTN_SMEM as u32,
        };
        if splits > 1 {
            room(&self.dev, &mut sc.part_out, n * heads * splits * 512)?;
            room(&self.dev, &mut sc.part_lse, n * heads * splits)?;
        }
        let Scratch { fault, sels, part_out, part_lse, .. } = &mut *sc;
        let mut b = s.launch_builder(&self.attention);
        b.arg(batch.queries).arg(batch.rows).arg(batch.locations).arg(&*sels).arg(&params);
        if splits > 1 {
            b.arg(&mut *part_out).arg(&mut *part_lse);
        } else {
            b.arg(&mut *out).arg(&mut *lse);
        }
        b.arg(&mut *fault);
        // SAFETY: queries, out and lse hold n requests' heads (checked); selections lie within
        // `locations` (checked); locations are checked against the pool in the kernel; partials
        // hold n * heads * splits entries.
        unsafe { b.launch(cfg) }.map_err(driver_error("attention launch"))?;
        if splits > 1 {
            let cfg =
                LaunchConfig { grid_dim: ((n * heads) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
            let sp = splits as u32;
            let mut b = s.launch_builder(&self.merge);
            b.arg(&*part_out).arg(&*part_lse).arg(&sp).arg(out).arg(lse);
            // SAFETY: the partials were written for n * heads rows of `splits` each; out and lse
            // hold n * heads rows (checked).
            unsafe { b.launch(cfg) }.map_err(driver_error("merge launch"))?;
        }
        Ok(())
    }

    fn write_rows(&self, pool: &mut CudaSlice<u8>, row_bytes: usize, rows: &[u32], data: &[u8]) -> Result<()> {
        check_len("data", rows.len() * row_bytes, data.len())?;
        if row_bytes == 0 || !row_bytes.is_multiple_of(4) {
            return Err(KernelError::invalid("row_bytes", row_bytes, "must be a non-zero multiple of 4"));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        // One upload: the destination rows, then the data.
        let mut packed = Vec::with_capacity(4 * n + data.len());
        rows.iter().for_each(|r| packed.extend_from_slice(&r.to_le_bytes()));
        packed.extend_from_slice(data);
        let mut sc = lock(&self.scratch)?;
        room(&self.dev, &mut sc.rows_data, packed.len())?;
        let s = self.dev.stream();
        s.memcpy_htod(&packed, &mut sc.rows_data.slice_mut(..packed.len())).map_err(driver_error("row data"))?;
        let (n32, words, pool_rows) = (n as u32, (row_bytes / 4) as u32, (pool.len() / row_bytes) as u64);
        let Scratch { fault, rows_data, .. } = &mut *sc;
        // SAFETY: the packed buffer holds whole words (rows and data are multiples of 4 bytes).
        let words_view = unsafe { rows_data.transmute::<u32>(packed.len() / 4) }
            .ok_or_else(|| KernelError::invalid("data", data.len(), "cannot be viewed as words"))?;
        let pool_len = pool.len();
        // SAFETY: as above; the pool is viewed as whole words (rows checked in the kernel).
        let mut pool_words = unsafe { pool.transmute_mut::<u32>(pool_len / 4) }
            .ok_or_else(|| KernelError::invalid("pool", pool_len, "cannot be viewed as words"))?;
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(&self.write_rows);
        b.arg(&words_view).arg(&n32).arg(&words).arg(&pool_rows).arg(&mut pool_words).arg(fault);
        // SAFETY: n row indices then n rows of `words` words in the packed buffer; pool rows are
        // checked in the kernel.
        unsafe { b.launch(cfg) }.map_err(driver_error("write rows launch"))?;
        Ok(())
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
        if page_tokens == 0 {
            return Err(KernelError::invalid("page_tokens", page_tokens, "must be at least 1"));
        }
        if first_pages.len() != spans.len() {
            return Err(KernelError::invalid("first_pages", first_pages.len(), format!("{} spans", spans.len())));
        }
        let mut host = Vec::with_capacity(spans.len());
        for (i, (s, &first)) in spans.iter().zip(first_pages).enumerate() {
            if s.end() > selections.len() || s.end() > out.len() {
                return Err(KernelError::invalid("spans", i, "span leaves the selections or the output"));
            }
            if first > page_table.len() {
                return Err(KernelError::invalid("first_pages", first, format!("request {i}: past the page table")));
            }
            // Pages a request may use: up to the next request's first page (or the table's end).
            let next = first_pages.get(i + 1).copied().filter(|&f| f >= first).unwrap_or(page_table.len());
            host.push(LocateReq {
                sel_offset: s.offset as u64,
                sel_len: s.len as u64,
                first_page: first as u64,
                pages: (next.min(page_table.len()) - first) as u64,
            });
        }
        if spans.is_empty() {
            return Ok(());
        }
        let n = spans.len();
        let mut sc = lock(&self.scratch)?;
        let Scratch { locate: ld, locate_c, .. } = &mut *sc;
        upload_cached(&self.dev, ld, locate_c, &host)?;
        let s = self.dev.stream();
        let pt = page_tokens as u32;
        let Scratch { fault, locate, .. } = &mut *sc;
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(&self.locate_rows);
        b.arg(selections).arg(&*locate).arg(page_table).arg(&pt).arg(out).arg(fault);
        // SAFETY: spans lie within selections and out; page indices are checked in the kernel
        // against each request's share of the table (which lies within it).
        unsafe { b.launch(cfg) }.map_err(driver_error("locate rows launch"))?;
        Ok(())
    }

    fn fill_unit_bf16(&self, seeds: &[u64], len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        check_len("out", seeds.len() * len, out.len())?;
        if seeds.is_empty() || len == 0 {
            return Ok(());
        }
        let n = seeds.len();
        let mut sc = lock(&self.scratch)?;
        room(&self.dev, &mut sc.seeds, n)?;
        let s = self.dev.stream();
        s.memcpy_htod(seeds, &mut sc.seeds.slice_mut(..n)).map_err(driver_error("stream seeds"))?;
        let total = n * len.div_ceil(2);
        let blocks = total.div_ceil(256).min(8 * self.sms) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (segs, l32) =
            (n as u32, u32::try_from(len).map_err(|_| KernelError::invalid("len", len, "must fit 32 bits"))?);
        let (step, half) = (crate::unit_stream::STEP, crate::unit_stream::HALF_WIDTH);
        let mut b = s.launch_builder(&self.fill_unit);
        b.arg(&sc.seeds).arg(&segs).arg(&l32).arg(&step).arg(&half).arg(out);
        // SAFETY: `out` holds seeds.len() * len values (checked); the kernel writes no others.
        unsafe { b.launch(cfg) }.map_err(driver_error("fill launch"))?;
        Ok(())
    }

    fn prefers_device_selection(&self) -> bool {
        true
    }

    fn mark_stage(&self, stage: KernelStage, begin: bool) -> Result<()> {
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

    fn device_swap_in(
        &self,
        cfg: &crate::DeviceSwapInConfig,
        host: &mut hisparse_memory::HostTier,
    ) -> Result<Option<Self::SwapIn>> {
        super::swap_in_backend::CudaSwapIn::new(&self.dev, cfg, host).map(Some)
    }
}
