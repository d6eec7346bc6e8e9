//! `GpuSwapIn`: the swap-in on the GPU — one launch per layer for the whole batch, one block per
//! request — with its state (slot tables, policy records and scalars) kept in device memory,
//! making exactly the CPU swap-in's decisions (`hisparse_policy::SwapInState::step`).
//!
//! Soundness: a launch reaches host memory only through a [`MappedHostTier`] (which keeps the
//! mapping registered), and only through a [`SwapBatch`] whose requests were validated on the
//! host when it was made; what only the device holds (selections, page ids) is checked by the
//! kernels, which read an out-of-range entry as nothing and raise the fault flag
//! ([`GpuSwapIn::take_fault`]).

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use hisparse_memory::cuda::MappedHostTier;
use hisparse_policy::{EvictionPolicy, PolicyScalars, SlotRecord};

use super::device::CudaDevice;
use super::policy::{GpuPolicyScalars, GpuSlotRecord};
use super::sources::KernelSource;
use crate::device_swap_in::DeviceSwapReq;
use crate::error::{KernelError, Result};

/// One request of a swap-in launch: the backend-neutral [`DeviceSwapReq`], which is laid out
/// as the kernel's `SwapReq`.
pub type SwapReq = DeviceSwapReq;

/// Where the host tier is, for the miss copies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwapParams {
    /// The layer of this launch.
    pub layer: u32,
    /// Layers of the state arrays.
    pub layers: u32,
    /// Regular slots per buffer.
    pub buffer_slots: u32,
    /// Bytes of a KV row (a multiple of 16).
    pub row_bytes: u32,
    /// Positions per host page.
    pub page_tokens: u32,
    /// Pages per layer region of the host tier.
    pub host_pages_per_layer: u32,
    /// Entries of the host-page list (`host_pages`) the kernels may read.
    pub host_pages_len: u32,
    /// Padding (zero).
    pub pad: u32,
    /// The host tier's mapped device address.
    pub host_base: u64,
    /// The policy's seed.
    pub seed: u64,
}

// SAFETY: #[repr(C)] structs of plain integers, laid out as the kernel's `SwapReq`/`SwapParams`.
unsafe impl DeviceRepr for DeviceSwapReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for DeviceSwapReq {}
// SAFETY: as above.
unsafe impl DeviceRepr for SwapParams {}

/// What a launch wrote (device buffers, sized for the batch's selections).
pub struct SwapOutputs {
    /// Hot-buffer row of every selected token (`seat * (B + 1) + slot`), selection order.
    pub locations: CudaSlice<i32>,
    /// Per request: hits, misses, evictions.
    pub counts: CudaSlice<u32>,
    /// Per request, from its `sel_offset`: the missed tokens, ascending.
    pub miss_tokens: CudaSlice<u32>,
    /// The slot each miss took.
    pub miss_slots: CudaSlice<u32>,
    /// The token evicted from that slot (-1: it was empty).
    pub evicted: CudaSlice<i32>,
}

impl SwapOutputs {
    /// Buffers for `requests` requests and `selected` selected tokens in all.
    pub fn new(stream: &Arc<CudaStream>, requests: usize, selected: usize) -> Result<Self> {
        let e = |x: cudarc::driver::DriverError| KernelError::Cuda {
            context: "swap-in outputs".into(),
            message: x.to_string(),
        };
        Ok(Self {
            locations: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            counts: stream.alloc_zeros(3 * requests.max(1)).map_err(e)?,
            miss_tokens: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            miss_slots: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            evicted: stream.alloc_zeros(selected.max(1)).map_err(e)?,
        })
    }
}

/// The source of the swap-in kernel with `policy`'s hooks, or `None` for a CPU-only policy.
pub fn swap_in_source(policy: &dyn EvictionPolicy) -> Option<KernelSource> {
    let code = super::sources::splice_policy(include_str!("../../kernels/swap_in.cu"), policy)?;
    Some(KernelSource {
        name: format!("swap_in_{}", policy.name()),
        code,
        kernels: &["swap_in", "copy_misses", "gather_rows"],
    })
}

fn cuda(context: &str) -> impl FnOnce(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Cuda { context: context.to_owned(), message: e.to_string() }
}

/// The GPU swap-in of one policy, with the state of `seats` hot buffers of `layers` layers.
pub struct GpuSwapIn {
    stream: Arc<CudaStream>,
    policy: Arc<dyn EvictionPolicy>,
    func: CudaFunction,
    copy: CudaFunction,
    seats: usize,
    layers: usize,
    slots: usize,
    block: u32,
    max_sel: usize,
    slot_tokens: CudaSlice<i32>,
    records: CudaSlice<GpuSlotRecord>,
    scalars: CudaSlice<GpuPolicyScalars>,
    ready: CudaSlice<u32>,
    fault: CudaSlice<u32>,
}

