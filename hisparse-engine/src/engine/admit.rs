//! Admission: requests leave the queue in arrival order while their whole-life resources fit;
//! one that can never fit is rejected whole; the first that cannot fit now makes the rest wait.
//! An admitted request's prompt KV goes straight into the host tier (hisparse: as a decode node
//! receives it from a prefill node) or the device tier (resident), its index keys into the
//! device tier; a prompt that fits the hot buffer is also copied into it (the fast path).

use std::time::Instant;

use hisparse_kernels::{Backend, DeviceSwapIn};
use hisparse_memory::{Admission, Mode, Resources};
use hisparse_policy::SwapInState;
use rayon::prelude::*;

use super::{Engine, Running};
use crate::error::Result;
use crate::metrics::StepMetrics;
use crate::request::{Outcome, RequestSpec};

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Admits what fits; records rejections.
    pub(crate) fn admit(&mut self, m: &mut StepMetrics) -> Result<()> {
        let t = Instant::now();
        let max_running = self.runtime.load().config.max_running;
        while let Some(spec) = self.queue.front().copied() {
            if max_running > 0 && self.running.len() >= max_running {
                break;
            }
            // `submit` checked that the total does not overflow.
            let total = spec.total_tokens().unwrap_or(usize::MAX);
            let need = Resources::need(self.cfg.mode, total, self.cfg.hisparse.page_tokens);
            match self.admission.try_admit(&need) {
                Admission::Admitted => {
                    self.queue.pop_front();
                    if let Err(e) = self.start(spec, need, m) {
                        // Undo whatever was taken, then report.
                        let _ = self.device.release(spec.id);
                        if let Some(h) = self.host.as_mut() {
                            let _ = h.release(spec.id);
                        }
                        self.admission.release(&need)?;
                        return Err(e);
                    }
                    m.admitted += 1;
                }
                Admission::Wait { .. } => break,
                Admission::Rejected { reason } => {
                    self.queue.pop_front();
                    tracing::info!(request = spec.id.0, %reason, "rejected");
                    self.outcomes.push((spec.id, Outcome::Rejected { reason }));
                }
            }
        }
        m.stages.admission += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Registers `spec` in the tiers and writes its prompt.
    fn start(&mut self, spec: RequestSpec, need: Resources, m: &mut StepMetrics) -> Result<()> {
        let (id, prompt) = (spec.id, spec.prompt_tokens);
        let (layers, b) = (self.cfg.geometry.layers, self.cfg.hisparse.device_buffer_size);
        let _span = tracing::info_span!("admit", request = id.0, prompt).entered();
        self.device.register(id, self.cfg.mode)?;
        self.device.grow(id, prompt)?;
        if let Some(h) = self.host.as_mut() {
            h.register(id)?;
            h.grow(id, prompt)?;
        }
        let preload = self.cfg.mode == Mode::HiSparse && prompt < b;
        let (kv_row, key) = (self.kv_row, self.key);
        let (kb, keyb) = (kv_row.row_bytes(), key.row_bytes());
        // Destination rows of the prompt's keys and KV rows (the same in every layer).
        let key_rows = (0..prompt).map(|t| Ok(self.device.index_key_row(id, t)? as u32)).collect::<Result<Vec<_>>>()?;
        let kv_rows = (0..prompt)
            .map(|t| {
                Ok(match self.cfg.mode {
                    Mode::Resident => self.device.kv_row(id, t)? as u32,
                    Mode::HiSparse if preload => self.device.hot_row(id, t)? as u32,
                    Mode::HiSparse => 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for l in 0..layers {
            // Rows and keys of the whole prompt of this layer, generated in parallel.
            let wl = &self.workload;
            let mut rows = vec![0u8; prompt * kb];
            let mut keys = vec![0u8; prompt * keyb];
            rows.par_chunks_mut(kb).zip(keys.par_chunks_mut(keyb)).enumerate().try_for_each(|(t, (r, k))| {
                let mut v = vec![0f32; kv_row.d_qk()];
                wl.kv_row(id.0, l, t, &mut v);
                kv_row.encode(&v, r)?;
                let mut kv = vec![0f32; key.dim()];
                wl.index_key(id.0, l, t, &mut kv);
                key.encode(&kv, k)
            })?;
            // Only layers that run an indexer store keys (IndexShare).
            if let Some(slot) = self.cfg.geometry.index_slot(l) {
                self.backend.write_rows(self.device.keys_mut(slot), keyb, &key_rows, &keys)?;
                m.bytes_prompt_device += keys.len() as u64;
            }
            match self.cfg.mode {
                Mode::Resident => {
                    self.backend.write_rows(self.device.kv_mut(l), kb, &kv_rows, &rows)?;
                    m.bytes_prompt_device += rows.len() as u64;
                }
                Mode::HiSparse => {
                    if let Some(h) = self.host.as_mut() {
                        h.write_rows(id, l, 0, &rows)?;
                    }
                    m.bytes_prompt_host += rows.len() as u64;
                    if preload {
                        self.backend.write_rows(self.device.hot_mut(l), kb, &kv_rows, &rows)?;
                        m.bytes_prompt_device += rows.len() as u64;
                    }
                }
            }
        }
        if let Some(d) = self.dswap.as_mut() {
            let seat = self.device.hot_row(id, 0)? / (b + 1);
            d.reset_seat(seat, if preload { prompt } else { 0 })?;
        }
        let swap = match self.cfg.mode {
            Mode::Resident => Vec::new(),
            Mode::HiSparse => (0..layers)
                .map(|_| {
                    let mut s = SwapInState::new(b)?;
                    if preload {
                        s.preload(prompt)?;
                    }
                    Ok(s)
                })
                .collect::<Result<_>>()?,
        };
        self.running.push(Running {
            spec,
            seq_len: prompt,
            generated: 0,
            need,
            swap,
            drift: self.workload.start(id.0),
            last_backup: vec![0; layers],
            first_step: self.step + 1,
            prefetch: Default::default(),
        });
        Ok(())
    }
}
