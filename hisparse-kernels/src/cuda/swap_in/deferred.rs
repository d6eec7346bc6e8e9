//! The deferred swap-in (`miss_fill = "deferred"`): per layer, on the main stream, only the
//! location of each selected token as it is (`locate_in_hot`: a hit's slot, a miss's host-tier
//! row) for an attention that reads the misses straight from the host tier and writes nothing;
//! then, on a stream of its own, the swap-in proper — decisions and copies, exactly the serial
//! ones — over a copy of the selection, so that the hot buffer holds the step's misses for the
//! steps after. The main stream never waits for it within the step.
//!
//! Why it may run beside the attention: a swap-in evicts only slots its layer did not select
//! and writes rows only into those, while the attention reads only selected slots and the
//! reserved newest slot (which no swap-in writes); the decisions read the state the locate read,
//! so they find the same hits. A policy that reads scores is refused: the next layer's indexer
//! overwrites them before the deferred decisions run.
//!
//! With `miss_fill = "deferred-gather"` the locate also copies each miss from the host tier into
//! a staging row of its own (its selection index, in a ring of slots: `swap_staging.rs`), the
//! attention reads it there, from device memory, and the deferred swap-in copies it from there
//! into its slot: a miss crosses PCIe once.
//!
//! With `miss_fill = "copy-engine"` the locate only locates too, and the misses reach the same
//! staging rows through the host and the copy engine (`swap_copy_engine.rs`) before the attention.
//!
//! With `miss_fill = "hits-first"` the locate only locates (as under `deferred`), and the gather
//! runs first on the deferred stream (`swap_hits_first.rs`), beside the attention over the hits.
//!
//! Invariant: every deferred swap-in of a step is waited for by the main stream before the
//! step's end ([`DeferredSwapStream::settle`]), so the next step's locate of a layer reads the
//! state that layer's swap-in left; each layer's selection copy is its own, rewritten only by
//! the next step's locate of that layer.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, LaunchConfig};
use hisparse_memory::host_tier::MappedHostTier;

use super::copy_engine::CopyEngineStaging;
use super::hits_first::MissList;
use super::hits_first_attention::LandedMisses;
use super::io::{LayerLaunch, LocateTargets, MissSource, Selections, SwapTargets};
use super::staging::{StagedRows, StagingRing};
use super::state::{GpuSwapInState, SwapBatch, SwapOutputs};
use crate::cuda::device::CudaDevice;
use crate::cuda::driver_error;
use crate::cuda::printed_launch::{LaunchPrint, PrintedLaunch};
use crate::error::{KernelError, Result};

use super::facts::LOCATE_CHUNK;

