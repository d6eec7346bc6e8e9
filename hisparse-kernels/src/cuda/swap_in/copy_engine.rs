//! The copy-engine staging path of `miss_fill = "copy-engine"`: per layer, after the locate (its
//! fill words naming each miss's host-tier row), on the main stream — `gather_misses` without
//! staging lists the misses (their selection indices on the device; their host rows, the spans
//! and the request count in mapped pinned memory); a host function ([`HostGather`], a node of the
//! step's graph) gathers the listed rows, in order, from the host tier into a contiguous pinned
//! landing buffer with a thread pool; the copy engine copies that buffer to the device
//! (`cuMemcpyHtoDAsync`, a fixed `landing_rows` rows: a graph's copy has one size); and
//! `scatter_landed_misses` puts each miss into the layer's staging row at its selection index —
//! from the landed rows, or, past `landing_rows`, straight from the mapped host tier — and
//! rewrites its fill word as `deferred-gather`'s locate would have. From there on the step is
//! `deferred-gather`'s: the attention reads the staging rows, the deferred swap-in copies them
//! into their slots. The rows and so the outputs are bit-identical to it.
//!
//! Invariant: the mapped lists, the pinned landing rows and the device landing rows are written
//! and read only by this layer's four operations, in order on the main stream, so the next
//! layer's list cannot overwrite what this layer's host function reads, nor its host function
//! the landing rows before this layer's copy has read them; the host function reads nothing
//! else that changes within a step. Its [`HostGather`] and the buffers are freed only after
//! waiting for the stream ([`CopyEngineStaging::reserve`] when it grows, and drop), so nothing
//! queued outlives what it reads.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaViewMut, LaunchConfig};
use hisparse_memory::host_tier::MappedHostTier;
use rayon::prelude::*;

use super::io::{LayerLaunch, MissSource};
use super::pinned_host::{PinnedHost, check};
use super::state::GpuSwapInState;
use crate::cuda::driver_error;
use crate::cuda::printed_launch::{PrintedLaunch, addr};
use crate::error::{KernelError, Result};

/// Misses per block of `scatter_landed_misses`, and positions per block of `gather_misses`.
use super::facts::{GATHER_THREADS, LOCATE_CHUNK as CHUNK};
/// Bytes of the mapped lists' header (the request count, padded to a span's alignment).
const HEADER_BYTES: usize = 16;
/// Rows a host gather copies on the driver's callback thread itself, and the fewest a pool
/// thread takes.
const INLINE_ROWS: usize = 256;
/// Bytes of a span (`MissSpan`: offset and length, two u64s).
const SPAN_BYTES: usize = 16;

/// What the host function of a layer reads and writes: the mapped lists (header, spans, host
/// rows), the pinned landing rows and the host tier, with their capacities.
struct HostGather {
    tier: MappedHostTier,
    lists: Arc<PinnedHost>,
    landing: Arc<PinnedHost>,
    spans_cap: usize,
    rows_cap: usize,
    landing_rows: usize,
    pool: Arc<rayon::ThreadPool>,
    /// Set when a list the device wrote was out of its bounds or a row could not be read.
    fault: AtomicBool,
    /// Rows the host gathered, and rows left to the scatter's own host reads, since last taken.
    landed: AtomicU64,
    overflow: AtomicU64,
}

