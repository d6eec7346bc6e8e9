//! `GpuSwapIn`: the swap-in on the GPU — one launch per layer for the whole batch, one block per
//! request — with its state (slot tables, policy records and scalars) kept in device memory,
//! making exactly the CPU swap-in's decisions (`hisparse_policy::SwapInState::step`).

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
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

    /// Copies a batch's requests to the device (once per step: every layer's launch reads them).
    pub fn upload_requests(&self, reqs: &[SwapReq]) -> Result<CudaSlice<SwapReq>> {
        self.stream.clone_htod(reqs).map_err(cuda("swap-in requests"))
    }

    /// What the swap-in's launches read besides their arguments (kernels, state buffers, policy
    /// seed, block size), for a launch print (`launch_graph.rs`).
    pub(super) fn state_words(&self) -> [u64; 8] {
        let s = &self.stream;
        use super::launch_graph::addr;
        [
            self.func.cu_function() as usize as u64,
            self.copy.cu_function() as usize as u64,
            addr(&self.slot_tokens, s),
            addr(&self.records, s),
            addr(&self.scalars, s),
            addr(&self.ready, s),
            self.policy.seed(),
            u64::from(self.block),
        ]
    }

    /// Launches the swap-in of `layer` for `reqs` (also on the device as `reqs_d`, from
    /// [`GpuSwapIn::upload_requests`]; selections and host pages too; `hot_rows` is this layer's
    /// hot-buffer pool), writing `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        layer: usize,
        reqs: &[SwapReq],
        reqs_d: &CudaSlice<SwapReq>,
        selections: &CudaView<'_, u32>,
        host_pages: &CudaSlice<u32>,
        host: (u64, usize, usize, usize),
        hot_rows: &mut CudaSlice<u8>,
        out: &mut SwapOutputs,
    ) -> Result<()> {
        let (host_base, pages_per_layer, row_bytes, page_tokens) = host;
        if layer >= self.layers {
            return Err(KernelError::invalid("layer", layer, format!("the swap-in holds {} layers", self.layers)));
        }
        if row_bytes == 0 || !row_bytes.is_multiple_of(16) {
            return Err(KernelError::invalid("row_bytes", row_bytes, "must be a non-zero multiple of 16"));
        }
        let selected: usize = reqs.iter().map(|r| r.sel_len as usize).sum();
        for (i, r) in reqs.iter().enumerate() {
            self.state_range(r.seat as usize)?;
            if r.sel_len as usize > self.max_sel
                || (r.sel_offset + r.sel_len) as usize > selections.len()
                || r.step == 0
                || r.seq_len == 0
            {
                return Err(KernelError::invalid("reqs", i, "selection out of range, too long, or step/seq_len 0"));
            }
        }
        if out.locations.len() < selected
            || out.counts.len() < 3 * reqs.len()
            || hot_rows.len() < self.seats * (self.slots + 1) * row_bytes
        {
            return Err(KernelError::invalid("out", selected, "output or hot-row buffers too small"));
        }
        if reqs.is_empty() {
            return Ok(());
        }
        if reqs_d.len() < reqs.len() {
            return Err(KernelError::invalid("reqs_d", reqs_d.len(), format!("{} requests on the host", reqs.len())));
        }
        let params = SwapParams {
            layer: layer as u32,
            layers: self.layers as u32,
            buffer_slots: self.slots as u32,
            row_bytes: row_bytes as u32,
            page_tokens: page_tokens as u32,
            host_pages_per_layer: pages_per_layer as u32,
            host_base,
            seed: self.policy.seed(),
        };
        let cfg = LaunchConfig {
            grid_dim: (reqs.len() as u32, 1, 1),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: Self::shared_bytes(self.slots, self.max_sel) as u32,
        };
        let mut b = self.stream.launch_builder(&self.func);
        b.arg(reqs_d)
            .arg(selections)
            .arg(&mut self.slot_tokens)
            .arg(&mut self.records)
            .arg(&mut self.scalars)
            .arg(&mut self.ready)
            .arg(host_pages)
            .arg(&mut *hot_rows)
            .arg(&mut out.locations)
            .arg(&mut out.counts)
            .arg(&mut out.miss_tokens)
            .arg(&mut out.miss_slots)
            .arg(&mut out.evicted)
            .arg(&params);
        // SAFETY: every buffer was checked above to hold what the kernel indexes: requests'
        // selections within `selections`, seats within the state arrays, hot rows for every
        // seat; host pages and the mapped host range are the caller's (a registered host tier).
        unsafe { b.launch(cfg) }.map_err(cuda("swap-in launch"))?;
        // The copies: enough blocks per request for about 4096 warps in all.
        let per_request = (4096 / (reqs.len() * 8)).clamp(1, 512) as u32;
        let cfg =
            LaunchConfig { grid_dim: (reqs.len() as u32, per_request, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.copy);
        b.arg(reqs_d)
            .arg(&out.counts)
            .arg(&out.miss_tokens)
            .arg(&out.miss_slots)
            .arg(host_pages)
            .arg(hot_rows)
            .arg(&params);
        // SAFETY: as for the swap-in: the miss lists were just written by it for these requests.
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