impl GpuSwapInState {
    /// Writes, for every selected token of `batch` in `layer`, where it is now, changing no
    /// state: `locations` gets a hit's (or the newest token's) hot-buffer row, `fills` 0 for
    /// those and a miss's host-tier row plus one (its location is then the request's reserved
    /// slot, a placeholder); `sel_copy` gets the selection. Given `staging` (a row per
    /// selection entry), the missed rows are copied there too, at their selection index, and a
    /// miss's fill word names that staging row plus one instead. Launched on `stream`.
    pub fn locate(
        &mut self,
        at: LayerLaunch<'_>,
        selections: &CudaView<'_, u32>,
        src: MissSource<'_>,
        dst: LocateTargets<'_, '_>,
    ) -> Result<()> {
        let LayerLaunch { stream, layer, batch } = at;
        let LocateTargets { locations, fills, sel_copy, staging } = dst;
        let host_pages = src.pages;
        let params = self.checked_params(layer, batch, selections.len(), None, src)?;
        let sel_end = batch.selection_end();
        for (field, len) in [("locations", locations.len()), ("fills", fills.len()), ("sel_copy", sel_copy.len())] {
            if len < sel_end {
                return Err(KernelError::invalid(field, len, format!("the batch writes {sel_end} entries")));
            }
        }
        let rows_need = sel_end.checked_mul(params.row_bytes as usize);
        if let Some(st) = staging.as_ref()
            && rows_need.is_none_or(|b| st.len() < b)
        {
            return Err(KernelError::invalid(
                "staging",
                st.len(),
                format!("{sel_end} rows of {} bytes", params.row_bytes),
            ));
        }
        let reqs = batch.requests();
        let longest = reqs.iter().map(|r| r.sel_len as usize).max().unwrap_or(0);
        if reqs.is_empty() || longest == 0 {
            return Ok(());
        }
        // More warps per block when they also copy rows (a warp a row).
        let threads = if staging.is_some() { 512 } else { 256 };
        let cfg = LaunchConfig {
            grid_dim: (reqs.len() as u32, longest.div_ceil(LOCATE_CHUNK) as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let null = 0u64;
        let GpuSwapInState { print, funcs, slot_tokens, fault, .. } = &mut *self;
        let mut b = PrintedLaunch::new(print, stream, &funcs.locate);
        b.arg(batch.device())
            .arg(selections)
            .arg(slot_tokens)
            .arg(host_pages)
            .arg_mut(locations)
            .arg_mut(fills)
            .arg_mut(sel_copy);
        match staging {
            Some(st) => b.arg_mut(st),
            None => b.arg(&null),
        };
        b.arg_mut(fault).params(&params);
        // SAFETY: the batch was validated against this swap-in (seats within the slot tables,
        // selection ranges within `sel_end`, the request count within u32 as its seats are),
        // and the outputs hold `sel_end` entries, the staging `sel_end` rows (checked); host
        // page ids are read within `host_pages_len` and checked against the tier (fault
        // otherwise), so a missed row is read only inside the registered tier.
        unsafe { b.launch(cfg) }.map_err(driver_error("locate launch"))?;
        Ok(())
    }
}

/// Where the deferred swap-in of a layer writes ([`DeferredSwapStream::launch`]).
pub(crate) struct DeferredTargets<'a> {
    /// The layer's hot-buffer pool.
    pub hot_rows: &'a mut CudaSlice<u8>,
    /// The locate's locations (a miss's: its request's reserved slot).
    pub locations: &'a mut CudaSlice<i32>,
    /// The locate's fill words.
    pub fills: &'a mut CudaSlice<u64>,
    /// The counts, into this buffer from this word.
    pub counts: (&'a mut CudaSlice<u32>, usize),
}

/// The deferred swap-in's stream and buffers: see the module documentation.
pub(crate) struct DeferredSwapStream {
    main: Arc<CudaStream>,
    stream: Arc<CudaStream>,
    layers: usize,
    /// Per layer, a copy of its selection, `cap` entries each.
    sel_copy: CudaSlice<u32>,
    cap: usize,
    /// What the deferred launches write besides their counts (their locations are not the
    /// attention's).
    out: SwapOutputs,
    /// The deferred stream's last launch.
    pending: Option<CudaEvent>,
    /// Test hook: the delay kernel and its nanoseconds, before every deferred swap-in.
    delay: Option<(CudaFunction, u64)>,
    print: Arc<LaunchPrint>,
    /// `miss_fill = "deferred-gather"` and `"hits-first"`: the rows the misses are gathered into.
    gather: Option<StagingRing>,
    /// `miss_fill = "hits-first"`: the misses are gathered on the deferred stream, and listed.
    hits_first: Option<MissList>,
    /// `miss_fill = "copy-engine"`: the misses are gathered on the host and copied by the copy
    /// engine into the staging rows.
    copy_engine: Option<CopyEngineStaging>,
}

/// How a deferred swap-in brings the misses where the attention reads them.
pub(crate) enum DeferredFill {
    /// The attention reads them from the mapped host tier (`deferred`).
    HostReads,
    /// The locate gathers them into staging rows of this size (`deferred-gather`).
    Gather(usize),
    /// A gather on the deferred stream beside the attention over the hits (`hits-first`).
    HitsFirst(usize),
    /// The host and the copy engine, into staging rows (`copy-engine`): the host tier, the
    /// share of selection entries the landing rows hold, the host threads.
    CopyEngine(MappedHostTier, f64, usize),
}

impl DeferredSwapStream {
    /// A deferred swap-in for `layers` layers, with a stream of its own; `delay_ns` (a test
    /// hook) slows every deferred swap-in; `fill` says where the attention finds the misses.
    pub(crate) fn new(dev: &CudaDevice, layers: usize, delay_ns: u64, fill: DeferredFill) -> Result<Self> {
        let main = Arc::clone(dev.stream());
        let (mut hits_first, mut copy_engine) = (None, None);
        let gather = match fill {
            DeferredFill::HostReads => None,
            DeferredFill::Gather(rb) => Some(StagingRing::new(&main, rb)?),
            DeferredFill::HitsFirst(rb) => {
                hits_first = Some(MissList::new(&main)?);
                Some(StagingRing::new(&main, rb)?)
            }
            DeferredFill::CopyEngine(tier, share, threads) => {
                copy_engine = Some(CopyEngineStaging::new(&main, &tier, share, threads)?);
                Some(StagingRing::new(&main, tier.layout().row_bytes)?)
            }
        };
        let delay = match delay_ns {
            0 => None,
            ns => Some((dev.function("backup", "delay_ns")?, ns)),
        };
        Ok(Self {
            gather,
            hits_first,
            copy_engine,
            delay,
            print: Arc::clone(&dev.print),
            stream: dev.context().new_stream().map_err(driver_error("deferred swap-in stream"))?,
            sel_copy: main.alloc_zeros(layers.max(1)).map_err(driver_error("selection copies"))?,
            cap: 1,
            out: SwapOutputs::new(&main, 1, 1)?,
            main,
            layers,
            pending: None,
        })
    }

    /// Room for a step of `requests` requests reading `sel_end` selection entries (buffers
    /// grow only, so that a captured step still finds them where they were).
    pub(crate) fn begin_step(&mut self, requests: usize, sel_end: usize) -> Result<()> {
        if sel_end > self.cap {
            let cap = sel_end.next_power_of_two();
            let n = cap.checked_mul(self.layers).ok_or_else(|| KernelError::invalid("selections", cap, "overflows"))?;
            self.sel_copy = self.main.alloc_zeros(n).map_err(driver_error("selection copies"))?;
            self.cap = cap;
        }
        if let Some(ring) = self.gather.as_mut() {
            ring.reserve(&self.main, sel_end)?;
        }
        if let Some(m) = self.hits_first.as_mut() {
            m.reserve(&self.main, requests, sel_end)?;
        }
        if let Some(c) = self.copy_engine.as_mut() {
            c.reserve(&self.main, requests, sel_end)?;
        }
        if self.out.miss_tokens.len() < sel_end || self.out.counts.len() < crate::SWAP_COUNTS * requests {
            self.out = SwapOutputs::new(&self.main, requests.next_power_of_two(), sel_end.next_power_of_two())?;
        }
        Ok(())
    }

    /// The locate of `layer` on the main stream (into `dst.locations` and `dst.fills`), then
    /// its swap-in on the deferred stream, counted into `dst.counts`.
    pub(crate) fn launch(
        &mut self,
        gpu: &mut GpuSwapInState,
        layer: usize,
        batch: &SwapBatch,
        selections: &CudaView<'_, u32>,
        src: MissSource<'_>,
        dst: DeferredTargets<'_>,
    ) -> Result<()> {
        let DeferredTargets { hot_rows: hot, locations, fills, counts } = dst;
        if layer >= self.layers {
            return Err(KernelError::invalid("layer", layer, format!("the swap-in holds {} layers", self.layers)));
        }
        let (at, cap) = (layer * self.cap, self.cap);
        let mut copy = self.sel_copy.slice_mut(at..at + cap);
        let mut slot = match self.gather.as_mut() {
            Some(ring) => Some(ring.slot_mut(&self.main, layer)?),
            None => None,
        };
        let gathers = self.hits_first.is_none() && self.copy_engine.is_none();
        let located_only = if gathers { slot.as_mut() } else { None };
        let main = LayerLaunch { stream: &self.main, layer, batch };
        let located = LocateTargets { locations, fills: &mut *fills, sel_copy: &mut copy, staging: located_only };
        gpu.locate(main, selections, src, located)?;
        if let (Some(c), Some(slot)) = (self.copy_engine.as_mut(), slot.as_mut()) {
            c.stage(gpu, main, src, fills, slot)?;
        }
        self.stream.join(&self.main).map_err(driver_error("the deferred stream waits for the locate"))?;
        if let Some((f, ns)) = &self.delay {
            crate::cuda::backup::launch_delay(&self.print, &self.stream, f, ns)?;
        }
        if let (Some(m), Some(slot)) = (self.hits_first.as_mut(), slot.as_mut()) {
            m.gather(gpu, LayerLaunch { stream: &self.stream, layer, batch }, src, fills, slot)?;
        }
        let copy = self.sel_copy.slice(at..at + cap);
        let stream = Arc::clone(&self.stream);
        let staged = self
            .gather
            .as_ref()
            .map(|ring| StagedRows { rows: ring.slot(layer), selection: self.sel_copy.slice(at..at + cap) });
        gpu.launch_counted(
            LayerLaunch { stream: &stream, layer, batch },
            Selections { positions: &copy, scores: None },
            src,
            SwapTargets { hot_rows: hot, out: &mut self.out, counts: Some(counts) },
            staged.as_ref(),
        )?;
        let e = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver_error("deferred swap-in event"))?;
        match self.gather.as_mut() {
            Some(ring) => ring.read_by(layer, e),
            None => self.pending = Some(e),
        }
        Ok(())
    }

    /// The rows `layer`'s locate gathered (`deferred-gather`), at their selection index.
    pub(crate) fn staging_of(&self, layer: usize) -> Option<CudaView<'_, u8>> {
        self.gather.as_ref().map(|ring| ring.slot(layer))
    }

