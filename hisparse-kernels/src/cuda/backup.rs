//! `GpuBackup`: eager backup of new rows, device → mapped host tier, on a side stream. Each
//! backup waits for the work already on the main stream (the rows it copies were written
//! there) and records an event; the main stream waits on that event before it reuses the slot or
//! reads the host row (a swap-in that may miss on it). Host rows are reached only through a
//! [`MappedHostTier`] (registered and alive while the handle is), at row indices checked
//! against its layout when they were uploaded ([`BackupRows`]).
//!
//! `CudaRowBackup` is the backend's [`RowBackup`]: the step's rows uploaded once, one backup
//! launch per layer on the side stream, and the side stream joined back into the main stream at
//! the step's end (inside a captured launch sequence too), so the next step's reuse of a slot
//! is ordered after every copy of this one without the host waiting.

use super::driver_error;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig};
use hisparse_memory::HostTier;
use hisparse_memory::cuda::CudaMemory;
use hisparse_memory::host_tier::MappedHostTier;

use super::device::CudaDevice;
use super::printed_launch::{LaunchPrint, PrintedLaunch};
use crate::error::{KernelError, Result};
use crate::row_backup::{RowBackup, RowBackupConfig};

/// Launches the test hook `delay_ns` (one thread spinning `ns` nanoseconds) on `stream`.
pub(crate) fn launch_delay(
    print: &LaunchPrint,
    stream: &Arc<CudaStream>,
    delay: &CudaFunction,
    ns: &u64,
) -> Result<()> {
    let mut b = PrintedLaunch::new(print, stream, delay);
    b.arg(ns);
    // SAFETY: a one-thread kernel that only reads the clock.
    unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }
        .map_err(driver_error("delay"))
}

/// A step's backup rows on the device, checked on the host when they were set
/// ([`GpuBackup::set_rows`]): device row `dev[i]` of a pool goes to host row `host[i]` of a
/// layer (below one layer's rows of the tier they were checked against).
pub struct BackupRows {
    dev: CudaSlice<u32>,
    host: CudaSlice<u64>,
    n: usize,
    /// One past the largest device row.
    dev_end: u64,
    /// The tier's layout the host rows were checked against.
    layout: hisparse_memory::HostTierLayout,
}