impl HostGather {
    fn run(&self) -> Result<()> {
        let rb = self.tier.layout().row_bytes;
        let lists_need = HEADER_BYTES + self.spans_cap * SPAN_BYTES + self.rows_cap * 4;
        if lists_need > self.lists.len || self.landing_rows * rb > self.landing.len {
            return Err(KernelError::invalid("landing rows", self.landing_rows, "more than the pinned buffers hold"));
        }
        let base = self.lists.ptr;
        // The reads below: the lists buffer holds HEADER_BYTES + spans_cap spans + rows_cap u32s
        // (`CopyEngineStaging::reserve`, checked above), all written by the layer's
        // `gather_misses`, which the stream finished before this function runs; nothing writes
        // them until it returns (the module's invariant).
        // SAFETY: the header's first word, as above.
        let n = unsafe { std::ptr::read_volatile(base.cast::<u32>()) } as usize;
        if n > self.spans_cap {
            return Err(KernelError::invalid("requests", n, "more than the copy-engine lists hold"));
        }
        // SAFETY: as above; spans are (u64, u64) at a 16-byte aligned offset.
        let spans = unsafe { std::slice::from_raw_parts(base.add(HEADER_BYTES).cast::<[u64; 2]>(), n) };
        // SAFETY: as above; the rows follow the spans' capacity, 4-byte aligned.
        let rows = unsafe {
            std::slice::from_raw_parts(
                base.add(HEADER_BYTES + self.spans_cap * SPAN_BYTES).cast::<u32>(),
                self.rows_cap,
            )
        };
        let mut total = 0usize;
        for &[off, len] in spans {
            let end = off.checked_add(len).filter(|&e| e <= self.rows_cap as u64);
            if end.is_none() {
                return Err(KernelError::invalid("spans", off, "a span past the copy-engine lists"));
            }
            total += len as usize;
        }
        let landed = total.min(self.landing_rows);
        // SAFETY: the landing buffer holds landing_rows rows of rb bytes (`reserve`); only this
        // function touches it until the copy that follows it on the stream.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.landing.ptr, landed * rb) };
        // Few rows are gathered on this thread: waking the pool's costs more than they do.
        let per_task = landed.div_ceil(self.pool.current_num_threads().max(1)).max(INLINE_ROWS);
        let gather = |(t, chunk): (usize, &mut [u8])| {
            let at = ListEntries::new(spans, t * per_task);
            for (row_dst, i) in chunk.chunks_exact_mut(rb).zip(at) {
                let row = rows[i];
                // ~0u: a fill word past the tier, which raised the device's fault flag.
                if row != u32::MAX {
                    self.tier.read_row(u64::from(row), row_dst)?;
                }
            }
            Ok::<(), KernelError>(())
        };
        if landed <= INLINE_ROWS {
            dst.chunks_mut(per_task * rb).enumerate().try_for_each(gather)?;
        } else {
            self.pool.install(|| dst.par_chunks_mut(per_task * rb).enumerate().try_for_each(gather))?;
        }
        self.landed.fetch_add(landed as u64, Ordering::Relaxed);
        self.overflow.fetch_add((total - landed) as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// The list entries of the misses from ordinal `ord` on, in ordinal order: a request's misses
/// `q = 0..len` of span `[offset, len]` are at list entries `offset + q` and take the ordinals
/// after those of the requests before it (as `scatter_landed_misses` numbers them).
struct ListEntries<'a> {
    spans: &'a [[u64; 2]],
    /// The request of the next ordinal, and the ordinal its misses start at.
    x: usize,
    start: usize,
    ord: usize,
}

impl<'a> ListEntries<'a> {
    fn new(spans: &'a [[u64; 2]], ord: usize) -> Self {
        Self { spans, x: 0, start: 0, ord }
    }
}

impl Iterator for ListEntries<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while let Some(&[_, len]) = self.spans.get(self.x) {
            if self.start + len as usize > self.ord {
                break;
            }
            self.start += len as usize;
            self.x += 1;
        }
        let &[off, _] = self.spans.get(self.x)?;
        let i = off as usize + (self.ord - self.start);
        self.ord += 1;
        Some(i)
    }
}

/// The host function: runs [`HostGather::run`], recording any error or panic as a fault.
///
/// # Safety
///
/// `user` points to a live [`HostGather`].
unsafe extern "C" fn host_gather(user: *mut c_void) {
    // SAFETY: the caller's contract; the job outlives every stream operation naming it.
    let job = unsafe { &*user.cast::<HostGather>() };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run()));
    if !matches!(r, Ok(Ok(()))) {
        job.fault.store(true, Ordering::Release);
    }
}

/// The buffers and the host gather of the copy-engine path: see the module documentation.
pub struct CopyEngineStaging {
    ctx: Arc<CudaContext>,
    /// The stream its operations are ordered on (waited for before its buffers are freed).
    stream: Arc<CudaStream>,
    tier: MappedHostTier,
    pool: Arc<rayon::ThreadPool>,
    /// Of a step's selection entries, the share the landing rows hold.
    share: f64,
    job: Option<Box<HostGather>>,
    landing_dev: CudaSlice<u8>,
    list: CudaSlice<i32>,
}

