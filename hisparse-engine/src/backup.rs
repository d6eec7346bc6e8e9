//! The backup worker: a background thread that copies each new token's KV row into the host
//! tier, fed through a crossbeam channel, with completion tracked by sequence number so that
//! the engine never reuses a slot (or reads a host row) before its copy exists.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Sender, unbounded};
use hisparse_memory::{HostRowLocation, HostRowWriter};

use crate::error::{EngineError, Result};

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

/// The backup worker. Jobs complete in submission order.
pub struct BackupWorker {
    tx: Option<Sender<Job>>,
    progress: Arc<Progress>,
    next: u64,
    handle: Option<JoinHandle<()>>,
}

impl BackupWorker {
    /// Starts the worker writing through `writer`; `delay` (a test hook) slows every copy.
    pub fn start(writer: HostRowWriter, delay: Option<Duration>) -> Result<Self> {
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
                    // SAFETY: the engine hands out each (request, layer, position) row once, reads
                    // it only after `wait` for this job's sequence number returned, and releases
                    // the request's pages only after waiting for all of its jobs.
                    let r = unsafe { writer.write(job.at, &job.row) };
                    let mut done = p.done.lock().unwrap_or_else(|e| e.into_inner());
                    done.0 = job.seq;
                    if let Err(e) = r {
                        done.1.get_or_insert(e.to_string());
                    }
                    p.cv.notify_all();
                }
            })
            .map_err(|e| EngineError::Worker(format!("cannot start the backup thread: {e}")))?;
        Ok(Self { tx: Some(tx), progress, next: 0, handle: Some(handle) })
    }

    /// Queues a copy of `row` to `at`; returns its sequence number.
    pub fn submit(&mut self, at: HostRowLocation, row: Vec<u8>) -> Result<u64> {
        self.next += 1;
        let tx = self.tx.as_ref().ok_or_else(|| EngineError::Worker("backup worker stopped".into()))?;
        tx.send(Job { seq: self.next, at, row }).map_err(|_| EngineError::Worker("backup worker stopped".into()))?;
        Ok(self.next)
    }

    /// Blocks until job `seq` (and every earlier one) completed; reports a failed copy.
    pub fn wait(&self, seq: u64) -> Result<()> {
        let mut done = self.progress.done.lock().unwrap_or_else(|e| e.into_inner());
        while done.0 < seq && done.1.is_none() {
            done = self.progress.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
        match &done.1 {
            Some(e) => Err(EngineError::Worker(format!("a backup copy failed: {e}"))),
            None => Ok(()),
        }
    }

    /// Whether job `seq` completed (without blocking).
    pub fn is_done(&self, seq: u64) -> bool {
        self.progress.done.lock().map(|d| d.0 >= seq).unwrap_or(false)
    }

    /// The last submitted sequence number.
    pub fn last(&self) -> u64 {
        self.next
    }
}

impl Drop for BackupWorker {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
