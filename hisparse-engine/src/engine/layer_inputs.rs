//! Where the device path writes every running request's new token: its index-key row and its
//! KV row (resident) or reserved hot-buffer slot (hisparse), the same in every layer's pool;
//! a reserved slot about to be reused waits for the backup of the token it holds.

use std::time::Instant;

use hisparse_kernels::Backend;
use hisparse_memory::Mode;

use super::Engine;
use super::step::secs;
use crate::error::Result;
use crate::metrics::StepMetrics;

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// The destination rows of every running request's new token: index-key rows, then KV or
    /// hot-buffer rows. A reserved slot about to be reused waits for the backup of every layer's
    /// token in it.
    pub(super) fn new_token_rows(&self, m: &mut StepMetrics) -> Result<(Vec<u32>, Vec<u32>)> {
        let (b, n) = (self.cfg.hisparse.device_buffer_size, self.running.len());
        let (mut key_rows, mut kv_rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in &self.running {
            let (id, p) = (r.spec.id, r.seq_len);
            key_rows.push(self.cache.device.index_key_row(id, p)? as u32);
            match self.cfg.mode {
                Mode::Resident => kv_rows.push(self.cache.device.kv_row(id, p)? as u32),
                Mode::HiSparse => {
                    let slot = p.min(b);
                    if slot == b
                        && let Some(bk) = &self.cache.backup
                    {
                        let tw = Instant::now();
                        let last = self.cache.request(id)?.last_backup.iter().copied().max().unwrap_or(0);
                        bk.wait(last)?;
                        m.stages.backup += secs(tw);
                    }
                    kv_rows.push(self.cache.device.hot_row(id, slot)? as u32);
                }
            }
        }
        Ok((key_rows, kv_rows))
    }
}
