//! `GpuSwapInState`: the swap-in on the GPU — per layer, for the whole batch, a decision launch (one
//! block per request) and a copy launch, or for small batches one launch doing both — with its state (slot tables, policy records and scalars) kept in device memory,
//! making exactly the CPU swap-in's decisions (`hisparse_policy::SwapInState::step`).
//!
//! Soundness: a launch reaches host memory only through a [`MappedHostTier`] (which keeps the
//! mapping registered), and only through a [`SwapBatch`] whose requests were validated on the
//! host when it was made; what only the device holds (selections, page ids) is checked by the
//! kernels, which read an out-of-range entry as nothing and raise the fault flag
//! ([`GpuSwapInState::take_fault`]).

use crate::cuda::driver_error;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use hisparse_policy::{EvictionPolicy, PolicyScalars, SlotRecord};

use super::module::{FUSED_MAX_REQUESTS, MAX_SHARED_BYTES, SwapFunctions};
use super::policy::{GpuPolicyScalars, GpuSlotRecord};
use crate::cuda::device::CudaDevice;
use crate::error::{KernelError, Result};
use crate::swap_in::{DeviceSwapReq, SWAP_COUNTS};
use hisparse_memory::device_tier::hot_buffer_rows_of;

/// One request of a swap-in launch: the backend-neutral [`DeviceSwapReq`], which is laid out
/// as the kernel's `SwapReq`.
pub type SwapReq = DeviceSwapReq;
pub use super::args::SwapParams;

/// What a launch wrote (device buffers, sized for the batch's selections).
pub struct SwapOutputs {
    /// Hot-buffer row of every selected token (`seat * (B + 1) + slot`), selection order.
    pub locations: CudaSlice<i32>,
    /// Per request, [`SWAP_COUNTS`] words: hits, misses, evictions, useful and wasted prefetches.
    pub counts: CudaSlice<u32>,
    /// Per request, from its `sel_offset`: the missed tokens, ascending.
    pub miss_tokens: CudaSlice<u32>,
    /// The slot each miss took.
    pub miss_slots: CudaSlice<u32>,
    /// The token evicted from that slot (-1: it was empty).
    pub evicted: CudaSlice<i32>,
    /// Per selected token, written only by a swap-in that leaves its misses to the attention
    /// ([`GpuSwapInState::set_fill_in_attention`]): 0 for a row in the hot buffer, else the missed
    /// row's host-tier row plus one.
    pub fills: CudaSlice<u64>,
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
            counts: stream.alloc_zeros(SWAP_COUNTS * requests.max(1)).map_err(e)?,
            miss_tokens: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            miss_slots: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            evicted: stream.alloc_zeros(selected.max(1)).map_err(e)?,
            fills: stream.alloc_zeros(selected.max(1)).map_err(e)?,
        })
    }
}

/// The shape of a [`GpuSwapInState`]'s state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSwapInStateShape {
    /// Hot buffers per layer.
    pub seats: usize,
    /// Layers.
    pub layers: usize,
    /// Regular slots per buffer (each has one more, reserved for the newest token).
    pub device_buffer_size: usize,
    /// Threads per request (rounded up to a multiple of 32).
    pub block_size: usize,
    /// The most selected tokens per request.
    pub max_sel: usize,
    /// For a policy that keeps token words: words for positions `0..max_tokens`.
    pub max_tokens: usize,
}