/// A batch's requests, validated against the swap-in that made them and copied to the device:
/// what a launch reads (host copy for checks and grids, device copy for the kernels, the same
/// requests by construction).
pub struct SwapBatch {
    reqs: Vec<SwapReq>,
    dev: CudaSlice<SwapReq>,
    /// One past the last selection entry any request reads (`max(sel_offset + sel_len)`).
    sel_end: usize,
}

impl SwapBatch {
    /// The requests.
    pub fn requests(&self) -> &[SwapReq] {
        &self.reqs
    }

    /// One past the last selection entry the batch reads.
    pub fn selection_end(&self) -> usize {
        self.sel_end
    }

    /// The device copy (its address stays while the batch is updated in place).
    pub fn device(&self) -> &CudaSlice<SwapReq> {
        &self.dev
    }
}

impl GpuSwapIn {
    /// Compiles (once per device) and sets up the swap-in for `policy`: `seats` buffers of
    /// `buffer_slots` regular slots in `layers` layers, `block_size` threads per request
    /// (rounded up to a multiple of 32), at most `max_sel` selected tokens per request.
    pub fn new(
        dev: &CudaDevice,
        policy: Arc<dyn EvictionPolicy>,
        seats: usize,
        layers: usize,
        buffer_slots: usize,
        block_size: usize,
        max_sel: usize,
    ) -> Result<Self> {
        let name = format!("swap_in_{}", policy.name());
        if policy.cuda().is_none() {
            return Err(KernelError::invalid("eviction_policy", policy.name(), "has no GPU form"));
        }
        if !(1..=1024).contains(&block_size) {
            return Err(KernelError::invalid("swap_in_block_size", block_size, "must be in 1..=1024"));
        }
        if max_sel > buffer_slots + 1 || buffer_slots == 0 || seats == 0 || layers == 0 {
            return Err(KernelError::invalid(
                "buffer_slots",
                buffer_slots,
                "need seats, layers and buffer slots, and at most buffer_slots + 1 selected tokens",
            ));
        }
        let func = dev.function_of(&name, "swap_in", || swap_in_source(policy.as_ref()))?;
        let copy = dev.function_of(&name, "copy_misses", || swap_in_source(policy.as_ref()))?;
        let smem = Self::shared_bytes(buffer_slots, max_sel);
        func.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(cuda("shared memory opt-in"))?;
        let s = dev.stream().clone();
        let n = seats * layers;
        let slot_tokens = s.clone_htod(&vec![-1i32; n * buffer_slots]).map_err(cuda("slot tables"))?;
        Ok(Self {
            records: s.alloc_zeros(n * buffer_slots).map_err(cuda("records"))?,
            scalars: s.alloc_zeros(n).map_err(cuda("scalars"))?,
            ready: s.alloc_zeros(n).map_err(cuda("ready flags"))?,
            fault: s.alloc_zeros(1).map_err(cuda("fault flag"))?,
            slot_tokens,
            stream: s,
            policy,
            func,
            copy,
            seats,
            layers,
            slots: buffer_slots,
            block: block_size.div_ceil(32) as u32 * 32,
            max_sel,
        })
    }

    fn shared_bytes(b: usize, k: usize) -> usize {
        ((4 * k + 15) & !15) + 8 * b + 4 * k + b + k
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<dyn EvictionPolicy> {
        &self.policy
    }

    fn state_range(&self, seat: usize) -> Result<std::ops::Range<usize>> {
        if seat >= self.seats {
            return Err(KernelError::invalid("seat", seat, format!("there are {} seats", self.seats)));
        }
        Ok(seat * self.layers..(seat + 1) * self.layers)
    }

    /// Empties `seat` in every layer (a new request), optionally with tokens `0..preload` in
    /// slots `0..preload` (a prompt that fits its buffer).
    pub fn reset_seat(&mut self, seat: usize, preload: usize) -> Result<()> {
        let r = self.state_range(seat)?;
        if preload > self.slots {
            return Err(KernelError::invalid("preload", preload, format!("the buffer has {} slots", self.slots)));
        }
        let table: Vec<i32> = (0..self.slots).map(|s| if s < preload { s as i32 } else { -1 }).collect();
        let all: Vec<i32> = table.iter().copied().cycle().take(self.layers * self.slots).collect();
        let b = self.slots;
        self.stream
            .memcpy_htod(&all, &mut self.slot_tokens.slice_mut(r.start * b..r.end * b))
            .map_err(cuda("reset slot tables"))?;
        self.stream
            .memcpy_htod(&vec![0u32; self.layers], &mut self.ready.slice_mut(r))
            .map_err(cuda("reset ready flags"))?;
        Ok(())
    }

    /// Forgets every buffer's policy records (after a policy change the records are rebuilt).
    pub fn reset_policy(&mut self, policy: Arc<dyn EvictionPolicy>, dev: &CudaDevice) -> Result<()> {
        let name = format!("swap_in_{}", policy.name());
        self.func = dev.function_of(&name, "swap_in", || swap_in_source(policy.as_ref()))?;
        self.copy = dev.function_of(&name, "copy_misses", || swap_in_source(policy.as_ref()))?;
        self.func
            .set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                Self::shared_bytes(self.slots, self.max_sel) as i32,
            )
            .map_err(cuda("shared memory opt-in"))?;
        self.policy = policy;
        self.stream.memset_zeros(&mut self.ready).map_err(cuda("reset ready flags"))
    }

