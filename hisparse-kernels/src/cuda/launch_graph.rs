//! Launch graphs of the CUDA backend. Every launch leaves a print — its kernel, grid, block,
//! shared memory and each argument by value or by device address — in a running hash kept by
//! the [`CudaDevice`]; two launch sequences with equal prints do exactly the same thing. The
//! engine uses this to tell when a sequence captured into a CUDA graph may be replayed instead
//! of launched again. Also here: the capture itself and the one graph the backend keeps.
//!
//! Invariant: a launch made while the stream is capturing is recorded, not run; nothing on the
//! capturing stream copies from pageable host memory or allocates (the capture would fail, and
//! the engine then launches eagerly).

use std::sync::atomic::Ordering;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaStream, DevicePtr, LaunchConfig};

use super::device::CudaDevice;
use super::driver_error;
use crate::error::Result;

/// The print of no launch.
pub(super) const PRINT_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a step over one 64-bit word.
fn mix(h: u64, w: u64) -> u64 {
    w.to_le_bytes().iter().fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The device address of `buf`, for a launch's print.
pub(super) fn addr<T>(buf: &impl DevicePtr<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off on the backend's device (`CudaDevice::with_own_stream`): the guard
    // records nothing.
    let (p, _guard) = buf.device_ptr(stream);
    p
}

impl CudaDevice {
    /// Adds one launch of `f` with `cfg` and argument words `args` to the print.
    pub(super) fn note(&self, f: &CudaFunction, cfg: &LaunchConfig, args: &[u64]) {
        let (g, b) = (cfg.grid_dim, cfg.block_dim);
        let head = [
            f.cu_function() as usize as u64,
            u64::from(g.0),
            u64::from(g.1),
            u64::from(g.2),
            u64::from(b.0),
            u64::from(b.1),
            u64::from(b.2),
            u64::from(cfg.shared_mem_bytes),
        ];
        self.note_words(&[&head[..], args].concat());
    }

    /// Adds one device-to-device copy to the print.
    pub(super) fn note_copy(&self, src: u64, dst: u64, bytes: u64) {
        self.note_words(&[0xc0de, src, dst, bytes]);
    }

    /// Adds the words of one launch (its kernel, grid and arguments among them) to the print.
    pub(super) fn note_words(&self, words: &[u64]) {
        let h = words.iter().fold(PRINT_SEED, |h, &w| mix(h, w));
        // Order matters (a sequence, not a set): fold the launch into the running print.
        let _ = self.print.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(mix(p, h)));
    }

    /// The print of the launches since the last call, which starts a new one.
    pub(crate) fn take_print(&self) -> u64 {
        self.print.swap(PRINT_SEED, Ordering::AcqRel)
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