/// The GPU swap-in of one policy, with the state of `seats` hot buffers of `layers` layers.
pub struct GpuSwapInState {
    /// The print its launches leave (the device's: a replayed graph holds them).
    pub(crate) print: Arc<crate::cuda::LaunchPrint>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) policy: Arc<dyn EvictionPolicy>,
    pub(crate) funcs: SwapFunctions,
    /// Batches of at most this many requests run the one-launch swap-in (`swap_in_fused`).
    pub(crate) fused_max: usize,
    /// Launches of batches of at most this many requests decide only and leave the missed rows
    /// to the attention (`SwapOutputs::fills`); 0: never.
    pub(crate) fill_max: usize,
    /// Rows are copied (false: decisions only, a timing bound; `MissFill::NoCopies`).
    pub(crate) copies: bool,
    /// Three words per seat for the one-launch swap-in's roles (zero between launches).
    pub(crate) sync: CudaSlice<u32>,
    pub(crate) seats: usize,
    pub(crate) layers: usize,
    pub(crate) device_buffer_size: usize,
    pub(crate) block: u32,
    pub(crate) max_sel: usize,
    pub(crate) slot_tokens: CudaSlice<i32>,
    pub(crate) records: CudaSlice<GpuSlotRecord>,
    pub(crate) scalars: CudaSlice<GpuPolicyScalars>,
    pub(crate) ready: CudaSlice<u32>,
    /// Per slot of every state: filled by a prefetch no selection has used yet.
    pub(crate) prefetched: CudaSlice<u8>,
    /// Per state, `word_tokens` token words (policies that keep them).
    pub(crate) words: Option<CudaSlice<u32>>,
    pub(crate) word_tokens: usize,
    pub(crate) max_tokens: usize,
    pub(crate) fault: CudaSlice<u32>,
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

impl GpuSwapInState {
    /// Compiles (once per device) and sets up the swap-in for `policy` in `shape`.
    pub fn new(dev: &CudaDevice, policy: Arc<dyn EvictionPolicy>, shape: GpuSwapInStateShape) -> Result<Self> {
        let GpuSwapInStateShape { seats, layers, device_buffer_size, block_size, max_sel, max_tokens } = shape;
        if !(1..=1024).contains(&block_size) {
            return Err(KernelError::invalid("swap_in_block_size", block_size, "must be in 1..=1024"));
        }
        if max_sel > hot_buffer_rows_of(device_buffer_size) || device_buffer_size == 0 || seats == 0 || layers == 0 {
            return Err(KernelError::invalid(
                "device_buffer_size",
                device_buffer_size,
                "need seats, layers and buffer slots, and at most a hot buffer's rows of selected tokens",
            ));
        }
        let smem = Self::shared_bytes(device_buffer_size, max_sel)
            .max(Self::prefetch_shared_bytes(device_buffer_size, max_sel));
        if smem > MAX_SHARED_BYTES {
            return Err(KernelError::invalid(
                "device_buffer_size",
                device_buffer_size,
                format!(
                    "with {max_sel} selected tokens the swap-in needs {smem} bytes of shared memory per block, \
                     more than the {MAX_SHARED_BYTES} a Hopper block can have beside its static shared memory"
                ),
            ));
        }
        let funcs = SwapFunctions::load(dev, policy.as_ref(), device_buffer_size, max_sel)?;
        let s = dev.stream().clone();
        let n = seats * layers;
        let slot_tokens = s.clone_htod(&vec![-1i32; n * device_buffer_size]).map_err(driver_error("slot tables"))?;
        let word_tokens = if policy.uses_token_words() { max_tokens } else { 0 };
        let words = match word_tokens {
            0 => None,
            w => Some(
                s.alloc_zeros(n.checked_mul(w).ok_or_else(|| KernelError::invalid("max_tokens", w, "overflows"))?)
                    .map_err(driver_error("token words"))?,
            ),
        };
        Ok(Self {
            print: Arc::clone(&dev.print),
            records: s.alloc_zeros(n * device_buffer_size).map_err(driver_error("records"))?,
            scalars: s.alloc_zeros(n).map_err(driver_error("scalars"))?,
            ready: s.alloc_zeros(n).map_err(driver_error("ready flags"))?,
            prefetched: s.alloc_zeros(n * device_buffer_size).map_err(driver_error("prefetched flags"))?,
            words,
            word_tokens,
            max_tokens,
            fault: s.alloc_zeros(1).map_err(driver_error("fault flag"))?,
            sync: s.alloc_zeros(3 * seats).map_err(driver_error("swap-in sync words"))?,
            slot_tokens,
            stream: s,
            policy,
            funcs,
            fused_max: FUSED_MAX_REQUESTS,
            fill_max: 0,
            copies: true,
            seats,
            layers,
            device_buffer_size,
            block: block_size.div_ceil(32) as u32 * 32,
            max_sel,
        })
    }

