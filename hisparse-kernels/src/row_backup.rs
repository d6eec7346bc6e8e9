//! `RowBackup`: the eager backup of each new token's KV row from its hot-buffer slot on the
//! device to its row of the host tier, off the step's critical path (CUDA: a side stream fenced
//! by events; CPU: a worker thread fenced by sequence numbers), with the fence that makes the
//! hierarchy lossless: no reserved slot is rewritten, and no host row read, before the copy
//! that backs it up has landed.
//!
//! Calls of one step: [`RowBackup::begin_step`] with the step's rows, then per layer
//! [`RowBackup::fence`] before the layer's new rows are written and [`RowBackup::backup`] after,
//! then [`RowBackup::join`] at the step's end. [`RowBackup::wait_all`] before a request's host
//! pages are freed.

use std::time::Duration;

use hisparse_memory::DeviceMemory;

use crate::error::Result;

/// How a backup is built ([`crate::Backend::row_backup`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowBackupConfig {
    /// Layers (each its own hot-buffer pool and host-tier region).
    pub layers: usize,
    /// Test hook: delay every backup by this much (on the backup's own stream or thread).
    pub delay: Option<Duration>,
}

/// A backup of new rows, device → host tier, over memory `M`.
pub trait RowBackup<M: DeviceMemory>: Send {
    /// The step's rows: request `i`'s new row sits at row `dev_rows[i]` of every layer's
    /// hot-buffer pool and goes to host row `host_rows[i]` of layer 0 (row `r` of layer `l` is
    /// `r + l * HostTierLayout::layer_rows()`). Every index is checked here.
    fn begin_step(&mut self, dev_rows: &[u32], host_rows: &[u64]) -> Result<()>;

    /// Before `layer`'s reserved slots are rewritten (and its host rows read by a swap-in):
    /// every earlier backup of that layer has landed, in the device's order (the host waits
    /// only where the backend's work is not asynchronous).
    fn fence(&mut self, layer: usize) -> Result<()>;

    /// Queues the copy of this step's rows of `layer` from `pool` (that layer's hot-buffer
    /// pool), after the work queued so far on the backend.
    fn backup(&mut self, layer: usize, pool: &M::Buffer<u8>) -> Result<()>;

    /// Orders the backend's later work after every backup queued so far (the step's end; inside
    /// a captured launch sequence, it rejoins the backup's stream).
    fn join(&mut self) -> Result<()>;

    /// Blocks until every backup queued so far has landed.
    fn wait_all(&mut self) -> Result<()>;
}
