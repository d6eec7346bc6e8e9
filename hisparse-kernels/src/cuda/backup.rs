//! `GpuBackup`: eager backup of new rows, device → mapped host tier, on a side stream. Each
//! backup waits for the work already on the main stream (the rows it copies were written
//! there) and records an event; the main stream waits on that event before it reuses the slot or
//! reads the host row (a swap-in that may miss on it).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::device::CudaDevice;
use crate::error::{KernelError, Result};

fn cuda(context: &str) -> impl FnOnce(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Cuda { context: context.to_owned(), message: e.to_string() }
}

/// The backup side stream and its kernels.
pub struct GpuBackup {
    side: Arc<CudaStream>,
    scatter: CudaFunction,
    delay: CudaFunction,
    /// Test hook: delay every backup by this many nanoseconds on the side stream.
    pub inject_delay_ns: u64,
}

impl GpuBackup {
    /// A backup stream on `dev`.
    pub fn new(dev: &CudaDevice) -> Result<Self> {
        Ok(Self {
            side: dev.context().new_stream().map_err(cuda("backup stream"))?,
            scatter: dev.function("backup", "scatter_rows")?,
            delay: dev.function("backup", "delay_ns")?,
            inject_delay_ns: 0,
        })
    }

    /// Copies device rows `dev_rows[i]` of `rows` to host rows `host_rows[i]` of the tier at
    /// `host_base`, after everything already queued on `main`; returns the event that marks the
    /// copies done.
    pub fn backup(
        &self,
        main: &CudaStream,
        rows: &CudaSlice<u8>,
        dev_rows: &[u32],
        host_rows: &[u64],
        row_bytes: usize,
        host_base: u64,
    ) -> Result<CudaEvent> {
        if dev_rows.len() != host_rows.len() || row_bytes == 0 || !row_bytes.is_multiple_of(16) {
            return Err(KernelError::invalid(
                "host_rows",
                host_rows.len(),
                "one host row per device row, rows a multiple of 16 bytes",
            ));
        }
        if let Some(&bad) = dev_rows.iter().find(|&&r| (r as usize + 1) * row_bytes > rows.len()) {
            return Err(KernelError::invalid("dev_rows", bad, "not a row of the hot buffer"));
        }
        self.side.join(main).map_err(cuda("backup waits for the main stream"))?;
        if self.inject_delay_ns > 0 {
            let mut b = self.side.launch_builder(&self.delay);
            b.arg(&self.inject_delay_ns);
            // SAFETY: a one-thread kernel that only reads the clock.
            unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }
                .map_err(cuda("delay"))?;
        }
        if !dev_rows.is_empty() {
            let d = self.side.clone_htod(dev_rows).map_err(cuda("backup rows"))?;
            let h = self.side.clone_htod(host_rows).map_err(cuda("backup rows"))?;
            let (n, rb) = (dev_rows.len() as u32, row_bytes as u32);
            let mut b = self.side.launch_builder(&self.scatter);
            b.arg(rows).arg(&d).arg(&h).arg(&n).arg(&rb).arg(&host_base);
            let blocks = dev_rows.len().div_ceil(8).clamp(1, 1024) as u32;
            // SAFETY: device rows checked above; host rows are rows of the registered tier at
            // `host_base` (the caller's), written by nothing else until the event completes.
            unsafe { b.launch(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }
                .map_err(cuda("scatter rows"))?;
        }
        self.side.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(cuda("backup event"))
    }
}
