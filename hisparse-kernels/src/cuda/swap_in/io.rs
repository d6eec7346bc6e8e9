//! The buffers a swap-in launch reads and writes, each group named once: where and what it
//! launches ([`LayerLaunch`]: the stream, the layer, the batch), the selections it reads
//! ([`Selections`]), where its missed rows come from ([`MissSource`]) and where it writes
//! ([`SwapTargets`]; [`LocateTargets`] for the deferred swap-in's locate), and a prefetch's
//! candidates ([`Nominations`], with each request's protected span: [`ProtectSpans`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use hisparse_memory::host_tier::MappedHostTier;

use super::state::{SwapBatch, SwapOutputs};
use crate::cuda::driver_error;
use crate::error::Result;

/// One layer of a batch, launched on a stream (ordering the stream against the swap-in's other
/// work is the caller's).
#[derive(Clone, Copy)]
pub struct LayerLaunch<'a> {
    /// The stream the launches go on.
    pub stream: &'a Arc<CudaStream>,
    /// The layer.
    pub layer: usize,
    /// The batch's requests (from [`super::GpuSwapInState::upload_requests`]).
    pub batch: &'a SwapBatch,
}

/// A layer's selections as a launch reads them.
#[derive(Clone, Copy)]
pub struct Selections<'a, 'b> {
    /// Each request's selected positions, from its `sel_offset`.
    pub positions: &'a CudaView<'b, u32>,
    /// For policies that read them: each request's scores by position, from its
    /// `score_offset`.
    pub scores: Option<&'a CudaView<'b, f32>>,
}

/// Where missed rows come from: the mapped host tier, through each request's host page ids
/// (`pages`, from its `page_offset`).
#[derive(Clone, Copy)]
pub struct MissSource<'a> {
    /// The batch's host page ids.
    pub pages: &'a CudaSlice<u32>,
    /// The host tier, mapped for the device.
    pub host: &'a MappedHostTier,
}

/// Where a swap-in launch writes.
pub struct SwapTargets<'a> {
    /// This layer's hot-buffer pool: the rows brought in.
    pub hot_rows: &'a mut CudaSlice<u8>,
    /// The decisions.
    pub out: &'a mut SwapOutputs,
    /// The counts, into this buffer from this word instead of `out.counts` (at least
    /// [`crate::swap_in::SWAP_COUNTS`] words per request).
    pub counts: Option<(&'a mut CudaSlice<u32>, usize)>,
}

/// Where the deferred swap-in's locate writes.
pub struct LocateTargets<'a, 'b> {
    /// A hit's (or the newest token's) hot-buffer row; a miss's request's reserved slot.
    pub locations: &'a mut CudaSlice<i32>,
    /// 0 for a hit, else the missed row's host-tier row plus one (or its staging row plus one
    /// where `staging` is given).
    pub fills: &'a mut CudaSlice<u64>,
    /// The selection, copied.
    pub sel_copy: &'a mut CudaViewMut<'b, u32>,
    /// A row per selection entry: the missed rows copied there, at their selection index.
    pub staging: Option<&'a mut CudaViewMut<'b, u8>>,
}

/// What a prefetch is asked to bring in.
#[derive(Clone, Copy)]
pub struct Nominations<'a, 'b> {
    /// Each request's candidates in order of preference, from its `sel_offset`, `sel_len` of
    /// them; its budget in `pad`.
    pub candidates: &'a CudaView<'b, u32>,
    /// The protected positions (never evicted), each request's at its span.
    pub protect: &'a CudaView<'b, u32>,
    /// Each request's `(offset, len)` in `protect` ([`super::GpuSwapInState::set_protect`]).
    pub spans: &'a ProtectSpans,
    /// Scores by position, for policies that read them.
    pub scores: Option<&'a CudaView<'b, f32>>,
}

/// Each request's protected positions of a prefetch, `(offset, len)` in a protect buffer, on
/// the device; checked on the host when set ([`super::GpuSwapInState::set_protect`]).
pub struct ProtectSpans {
    pub(super) dev: CudaSlice<u32>,
    pub(super) n: usize,
    /// One past the furthest protected entry.
    pub(super) end: usize,
}

impl ProtectSpans {
    /// No spans yet.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        Ok(Self { dev: stream.alloc_zeros(2).map_err(driver_error("protect spans"))?, n: 0, end: 0 })
    }
}
