//! Launch graphs of the CUDA backend. Every launch leaves a print — its kernel, grid, block,
//! shared memory and each argument by value or by device address, recorded by the launch itself
//! (`printed_launch.rs`) — in a running hash kept by the [`CudaDevice`]; two launch sequences
//! with equal prints do exactly the same thing. The
//! engine uses this to tell when a sequence captured into a CUDA graph may be replayed instead
//! of launched again. Also here: the capture itself and the one graph the backend keeps.
//!
//! Invariant: a launch made while the stream is capturing is recorded, not run; nothing on the
//! capturing stream copies from pageable host memory or allocates (the capture would fail, and
//! the engine then launches eagerly).

use std::sync::atomic::Ordering;

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

use super::device::CudaDevice;
use super::driver_error;
use crate::error::Result;

impl CudaDevice {
    /// The print of the launches since the last call, which starts a new one.
    pub(crate) fn take_print(&self) -> u64 {
        self.print.take()
    }

    /// Whether launches are being captured rather than run.
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// Starts capturing the stream's work.
    pub(crate) fn begin_capture(&self) -> Result<()> {
        self.stream()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(driver_error("begin capture"))?;
        self.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends the capture: the captured work as an instantiated graph (`None` when nothing was
    /// launched), or the error that invalidated the capture.
    pub(crate) fn end_capture(&self) -> Result<Option<LaunchGraph>> {
        self.capturing.store(false, Ordering::Release);
        let g = self.stream().end_capture(CUgraphInstantiate_flags(0)).map_err(driver_error("end capture"))?;
        Ok(g.map(LaunchGraph))
    }
}

/// An instantiated CUDA graph of a captured launch sequence.
pub struct LaunchGraph(CudaGraph);

// SAFETY: the graph and its executable are driver handles usable from any thread once the
// context is bound (cudarc binds it in `launch`); the backend keeps the graph behind a mutex, so
// it is launched by one thread at a time.
unsafe impl Send for LaunchGraph {}

impl LaunchGraph {
    /// Launches the graph on the stream it was captured from.
    pub(crate) fn launch(&self) -> Result<()> {
        self.0.launch().map_err(driver_error("graph launch"))
    }
}
