//! `GpuBackup`: eager backup of new rows, device → mapped host tier, on a side stream. Each
//! backup waits for the work already on the main stream (the rows it copies were written
//! there) and records an event; the main stream waits on that event before it reuses the slot or
//! reads the host row (a swap-in that may miss on it). Host rows are reached only through a
//! [`MappedHostTier`] (registered and alive while the handle is), at row indices checked
//! against its layout before the launch.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig};
use hisparse_memory::cuda::MappedHostTier;

use super::device::CudaDevice;
use super::printed_launch::{LaunchPrint, PrintedLaunch};
use crate::error::{KernelError, Result};

fn cuda(context: &str) -> impl FnOnce(cudarc::driver::DriverError) -> KernelError + '_ {
    move |e| KernelError::Cuda { context: context.to_owned(), message: e.to_string() }
}

/// The backup side stream and its kernels.
pub struct GpuBackup {
    /// The device's launch print (the backup's launches are part of a step's).
    print: Arc<LaunchPrint>,
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
            print: Arc::clone(&dev.print),
            side: dev.context().new_stream().map_err(cuda("backup stream"))?,
            scatter: dev.function("backup", "scatter_rows")?,
            delay: dev.function("backup", "delay_ns")?,
            inject_delay_ns: 0,
        })
    }

    /// Copies device rows `dev_rows[i]` of `rows` to host rows `host_rows[i]` of `host` (row
    /// `i` of the tier starts at byte `i * row_bytes`), after everything already queued on
    /// `main`; returns the event that marks the copies done. Every row index is checked first.
    pub fn backup(
        &self,
        main: &CudaStream,
        rows: &CudaSlice<u8>,
        dev_rows: &[u32],
        host_rows: &[u64],
        host: &MappedHostTier,
    ) -> Result<CudaEvent> {
        let row_bytes = host.layout().row_bytes;
        if dev_rows.len() != host_rows.len() || !row_bytes.is_multiple_of(16) || u32::try_from(row_bytes).is_err() {
            return Err(KernelError::invalid(
                "host_rows",
                host_rows.len(),
                "one host row per device row, rows a multiple of 16 bytes",
            ));
        }
        let n = u32::try_from(dev_rows.len())
            .map_err(|_| KernelError::invalid("dev_rows", dev_rows.len(), "more than 2^32 - 1 rows"))?;
        let dev_total = rows.len() / row_bytes;
        if let Some(&bad) = dev_rows.iter().find(|&&r| r as usize >= dev_total) {
            return Err(KernelError::invalid("dev_rows", bad, format!("the buffer holds {dev_total} rows")));
        }
        host.check_rows("host_rows", host_rows)?;
        self.side.join(main).map_err(cuda("backup waits for the main stream"))?;
        if self.inject_delay_ns > 0 {
            let mut b = PrintedLaunch::new(&self.print, &self.side, &self.delay);
            b.arg(&self.inject_delay_ns);
            // SAFETY: a one-thread kernel that only reads the clock.
            unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }
                .map_err(cuda("delay"))?;
        }
        if !dev_rows.is_empty() {
            let d = self.side.clone_htod(dev_rows).map_err(cuda("backup rows"))?;
            let h = self.side.clone_htod(host_rows).map_err(cuda("backup rows"))?;
            // row_bytes < 2^32: checked above.
            let (rb, host_base) = (row_bytes as u32, host.device_ptr());
            let mut b = PrintedLaunch::new(&self.print, &self.side, &self.scatter);
            b.arg(rows).arg(&d).arg(&h).arg(&n).arg(&rb).arg(&host_base);
            let blocks = dev_rows.len().div_ceil(8).clamp(1, 1024) as u32;
            // SAFETY: device rows and host rows checked above against the buffer and the tier's
            // layout; the tier stays mapped and registered while `host` lives (this call).
            // Ordering the host rows' other readers and writers is the caller's (the event).
            unsafe { b.launch(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }
                .map_err(cuda("scatter rows"))?;
        }
        self.side.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(cuda("backup event"))
    }
}