    /// Checks `reqs` against this swap-in (seats, selection lengths, offsets with checked
    /// arithmetic); returns one past the last selection entry they read.
    fn validate(&self, reqs: &[SwapReq]) -> Result<usize> {
        let mut sel_end = 0usize;
        for (i, r) in reqs.iter().enumerate() {
            self.state_range(r.seat as usize)?;
            let bad = |reason: &str| Err(KernelError::invalid("reqs", i, reason.to_owned()));
            if r.step == 0 || r.seq_len == 0 {
                return bad("step and seq_len must be at least 1");
            }
            if r.sel_len as usize > self.max_sel || r.sel_len > r.seq_len {
                return bad("more selected tokens than the buffer or the sequence holds");
            }
            let Some(end) = r.sel_offset.checked_add(r.sel_len) else {
                return bad("sel_offset + sel_len overflows");
            };
            sel_end = sel_end.max(end as usize);
        }
        Ok(sel_end)
    }

    /// Validates a batch's requests and copies them to the device (once per step: every
    /// layer's launch reads them).
    pub fn upload_requests(&self, reqs: &[SwapReq]) -> Result<SwapBatch> {
        let sel_end = self.validate(reqs)?;
        let mut padded = reqs.to_vec();
        padded.resize(reqs.len().max(1), SwapReq::default());
        let dev = self.stream.clone_htod(&padded).map_err(cuda("swap-in requests"))?;
        Ok(SwapBatch { reqs: reqs.to_vec(), dev, sel_end })
    }

    /// Replaces `batch`'s requests with `reqs` (validated), in place while they fit its device
    /// buffer (so that a captured launch sequence still reads them there), else in a new one
    /// with room to grow.
    pub fn update_requests(&self, batch: &mut SwapBatch, reqs: &[SwapReq]) -> Result<()> {
        let sel_end = self.validate(reqs)?;
        if batch.dev.len() >= reqs.len() {
            if !reqs.is_empty() {
                self.stream
                    .memcpy_htod(reqs, &mut batch.dev.slice_mut(..reqs.len()))
                    .map_err(cuda("swap-in requests"))?;
            }
        } else {
            let mut padded = reqs.to_vec();
            padded.resize(reqs.len().next_power_of_two(), SwapReq::default());
            batch.dev = self.stream.clone_htod(&padded).map_err(cuda("swap-in requests"))?;
        }
        batch.reqs.clear();
        batch.reqs.extend_from_slice(reqs);
        batch.sel_end = sel_end;
        Ok(())
    }

    /// Whether a kernel met an out-of-range selection or page id since the last call (reads the
    /// flag, waiting for the stream, and clears it).
    pub fn take_fault(&mut self) -> Result<bool> {
        let mut f = [0u32];
        self.stream.memcpy_dtoh(&self.fault, &mut f).map_err(cuda("fault flag"))?;
        self.stream.synchronize().map_err(cuda("synchronize"))?;
        if f[0] != 0 {
            self.stream.memset_zeros(&mut self.fault).map_err(cuda("fault flag"))?;
        }
        Ok(f[0] != 0)
    }

    /// What the swap-in's launches read besides their arguments (kernels, state buffers, policy
    /// seed, block size), for a launch print (`launch_graph.rs`).
    pub(super) fn state_words(&self) -> [u64; 9] {
        let s = &self.stream;
        use super::launch_graph::addr;
        [
            self.func.cu_function() as usize as u64,
            self.copy.cu_function() as usize as u64,
            addr(&self.slot_tokens, s),
            addr(&self.records, s),
            addr(&self.scalars, s),
            addr(&self.ready, s),
            addr(&self.fault, s),
            self.policy.seed(),
            u64::from(self.block),
        ]
    }