impl CopyEngineStaging {
    /// A path over `tier` gathering with `threads` host threads into landing rows for `share` of
    /// a step's selection entries.
    pub fn new(main: &Arc<CudaStream>, tier: &MappedHostTier, share: f64, threads: usize) -> Result<Self> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(KernelError::invalid("copy_engine_share", share, "must be in (0, 1]"));
        }
        if tier.layout().rows() > u64::from(u32::MAX) {
            return Err(KernelError::invalid("host tier rows", tier.layout().rows(), "more than the host lists' u32"));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("hisparse-host-gather-{i}"))
            .build()
            .map_err(|e| KernelError::invalid("host_gather_threads", threads, e.to_string()))?;
        Ok(Self {
            ctx: Arc::clone(main.context()),
            stream: Arc::clone(main),
            tier: tier.clone(),
            pool: Arc::new(pool),
            share,
            job: None,
            landing_dev: main.alloc_zeros(16).map_err(driver_error("landing rows"))?,
            list: main.alloc_zeros(1).map_err(driver_error("miss list"))?,
        })
    }

    /// Room for `requests` requests and `sel_end` selection entries (grows only, between
    /// steps; when it grows it first waits for the stream, so that no pending host function or
    /// copy still reads the buffers it frees).
    pub fn reserve(&mut self, main: &Arc<CudaStream>, requests: usize, sel_end: usize) -> Result<()> {
        let fits = self.job.as_ref().is_some_and(|j| j.spans_cap >= requests && j.rows_cap >= sel_end);
        if fits {
            return Ok(());
        }
        if self.job.is_some() {
            self.stream.synchronize().map_err(driver_error("synchronize before the staging grows"))?;
        }
        let (spans_cap, rows_cap) = (requests.next_power_of_two().max(1), sel_end.next_power_of_two().max(1));
        let landing_rows = ((rows_cap as f64 * self.share).ceil() as usize).div_ceil(64) * 64;
        let landing_rows = landing_rows.clamp(64, rows_cap.max(64));
        let rb = self.tier.layout().row_bytes;
        let over = || KernelError::invalid("selections", sel_end, "copy-engine staging overflows");
        let list_bytes = spans_cap
            .checked_mul(SPAN_BYTES)
            .and_then(|s| rows_cap.checked_mul(4).and_then(|r| r.checked_add(s)))
            .and_then(|b| b.checked_add(HEADER_BYTES))
            .ok_or_else(over)?;
        let landing_bytes = landing_rows.checked_mul(rb).ok_or_else(over)?;
        let lists = Arc::new(PinnedHost::new(&self.ctx, list_bytes)?);
        let landing = Arc::new(PinnedHost::new(&self.ctx, landing_bytes)?);
        self.landing_dev = main.alloc_zeros(landing_bytes).map_err(driver_error("landing rows"))?;
        self.list = main.alloc_zeros(rows_cap).map_err(driver_error("miss list"))?;
        let (landed, overflow) = self
            .job
            .as_ref()
            .map_or((0, 0), |j| (j.landed.load(Ordering::Relaxed), j.overflow.load(Ordering::Relaxed)));
        self.job = Some(Box::new(HostGather {
            tier: self.tier.clone(),
            lists,
            landing,
            spans_cap,
            rows_cap,
            landing_rows,
            pool: Arc::clone(&self.pool),
            fault: AtomicBool::new(self.job.as_ref().is_some_and(|j| j.fault.load(Ordering::Acquire))),
            landed: AtomicU64::new(landed),
            overflow: AtomicU64::new(overflow),
        }));
        Ok(())
    }

    /// Brings `layer`'s misses (named by the locate's `fills`) into `staging` through the host
    /// and the copy engine, on `main`, and rewrites their fill words to name their staging rows.
    pub fn stage(
        &mut self,
        gpu: &mut GpuSwapInState,
        at: LayerLaunch<'_>,
        src: MissSource<'_>,
        fills: &mut CudaSlice<u64>,
        staging: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        let LayerLaunch { stream: main, layer, batch } = at;

        if main.cu_stream() != self.stream.cu_stream() {
            return Err(KernelError::invalid("stream", "another", "stage on the stream the path was made with"));
        }
        let params = gpu.checked_params(layer, batch, fills.len(), None, src)?;
        let sel_end = batch.selection_end();
        let reqs = batch.requests();
        let job =
            self.job.as_ref().ok_or_else(|| KernelError::invalid("reserve", "missing", "stage before reserve"))?;
        let rows_need = sel_end.checked_mul(params.row_bytes as usize);
        if rows_need.is_none_or(|b| staging.len() < b)
            || job.rows_cap < sel_end
            || self.list.len() < sel_end
            || job.spans_cap < reqs.len()
            || fills.len() < sel_end
        {
            return Err(KernelError::invalid(
                "staging",
                staging.len(),
                format!("{sel_end} rows of {} bytes, list entries and {} spans", params.row_bytes, reqs.len()),
            ));
        }
        let longest = reqs.iter().map(|r| r.sel_len as usize).max().unwrap_or(0);
        if reqs.is_empty() || longest == 0 {
            return Ok(());
        }
        let grid = (reqs.len() as u32, longest.div_ceil(CHUNK) as u32, 1);
        let lists = job.lists.device_ptr;
        let (header, spans) = (lists, lists + HEADER_BYTES as u64);
        let rows = spans + (job.spans_cap * SPAN_BYTES) as u64;
        let null = 0u64;
        {
            let GpuSwapInState { print, funcs, fault, .. } = &mut *gpu;
            let cfg = LaunchConfig { grid_dim: grid, block_dim: (GATHER_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut b = PrintedLaunch::new(print, main, &funcs.gather);
            b.arg(batch.device()).arg(&*fills).arg(&null).arg_mut(&mut self.list).arg(&spans);
            b.arg(&rows).arg(&header).arg_mut(fault).params(&params);
            // SAFETY: the batch was validated against this swap-in (selection ranges within
            // `sel_end`, which `fills` and the list cover, checked); the mapped lists hold
            // `spans_cap` spans and `rows_cap` rows (at least the batch's requests and
            // `sel_end`, checked) after a 16-byte header; no staging (null): nothing is copied.
            unsafe { b.launch(cfg) }.map_err(driver_error("copy-engine miss list"))?;
        }
        let job_ptr: *const HostGather = &**job;
        gpu.print.fold(&[0x4057_9a7e, job_ptr as u64, job.landing.device_ptr, job.landing_rows as u64]);
        // SAFETY: `host_gather` reads the job as `HostGather`; the job lives in `self.job`, which
        // is replaced only between steps, after the stream has run every host function of the
        // steps before (the step's end synchronises).
        check(
            // SAFETY: as above.
            unsafe { sys::cuLaunchHostFunc(main.cu_stream(), Some(host_gather), job_ptr.cast_mut().cast()) },
            "cuLaunchHostFunc (copy-engine gather)",
        )?;
        let bytes = job.landing_rows * params.row_bytes as usize;
        let dst = addr(&self.landing_dev, main);
        gpu.print.copy(job.landing.device_ptr, dst, bytes as u64);
        // SAFETY: `dst` is `landing_dev`, of landing_rows * row_bytes bytes (`reserve`); the
        // source is the pinned landing buffer of the same size; the host function before it on
        // the stream wrote it, and the next layer's writes it only after this copy.
        check(
            // SAFETY: as above.
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, job.landing.ptr.cast(), bytes, main.cu_stream()) },
            "cuMemcpyHtoDAsync (copy-engine rows)",
        )?;
        let landing_rows = job.landing_rows as u32;
        let sel_end_u =
            u32::try_from(sel_end).map_err(|_| KernelError::invalid("selections", sel_end, "above 2^32"))?;
        let GpuSwapInState { print, funcs, fault, .. } = &mut *gpu;
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = PrintedLaunch::new(print, main, &funcs.scatter_landed);
        b.arg(&spans).arg(&self.list).arg_mut(fills).arg(&self.landing_dev).arg_mut(staging).arg_mut(fault);
        b.params(&params).arg(&landing_rows).arg(&sel_end_u);
        // SAFETY: the spans (mapped, `spans_cap` of them) and the list were written by the
        // gather above; the kernel checks every span and list entry against `sel_end`, which
        // `fills` and the staging rows cover (checked), reads at most `landing_rows` landed rows
        // (the buffer's size), and reads the host tier only at fill words below its rows.
        unsafe { b.launch(cfg) }.map_err(driver_error("copy-engine scatter"))?;
        Ok(())
    }

    /// Whether a host gather failed since the last call (which clears it).
    pub fn take_fault(&self) -> bool {
        self.job.as_ref().is_some_and(|j| j.fault.swap(false, Ordering::AcqRel))
    }

    /// Rows the host gathered and rows left to the scatter's host reads since the last call.
    pub fn take_rows(&self) -> (u64, u64) {
        self.job
            .as_ref()
            .map_or((0, 0), |j| (j.landed.swap(0, Ordering::Relaxed), j.overflow.swap(0, Ordering::Relaxed)))
    }
}

impl Drop for CopyEngineStaging {
    /// Waits for the stream, so that no host function or copy it queued outlives the job and
    /// the buffers they read.
    fn drop(&mut self) {
        if self.job.is_some() {
            let _ = self.stream.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ListEntries;

    #[test]
    fn list_entries_follow_the_scatters_ordinals_from_any_start() {
        // Requests with misses, without, and spans not packed (as per-request lists are).
        let spans = [[0u64, 3], [10, 0], [10, 2], [40, 0], [64, 5], [100, 1]];
        let flat: Vec<usize> = spans.iter().flat_map(|&[off, len]| (off..off + len).map(|i| i as usize)).collect();
        assert_eq!(flat.len(), 11);
        for start in 0..=flat.len() + 2 {
            let got: Vec<usize> = ListEntries::new(&spans, start).collect();
            assert_eq!(got, flat.get(start..).unwrap_or(&[]), "from ordinal {start}");
        }
        assert_eq!(ListEntries::new(&[], 0).next(), None);
    }
}
