//! The staging rows of `miss_fill = "deferred-gather"`: a ring of [`DEPTH`] slots, each a row per
//! selection entry of a step, into which a layer's locate gathers its misses from the host tier
//! (at their selection index) for the attention to read from device memory, and from which that
//! layer's deferred swap-in then copies them into their slots, device to device — so a miss
//! crosses PCIe once and no kernel on the critical path waits on it but the locate.
//!
//! Invariant: slot `layer % DEPTH` is rewritten only after the deferred swap-in that last read
//! it (of layer `layer - DEPTH`) is done — the main stream waits for that swap-in's event before
//! the locate — and every slot's event is waited for by the step's end
//! ([`StagingRing::settle`]); the attention of a layer reads its slot before the next locate on
//! the same stream can rewrite any.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig};

use super::state::{GpuSwapInState, SwapBatch, SwapParams};
use crate::cuda::driver_error;
use crate::cuda::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result};

/// Slots of the ring: layers whose misses may wait in it for their deferred swap-in.
pub(crate) const DEPTH: usize = 4;

/// The ring and, per slot, the event of the deferred swap-in that reads it.
pub(crate) struct StagingRing {
    row_bytes: usize,
    /// Rows per slot (a power of two at least the step's selection entries).
    rows: usize,
    ring: CudaSlice<u8>,
    done: Vec<Option<CudaEvent>>,
}

/// A slot's rows and the selection they are indexed by, for a deferred swap-in's copies.
pub struct StagedRows<'a> {
    /// The staging rows of the layer (row `sel_offset + j` holds selected token `j`'s row if it
    /// was a miss).
    pub(crate) rows: CudaView<'a, u8>,
    /// The layer's selection copy.
    pub(crate) selection: CudaView<'a, u32>,
}

impl StagedRows<'_> {
    /// Checks that the rows and the selection cover what `batch` reads.
    pub(crate) fn check(&self, batch: &SwapBatch, row_bytes: u32) -> Result<()> {
        let sel_end = batch.selection_end();
        let need = sel_end.checked_mul(row_bytes as usize);
        if need.is_none_or(|b| self.rows.len() < b) || self.selection.len() < sel_end {
            return Err(KernelError::invalid("staging", self.rows.len(), format!("{sel_end} rows and selections")));
        }
        Ok(())
    }
}

impl StagingRing {
    /// An empty ring of `row_bytes` rows.
    pub(crate) fn new(main: &Arc<CudaStream>, row_bytes: usize) -> Result<Self> {
        Ok(Self {
            row_bytes,
            rows: 0,
            ring: main.alloc_zeros(row_bytes.max(1)).map_err(driver_error("staging rows"))?,
            done: (0..DEPTH).map(|_| None).collect(),
        })
    }

    /// Room for `sel_end` selection entries per slot (grows only, before a step: a captured
    /// step finds the ring where it was).
    pub(crate) fn reserve(&mut self, main: &Arc<CudaStream>, sel_end: usize) -> Result<()> {
        if sel_end <= self.rows {
            return Ok(());
        }
        let rows = sel_end.next_power_of_two();
        let bytes = rows
            .checked_mul(self.row_bytes)
            .and_then(|b| b.checked_mul(DEPTH))
            .ok_or_else(|| KernelError::invalid("selections", sel_end, "staging rows overflow"))?;
        self.ring = main.alloc_zeros(bytes).map_err(driver_error("staging rows"))?;
        self.rows = rows;
        Ok(())
    }

    fn range(&self, layer: usize) -> std::ops::Range<usize> {
        let slot = self.rows * self.row_bytes;
        (layer % DEPTH) * slot..(layer % DEPTH + 1) * slot
    }

    /// `layer`'s slot to gather into, once `main` has waited for the deferred swap-in that read
    /// it last.
    pub(crate) fn slot_mut(&mut self, main: &CudaStream, layer: usize) -> Result<CudaViewMut<'_, u8>> {
        if let Some(e) = self.done[layer % DEPTH].take() {
            main.wait(&e).map_err(driver_error("wait for a staging slot"))?;
        }
        let r = self.range(layer);
        Ok(self.ring.slice_mut(r))
    }

    /// `layer`'s slot to read.
    pub(crate) fn slot(&self, layer: usize) -> CudaView<'_, u8> {
        self.ring.slice(self.range(layer))
    }

    /// Records that `event` ends the deferred swap-in reading `layer`'s slot.
    pub(crate) fn read_by(&mut self, layer: usize, event: CudaEvent) {
        self.done[layer % DEPTH] = Some(event);
    }

    /// Orders every deferred swap-in that reads the ring before `main`'s later work.
    pub(crate) fn settle(&mut self, main: &CudaStream) -> Result<()> {
        for e in self.done.iter_mut().filter_map(Option::take) {
            main.wait(&e).map_err(driver_error("wait for the deferred swap-in"))?;
        }
        Ok(())
    }
}

impl GpuSwapInState {
    /// The copies of a deferred swap-in's misses from `staged` into `hot_rows`: enough blocks
    /// per request for about 4096 warps in all.
    pub(crate) fn launch_staged_copies(
        &mut self,
        stream: &Arc<CudaStream>,
        batch: &SwapBatch,
        staged: &StagedRows<'_>,
        hot_rows: &mut CudaSlice<u8>,
        (counts, miss_tokens, miss_slots): (&CudaView<'_, u32>, &CudaSlice<u32>, &CudaSlice<u32>),
        params: &SwapParams,
    ) -> Result<()> {
        let n = batch.requests().len();
        let per_request = (4096 / (n.max(1) * 8)).clamp(1, 512) as u32;
        let cfg = LaunchConfig { grid_dim: (n as u32, per_request, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let GpuSwapInState { print, funcs, .. } = &mut *self;
        let mut b = PrintedLaunch::new(print, stream, &funcs.copy_staged);
        b.arg(batch.device())
            .arg(counts)
            .arg(miss_tokens)
            .arg(miss_slots)
            .arg(&staged.selection)
            .arg(&staged.rows)
            .arg_mut(hot_rows)
            .params(params);
        // SAFETY: the decision kernel just wrote the lists for these requests (slots within the
        // buffers, validated seats); the staging rows and the selection copy cover the batch's
        // selection entries (`StagedRows::check`), and a row is read only at an index the
        // selection copy yields (within the request's span).
        unsafe { b.launch(cfg) }.map_err(driver_error("staged copy launch"))?;
        Ok(())
    }
}