    /// Launches the swap-in of `layer` for `batch` (from [`GpuSwapIn::upload_requests`]):
    /// `selections` hold each request's positions from its `sel_offset`; `host_pages` its host
    /// page ids from its `page_offset`; missed rows are read from `host` into `hot_rows`, this
    /// layer's hot-buffer pool; decisions go to `out`. Every size is checked here; a selection
    /// or page id the device holds out of range is skipped by the kernels and raises the fault
    /// flag.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        layer: usize,
        batch: &SwapBatch,
        selections: &CudaView<'_, u32>,
        host_pages: &CudaSlice<u32>,
        host: &MappedHostTier,
        hot_rows: &mut CudaSlice<u8>,
        out: &mut SwapOutputs,
    ) -> Result<()> {
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
        }
        let sel_end = batch.selection_end();
        let hot_need = self.seats.checked_mul(self.slots + 1).and_then(|n| n.checked_mul(row_bytes));
        if sel_end > selections.len() {
            return Err(KernelError::invalid("selections", selections.len(), format!("the batch reads {sel_end}")));
        }
        if [out.locations.len(), out.miss_tokens.len(), out.miss_slots.len(), out.evicted.len()]
            .iter()
            .any(|&n| n < sel_end)
            || out.counts.len() < 3 * reqs.len()
            || hot_need.is_none_or(|n| hot_rows.len() < n)
        {
            return Err(KernelError::invalid("out", sel_end, "output or hot-row buffers too small"));
        }
        if reqs.is_empty() {
            return Ok(());
        }
        let u32_of = |field: &'static str, v: usize| {
            u32::try_from(v).map_err(|_| KernelError::invalid(field, v, "does not fit the kernel's 32-bit field"))
        };
        let params = SwapParams {
            layer: u32_of("layer", layer)?,
            layers: u32_of("layers", self.layers)?,
            buffer_slots: u32_of("buffer_slots", self.slots)?,
            row_bytes: u32_of("row_bytes", row_bytes)?,
            page_tokens: u32_of("page_tokens", lay.page_tokens)?,
            host_pages_per_layer: u32_of("host pages per layer", lay.pages_per_layer)?,
            host_pages_len: pages_len,
            pad: 0,
            host_base: host.device_ptr(),
            seed: self.policy.seed(),
        };
        let grid = u32_of("requests", reqs.len())?;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: Self::shared_bytes(self.slots, self.max_sel) as u32,
        };
        let mut b = self.stream.launch_builder(&self.func);
        b.arg(batch.device())
            .arg(selections)
            .arg(&mut self.slot_tokens)
            .arg(&mut self.records)
            .arg(&mut self.scalars)
            .arg(&mut self.ready)
            .arg(&mut *hot_rows)
            .arg(&mut out.locations)
            .arg(&mut out.counts)
            .arg(&mut out.miss_tokens)
            .arg(&mut out.miss_slots)
            .arg(&mut out.evicted)
            .arg(&mut self.fault)
            .arg(&params);
        // SAFETY: the batch was validated against this swap-in when made (seats within the state
        // arrays, selection ranges within `sel_end`), and every buffer was checked above to hold
        // what the kernel indexes; selections out of range are skipped by the kernel (fault).
        unsafe { b.launch(cfg) }.map_err(cuda("swap-in launch"))?;
        // The copies: enough blocks per request for about 4096 warps in all.
        let per_request = (4096 / (reqs.len() * 8)).clamp(1, 512) as u32;
        let cfg = LaunchConfig { grid_dim: (grid, per_request, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.copy);
        b.arg(batch.device())
            .arg(&out.counts)
            .arg(&out.miss_tokens)
            .arg(&out.miss_slots)
            .arg(host_pages)
            .arg(hot_rows)
            .arg(&mut self.fault)
            .arg(&params);
        // SAFETY: as for the swap-in: the miss lists were just written by it for these requests;
        // host rows are reached only through `host` (registered and alive while it is), at page
        // ids the kernel checks against `host_pages_len` and the layout (fault otherwise).
        unsafe { b.launch(cfg) }.map_err(cuda("copy misses launch"))?;
        Ok(())
    }

    /// The state of `(seat, layer)`: slot → token (-1 empty), records, scalars (for tests).
    pub fn read_state(&self, seat: usize, layer: usize) -> Result<(Vec<i32>, Vec<SlotRecord>, PolicyScalars)> {
        let r = self.state_range(seat)?;
        let st = r.start + layer;
        let b = self.slots;
        let mut t = vec![0i32; b];
        self.stream
            .memcpy_dtoh(&self.slot_tokens.slice(st * b..(st + 1) * b), &mut t)
            .map_err(cuda("read slot table"))?;
        let mut rec = vec![GpuSlotRecord::default(); b];
        self.stream.memcpy_dtoh(&self.records.slice(st * b..(st + 1) * b), &mut rec).map_err(cuda("read records"))?;
        let mut sc = vec![GpuPolicyScalars::default(); 1];
        self.stream.memcpy_dtoh(&self.scalars.slice(st..st + 1), &mut sc).map_err(cuda("read scalars"))?;
        self.stream.synchronize().map_err(cuda("synchronize"))?;
        Ok((t, rec.into_iter().map(|x| x.0).collect(), sc[0].0))
    }
}