    /// Under `hits-first`, what the last launch's gather (of `layer`) leaves for the attention
    /// over the misses; `None` otherwise, or before that launch.
    pub(crate) fn landed_misses(&self, layer: usize) -> Option<LandedMisses<'_>> {
        let (m, ring) = (self.hits_first.as_ref()?, self.gather.as_ref()?);
        Some(LandedMisses { staging: ring.slot(layer), list: &m.list, spans: &m.spans, landed: m.landed.as_ref()? })
    }

    /// Under `copy-engine`: whether a host gather failed since the last call, and the rows the
    /// host gathered and those the scatter read from the host tier itself.
    pub(crate) fn take_copy_engine(&self) -> Option<(bool, u64, u64)> {
        let c = self.copy_engine.as_ref()?;
        let (landed, overflow) = c.take_rows();
        Some((c.take_fault(), landed, overflow))
    }

    /// Orders every deferred swap-in queued so far before the main stream's later work.
    pub(crate) fn settle(&mut self) -> Result<()> {
        if let Some(ring) = self.gather.as_mut() {
            ring.settle(&self.main)?;
        }
        match self.pending.take() {
            Some(e) => self.main.wait(&e).map_err(driver_error("wait for the deferred swap-in")),
            None => Ok(()),
        }
    }
}