impl BackupRows {
    /// No rows yet.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        Ok(Self {
            dev: stream.alloc_zeros(1).map_err(driver_error("backup rows"))?,
            host: stream.alloc_zeros(1).map_err(driver_error("backup rows"))?,
            n: 0,
            dev_end: 0,
            layout: hisparse_memory::HostTierLayout { layers: 0, pages_per_layer: 0, row_bytes: 0, page_tokens: 0 },
        })
    }
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
            side: dev.context().new_stream().map_err(driver_error("backup stream"))?,
            scatter: dev.function("backup", "scatter_rows")?,
            delay: dev.function("backup", "delay_ns")?,
            inject_delay_ns: 0,
        })
    }

    /// Checks a step's rows (host rows below one layer's rows of `host`) and copies them into
    /// `rows` on `main` (into its buffers while they fit: a captured launch reads them there).
    pub fn set_rows(
        &self,
        main: &Arc<CudaStream>,
        rows: &mut BackupRows,
        dev_rows: &[u32],
        host_rows: &[u64],
        host: &MappedHostTier,
    ) -> Result<()> {
        let layout = host.layout();
        if dev_rows.len() != host_rows.len()
            || !layout.row_bytes.is_multiple_of(16)
            || u32::try_from(layout.row_bytes).is_err()
        {
            return Err(KernelError::invalid(
                "host_rows",
                host_rows.len(),
                "one host row per device row, rows a multiple of 16 bytes",
            ));
        }
        u32::try_from(dev_rows.len())
            .map_err(|_| KernelError::invalid("dev_rows", dev_rows.len(), "more than 2^32 - 1 rows"))?;
        if let Some(&bad) = host_rows.iter().find(|&&r| r >= layout.layer_rows()) {
            return Err(KernelError::invalid(
                "host_rows",
                bad,
                format!("a layer of the host tier has {} rows", layout.layer_rows()),
            ));
        }
        let n = dev_rows.len();
        if rows.dev.len() < n {
            rows.dev = main.alloc_zeros(n.next_power_of_two()).map_err(driver_error("backup rows"))?;
            rows.host = main.alloc_zeros(n.next_power_of_two()).map_err(driver_error("backup rows"))?;
        }
        if n > 0 {
            main.memcpy_htod(dev_rows, &mut rows.dev.slice_mut(..n)).map_err(driver_error("backup rows"))?;
            main.memcpy_htod(host_rows, &mut rows.host.slice_mut(..n)).map_err(driver_error("backup rows"))?;
        }
        rows.n = n;
        rows.dev_end = dev_rows.iter().map(|&r| u64::from(r) + 1).max().unwrap_or(0);
        rows.layout = layout;
        Ok(())
    }

    /// Copies `rows` from `pool` to layer `layer` of `host` after everything already queued on
    /// `main`; returns the event that marks the copies done.
    pub fn backup_layer(
        &self,
        main: &CudaStream,
        pool: &CudaSlice<u8>,
        rows: &BackupRows,
        layer: usize,
        host: &MappedHostTier,
    ) -> Result<CudaEvent> {
        let layout = host.layout();
        if rows.layout != layout {
            return Err(KernelError::invalid(
                "rows",
                "another tier",
                "the rows were checked against another host tier",
            ));
        }
        if layer >= layout.layers {
            return Err(KernelError::invalid("layer", layer, format!("the host tier has {} layers", layout.layers)));
        }
        let row_bytes = layout.row_bytes;
        let pool_rows = (pool.len() / row_bytes) as u64;
        if rows.dev_end > pool_rows {
            return Err(KernelError::invalid("dev_rows", rows.dev_end - 1, format!("the pool holds {pool_rows} rows")));
        }
        self.side.join(main).map_err(driver_error("backup waits for the main stream"))?;
        if self.inject_delay_ns > 0 {
            launch_delay(&self.print, &self.side, &self.delay, &self.inject_delay_ns)?;
        }
        if rows.n > 0 {
            // Checked when the rows were set: n < 2^32, row_bytes < 2^32; layer < layers, so
            // the layer's region lies inside the mapping.
            let (n, rb) = (rows.n as u32, row_bytes as u32);
            let host_base = host.device_ptr() + layer as u64 * layout.layer_rows() * row_bytes as u64;
            let mut b = PrintedLaunch::new(&self.print, &self.side, &self.scatter);
            b.arg(pool).arg(&rows.dev).arg(&rows.host).arg(&n).arg(&rb).arg(&host_base);
            let blocks = rows.n.div_ceil(8).clamp(1, 1024) as u32;
            // SAFETY: device rows checked against the pool above; host rows below one layer's
            // rows (checked in `set_rows` against this tier's layout), offset by a layer inside
            // the tier; the tier stays mapped and registered while `host` lives (this call).
            // Ordering the host rows' other readers and writers is the caller's (the event).
            unsafe { b.launch(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }
                .map_err(driver_error("scatter rows"))?;
        }
        self.side.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(driver_error("backup event"))
    }

    /// [`GpuBackup::set_rows`] then [`GpuBackup::backup_layer`] of layer 0, in buffers of its
    /// own: device rows `dev_rows[i]` of `rows` to host rows `host_rows[i]` of layer 0.
    pub fn backup(
        &self,
        main: &Arc<CudaStream>,
        rows: &CudaSlice<u8>,
        dev_rows: &[u32],
        host_rows: &[u64],
        host: &MappedHostTier,
    ) -> Result<CudaEvent> {
        // The row lists live on the side stream: their copies, the launch reading them and
        // their release when `r` drops are ordered there, and the host does not wait.
        let mut r = BackupRows::new(&self.side)?;
        self.set_rows(&self.side, &mut r, dev_rows, host_rows, host)?;
        self.backup_layer(main, rows, &r, 0, host)
    }

    /// Waits on the host for everything queued on the side stream.
    pub fn synchronize(&self) -> Result<()> {
        self.side.synchronize().map_err(driver_error("backup synchronize"))
    }
}

/// The CUDA backend's [`RowBackup`]: see the module documentation.
pub struct CudaRowBackup {
    gpu: GpuBackup,
    main: Arc<CudaStream>,
    host: MappedHostTier,
    rows: BackupRows,
    /// The newest backup's event, until the main stream joins it.
    last: Option<CudaEvent>,
}

impl CudaRowBackup {
    /// A backup into `host` (registered with the device here) on a side stream of `dev`.
    pub fn new(dev: &Arc<CudaDevice>, cfg: &RowBackupConfig, host: &mut HostTier) -> Result<Self> {
        let mapped = host.register_cuda(dev.context())?;
        if mapped.layout().layers != cfg.layers {
            return Err(KernelError::invalid(
                "layers",
                cfg.layers,
                format!("the host tier has {}", mapped.layout().layers),
            ));
        }
        let mut gpu = GpuBackup::new(dev)?;
        gpu.inject_delay_ns = cfg.delay.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let main = Arc::clone(dev.stream());
        Ok(Self { rows: BackupRows::new(&main)?, gpu, main, host: mapped, last: None })
    }
}

impl RowBackup<CudaMemory> for CudaRowBackup {
    fn begin_step(&mut self, dev_rows: &[u32], host_rows: &[u64]) -> Result<()> {
        self.gpu.set_rows(&self.main, &mut self.rows, dev_rows, host_rows, &self.host)
    }

    fn fence(&mut self, layer: usize) -> Result<()> {
        // Every earlier step's backups were joined into the main stream at that step's end,
        // and a layer's rows are backed up after they are written: nothing to wait for here.
        let _ = layer;
        Ok(())
    }

    fn backup(&mut self, layer: usize, pool: &CudaSlice<u8>) -> Result<()> {
        self.last = Some(self.gpu.backup_layer(&self.main, pool, &self.rows, layer, &self.host)?);
        Ok(())
    }

    fn join(&mut self) -> Result<()> {
        if let Some(e) = self.last.take() {
            self.main.wait(&e).map_err(driver_error("join the backup stream"))?;
        }
        Ok(())
    }

    fn wait_all(&mut self) -> Result<()> {
        self.gpu.synchronize()
    }
}
