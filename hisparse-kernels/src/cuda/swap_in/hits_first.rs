//! The transfer side of `miss_fill = "hits-first"`: after a layer's locate (on the main stream,
//! its fill words naming each miss's host-tier row), `gather_misses` on the deferred stream copies
//! the misses into the layer's staging rows and lists them per request, and an event marks them
//! landed; the main stream meanwhile attends over the hits (`attention_hits_first.rs`) and waits
//! for that event only before the attention over the misses. The deferred swap-in proper then
//! copies the staged rows into their slots, as under `deferred-gather`.
//!
//! Invariant: the list and spans are rewritten only by the next layer's gather, which the
//! deferred stream runs after joining the main stream past this layer's attention over the
//! misses (the next layer's locate comes after it on the main stream).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, CudaViewMut, LaunchConfig};

use super::io::{LayerLaunch, MissSource};
use super::state::GpuSwapInState;
use crate::cuda::driver_error;
use crate::cuda::facts::GpuSpan;
use crate::cuda::printed_launch::PrintedLaunch;
use crate::error::{KernelError, Result};

use super::facts::{GATHER_THREADS as THREADS, LOCATE_CHUNK as CHUNK};

/// The misses' list and spans of the layer being attended, and the event that marks them (and
/// its staging rows) landed.
pub(crate) struct MissList {
    pub(crate) list: CudaSlice<i32>,
    pub(crate) spans: CudaSlice<GpuSpan>,
    pub(crate) landed: Option<CudaEvent>,
}

impl MissList {
    pub(crate) fn new(main: &Arc<CudaStream>) -> Result<Self> {
        Ok(Self {
            list: main.alloc_zeros(1).map_err(driver_error("miss list"))?,
            spans: main.alloc_zeros(1).map_err(driver_error("miss spans"))?,
            landed: None,
        })
    }

    /// Room for `requests` requests and `sel_end` selection entries (grows only, before a step).
    pub(crate) fn reserve(&mut self, main: &Arc<CudaStream>, requests: usize, sel_end: usize) -> Result<()> {
        if self.list.len() < sel_end {
            self.list = main.alloc_zeros(sel_end.next_power_of_two()).map_err(driver_error("miss list"))?;
        }
        if self.spans.len() < requests {
            self.spans = main.alloc_zeros(requests.next_power_of_two()).map_err(driver_error("miss spans"))?;
        }
        Ok(())
    }

    /// Gathers `layer`'s misses (the fill words `fills` the locate wrote) into `staging` and the
    /// list on `stream`, then records the event [`MissList::landed`].
    pub(crate) fn gather(
        &mut self,
        gpu: &mut GpuSwapInState,
        at: LayerLaunch<'_>,
        src: MissSource<'_>,
        fills: &CudaSlice<u64>,
        staging: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        let LayerLaunch { stream, layer, batch } = at;
        let params = gpu.checked_params(layer, batch, fills.len(), None, src)?;
        let sel_end = batch.selection_end();
        let reqs = batch.requests();
        let rows_need = sel_end.checked_mul(params.row_bytes as usize);
        if rows_need.is_none_or(|b| staging.len() < b) || self.list.len() < sel_end || self.spans.len() < reqs.len() {
            return Err(KernelError::invalid(
                "staging",
                staging.len(),
                format!("{sel_end} rows of {} bytes, list entries and {} spans", params.row_bytes, reqs.len()),
            ));
        }
        let longest = reqs.iter().map(|r| r.sel_len as usize).max().unwrap_or(0);
        self.landed = None;
        if !reqs.is_empty() {
            let cfg = LaunchConfig {
                grid_dim: (reqs.len() as u32, longest.div_ceil(CHUNK).max(1) as u32, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let GpuSwapInState { print, funcs, fault, .. } = &mut *gpu;
            let mut b = PrintedLaunch::new(print, stream, &funcs.gather);
            let null = 0u64;
            b.arg(batch.device()).arg(fills).arg_mut(staging).arg_mut(&mut self.list).arg_mut(&mut self.spans);
            b.arg(&null).arg(&null).arg_mut(fault).params(&params);
            // SAFETY: the batch was validated against this swap-in (selection ranges within
            // `sel_end`, which `fills`, the staging rows and the list cover, and the spans hold a
            // request each: checked); a fill word is read as a host-tier row only below the
            // tier's rows (checked in the kernel: fault otherwise).
            unsafe { b.launch(cfg) }.map_err(driver_error("gather of the misses"))?;
        }
        let e = stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver_error("misses landed event"))?;
        self.landed = Some(e);
        Ok(())
    }
}
