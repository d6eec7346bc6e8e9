//! `CpuRowBackup`: the CPU backend's [`RowBackup`] — a worker thread fed through a crossbeam
//! channel copies each new row from the hot-buffer pool (host memory on this backend) into the
//! host tier; completion is tracked by sequence number per layer, and [`RowBackup::fence`]
//! blocks until a layer's earlier copies have landed.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Sender, unbounded};
use hisparse_memory::{EmulatedDevice, HostRowLocation, HostRowWriter, HostTier, HostTierLayout};

use crate::error::{KernelError, Result};
use crate::row_backup::{RowBackup, RowBackupConfig};

/// One row to copy.
struct Job {
    seq: u64,
    at: HostRowLocation,
    row: Vec<u8>,
}

#[derive(Default)]
struct Progress {
    done: Mutex<(u64, Option<String>)>,
    cv: Condvar,
}

/// The CPU backup: see the module documentation. Jobs complete in submission order.
pub struct CpuRowBackup {
    tx: Option<Sender<Job>>,
    progress: Arc<Progress>,
    next: u64,
    handle: Option<JoinHandle<()>>,
    layout: HostTierLayout,
    dev_rows: Vec<u32>,
    host_rows: Vec<u64>,
    /// Sequence number of each layer's newest job.
    last: Vec<u64>,
}

fn worker(what: &str) -> KernelError {
    KernelError::Worker(what.to_owned())
}

impl CpuRowBackup {
    /// Starts the worker writing into `host`.
    pub fn new(host: &HostTier, cfg: &RowBackupConfig) -> Result<Self> {
        Self::start(host.row_writer(), host.layout(), cfg.layers, cfg.delay)
    }

    fn start(writer: HostRowWriter, layout: HostTierLayout, layers: usize, delay: Option<Duration>) -> Result<Self> {
        let (tx, rx) = unbounded::<Job>();
        let progress = Arc::new(Progress::default());
        let p = Arc::clone(&progress);
        let handle = std::thread::Builder::new()
            .name("hisparse-backup".into())
            .spawn(move || {
                for job in rx {
                    if let Some(d) = delay {
                        std::thread::sleep(d);
                    }
                    // SAFETY: each (request, layer, position) row is submitted once per step;
                    // the cache reads it, rewrites its slot or frees its page only after a
                    // fence or `wait_all` covering this job returned.
                    let r = unsafe { writer.write(job.at, &job.row) };
                    let mut done = p.done.lock().unwrap_or_else(|e| e.into_inner());
                    done.0 = job.seq;
                    if let Err(e) = r {
                        done.1.get_or_insert(e.to_string());
                    }
                    p.cv.notify_all();
                }
            })
            .map_err(|e| KernelError::Worker(format!("cannot start the backup thread: {e}")))?;
        Ok(Self {
            tx: Some(tx),
            progress,
            next: 0,
            handle: Some(handle),
            layout,
            dev_rows: Vec::new(),
            host_rows: Vec::new(),
            last: vec![0; layers],
        })
    }

    /// Blocks until job `seq` (and every earlier one) completed; reports a failed copy.
    fn wait(&self, seq: u64) -> Result<()> {
        let mut done = self.progress.done.lock().unwrap_or_else(|e| e.into_inner());
        while done.0 < seq && done.1.is_none() {
            done = self.progress.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
        match &done.1 {
            Some(e) => Err(KernelError::Worker(format!("a backup copy failed: {e}"))),
            None => Ok(()),
        }
    }
}

impl RowBackup<EmulatedDevice> for CpuRowBackup {
    fn begin_step(&mut self, dev_rows: &[u32], host_rows: &[u64]) -> Result<()> {
        if dev_rows.len() != host_rows.len() {
            return Err(KernelError::invalid("host_rows", host_rows.len(), format!("{} device rows", dev_rows.len())));
        }
        let per_layer = self.layout.layer_rows();
        if let Some(&bad) = host_rows.iter().find(|&&r| r >= per_layer) {
            return Err(KernelError::invalid(
                "host_rows",
                bad,
                format!("a layer of the host tier has {per_layer} rows"),
            ));
        }
        self.dev_rows.clear();
        self.dev_rows.extend_from_slice(dev_rows);
        self.host_rows.clear();
        self.host_rows.extend_from_slice(host_rows);
        Ok(())
    }

    fn fence(&mut self, layer: usize) -> Result<()> {
        let seq = *self.last.get(layer).ok_or_else(|| KernelError::invalid("layer", layer, "past the last layer"))?;
        self.wait(seq)
    }

    fn backup(&mut self, layer: usize, pool: &Vec<u8>) -> Result<()> {
        if layer >= self.last.len() {
            return Err(KernelError::invalid("layer", layer, format!("the backup has {} layers", self.last.len())));
        }
        let rb = self.layout.row_bytes;
        // Every row is checked before the first is queued.
        let pool_rows = pool.len() / rb.max(1);
        if let Some(&bad) = self.dev_rows.iter().find(|&&r| r as usize >= pool_rows) {
            return Err(KernelError::invalid("dev_rows", bad, format!("the pool holds {pool_rows} rows")));
        }
        let tx = self.tx.as_ref().ok_or_else(|| worker("backup worker stopped"))?;
        let offset = layer as u64 * self.layout.layer_rows();
        for (&d, &h) in self.dev_rows.iter().zip(&self.host_rows) {
            let src = &pool[d as usize * rb..(d as usize + 1) * rb];
            self.next += 1;
            let at = HostRowLocation((h + offset) * rb as u64);
            tx.send(Job { seq: self.next, at, row: src.to_vec() }).map_err(|_| worker("backup worker stopped"))?;
        }
        self.last[layer] = self.next;
        Ok(())
    }

    fn join(&mut self) -> Result<()> {
        // Fences are per layer on this backend: nothing to rejoin.
        Ok(())
    }

    fn wait_all(&mut self) -> Result<()> {
        self.wait(self.next)
    }
}

impl Drop for CpuRowBackup {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