    /// Dynamic shared memory of the decision kernel for `b` slots and `k` selected tokens
    /// (`super::facts::swap_smem_bytes`, shared with the kernel).
    pub(crate) fn shared_bytes(b: usize, k: usize) -> usize {
        super::facts::swap_smem_bytes(b as u64, k as u64) as usize
    }

    /// Dynamic shared memory of the prefetch kernel for `k` candidates
    /// (`super::facts::prefetch_smem_bytes`, shared with the kernel).
    pub(crate) fn prefetch_shared_bytes(b: usize, k: usize) -> usize {
        super::facts::prefetch_smem_bytes(b as u64, k.next_power_of_two() as u64, k as u64) as usize
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<dyn EvictionPolicy> {
        &self.policy
    }

    /// Batches of at most `n` requests run the swap-in as one launch (0: never).
    pub fn set_fused_max(&mut self, n: usize) {
        self.fused_max = n;
    }

    /// Whether launches copy the missed rows (false, the default) or only decide, writing each
    /// selected token's host row to `SwapOutputs::fills` for an attention that brings the rows
    /// in itself (`miss_fill = "attention"`): the hot buffer then lacks them until it has run.
    pub fn set_fill_in_attention(&mut self, on: bool) {
        self.fill_max = if on { usize::MAX } else { 0 };
    }

    /// Leaves the misses to the attention in launches of at most `n` requests only (larger
    /// ones copy them).
    pub fn set_fill_max(&mut self, n: usize) {
        self.fill_max = n;
    }

    /// Whether launches copy rows at all (true, the default) or only decide, leaving the hot
    /// buffers as they were: a timing bound for the step without the swap-in's copies
    /// (`MissFill::NoCopies`; attention then reads wrong rows).
    pub fn set_copies(&mut self, on: bool) {
        self.copies = on;
    }

    /// Whether a launch of `n` requests leaves its misses to the attention.
    pub fn fills(&self, n: usize) -> bool {
        n <= self.fill_max
    }

    pub(crate) fn state_range(&self, seat: usize) -> Result<std::ops::Range<usize>> {
        if seat >= self.seats {
            return Err(KernelError::invalid("seat", seat, format!("there are {} seats", self.seats)));
        }
        Ok(seat * self.layers..(seat + 1) * self.layers)
    }

    /// Empties `seat` in every layer (a new request), optionally with tokens `0..preload` in
    /// slots `0..preload` (a prompt that fits its buffer).
    pub fn reset_seat(&mut self, seat: usize, preload: usize) -> Result<()> {
        let r = self.state_range(seat)?;
        if preload > self.device_buffer_size {
            return Err(KernelError::invalid(
                "preload",
                preload,
                format!("the buffer has {} slots", self.device_buffer_size),
            ));
        }
        let table: Vec<i32> = (0..self.device_buffer_size).map(|s| if s < preload { s as i32 } else { -1 }).collect();
        let all: Vec<i32> = table.iter().copied().cycle().take(self.layers * self.device_buffer_size).collect();
        let b = self.device_buffer_size;
        self.stream
            .memcpy_htod(&all, &mut self.slot_tokens.slice_mut(r.start * b..r.end * b))
            .map_err(driver_error("reset slot tables"))?;
        self.stream
            .memcpy_htod(&vec![0u32; self.layers], &mut self.ready.slice_mut(r.clone()))
            .map_err(driver_error("reset ready flags"))?;
        self.stream
            .memset_zeros(&mut self.prefetched.slice_mut(r.start * b..r.end * b))
            .map_err(driver_error("reset prefetched flags"))?;
        let w = self.word_tokens;
        if let Some(words) = self.words.as_mut() {
            self.stream
                .memset_zeros(&mut words.slice_mut(r.start * w..r.end * w))
                .map_err(driver_error("reset token words"))?;
        }
        Ok(())
    }

    /// Forgets every buffer's policy records (after a policy change the records are rebuilt).
    pub fn reset_policy(&mut self, policy: Arc<dyn EvictionPolicy>, dev: &CudaDevice) -> Result<()> {
        self.funcs = SwapFunctions::load(dev, policy.as_ref(), self.device_buffer_size, self.max_sel)?;
        // Token words start afresh with the policy (an old policy's history means nothing).
        self.word_tokens = if policy.uses_token_words() { self.max_tokens } else { 0 };
        self.words = match self.word_tokens {
            0 => None,
            w => Some(
                self.stream
                    .alloc_zeros(
                        (self.seats * self.layers)
                            .checked_mul(w)
                            .ok_or_else(|| KernelError::invalid("max_tokens", w, "overflows"))?,
                    )
                    .map_err(driver_error("token words"))?,
            ),
        };
        self.policy = policy;
        self.stream.memset_zeros(&mut self.ready).map_err(driver_error("reset ready flags"))
    }

    /// The prefetched flags of `(seat, layer)`'s slots (for tests).
    pub fn read_prefetched(&self, seat: usize, layer: usize) -> Result<Vec<u8>> {
        let st = self.state_range(seat)?.start + layer;
        let b = self.device_buffer_size;
        let mut f = vec![0u8; b];
        self.stream
            .memcpy_dtoh(&self.prefetched.slice(st * b..(st + 1) * b), &mut f)
            .map_err(driver_error("read flags"))?;
        self.stream.synchronize().map_err(driver_error("synchronize"))?;
        Ok(f)
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
        let dev = self.stream.clone_htod(&padded).map_err(driver_error("swap-in requests"))?;
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
                    .map_err(driver_error("swap-in requests"))?;
            }
        } else {
            let mut padded = reqs.to_vec();
            padded.resize(reqs.len().next_power_of_two(), SwapReq::default());
            batch.dev = self.stream.clone_htod(&padded).map_err(driver_error("swap-in requests"))?;
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
        self.stream.memcpy_dtoh(&self.fault, &mut f).map_err(driver_error("fault flag"))?;
        self.stream.synchronize().map_err(driver_error("synchronize"))?;
        if f[0] != 0 {
            self.stream.memset_zeros(&mut self.fault).map_err(driver_error("fault flag"))?;
        }
        Ok(f[0] != 0)
    }

    /// The state of `(seat, layer)`: slot → token (-1 empty), records, scalars (for tests).
    pub fn read_state(&self, seat: usize, layer: usize) -> Result<(Vec<i32>, Vec<SlotRecord>, PolicyScalars)> {
        let r = self.state_range(seat)?;
        let st = r.start + layer;
        let b = self.device_buffer_size;
        let mut t = vec![0i32; b];
        self.stream
            .memcpy_dtoh(&self.slot_tokens.slice(st * b..(st + 1) * b), &mut t)
            .map_err(driver_error("read slot table"))?;
        let mut rec = vec![GpuSlotRecord::default(); b];
        self.stream
            .memcpy_dtoh(&self.records.slice(st * b..(st + 1) * b), &mut rec)
            .map_err(driver_error("read records"))?;
        let mut sc = vec![GpuPolicyScalars::default(); 1];
        self.stream.memcpy_dtoh(&self.scalars.slice(st..st + 1), &mut sc).map_err(driver_error("read scalars"))?;
        self.stream.synchronize().map_err(driver_error("synchronize"))?;
        Ok((t, rec.into_iter().map(|x| x.0).collect(), sc[0].0))
    }
}
