//! Admission: requests leave the queue in arrival order while their whole-life resources fit;
//! one that can never fit is rejected whole; the first that cannot fit now makes the rest wait.
//! An admitted request's prompt (the synthetic workload's rows and keys, one layer at a time)
//! goes into the cache ([`crate::cache::KvCache::admit_with`]).

use std::time::Instant;

use hisparse_kernels::{Backend, DeviceSwapIn};
use hisparse_memory::{Admission, Mode};
use rayon::prelude::*;

use super::{Engine, Running};
use crate::error::Result;
use crate::metrics::StepMetrics;
use crate::request::{Outcome, RequestSpec};

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Admits what fits, in arrival order; records rejections. The first request that must
    /// wait holds back the rest (its prompt is generated only once it is admitted).
    pub(crate) fn admit(&mut self, m: &mut StepMetrics) -> Result<()> {
        let t = Instant::now();
        let max_running = self.runtime.load().config.max_running;
        while let Some(spec) = self.queue.front().copied() {
            if max_running > 0 && self.running.len() >= max_running {
                break;
            }
            // `submit` checked that the total does not overflow.
            let total = spec.total_tokens().unwrap_or(usize::MAX);
            match self.cache.decide(total) {
                Admission::Admitted => {}
                Admission::Wait { .. } => break,
                Admission::Rejected { reason } => {
                    self.queue.pop_front();
                    tracing::info!(request = spec.id.0, %reason, "rejected");
                    self.outcomes.push((spec.id, Outcome::Rejected { reason }));
                    continue;
                }
            }
            match self.start(spec, total, m)? {
                Admission::Admitted => {
                    self.queue.pop_front();
                    m.admitted += 1;
                }
                // `decide` said it fits: nothing changed in between.
                _ => break,
            }
        }
        m.stages.admission += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// Admits `spec` into the cache with its prompt generated layer by layer, and starts it.
    fn start(&mut self, spec: RequestSpec, total: usize, m: &mut StepMetrics) -> Result<Admission> {
        let (id, prompt) = (spec.id, spec.prompt_tokens);
        let _span = tracing::info_span!("admit", request = id.0, prompt).entered();
        let (kv_row, key) = self.cache.layouts();
        let (kb, keyb) = (kv_row.row_bytes(), key.row_bytes());
        let wl = &self.workload;
        // Rows and keys of the whole prompt of one layer, generated in parallel.
        let got = self.cache.admit_with(id, prompt, total, |l, rows, keys| {
            match keys {
                Some(keys) => {
                    rows.par_chunks_mut(kb).zip(keys.par_chunks_mut(keyb)).enumerate().try_for_each(|(t, (r, k))| {
                        let mut v = vec![0f32; kv_row.d_qk()];
                        wl.kv_row(id.0, l, t, &mut v);
                        kv_row.encode(&v, r)?;
                        let mut kv = vec![0f32; key.dim()];
                        wl.index_key(id.0, l, t, &mut kv);
                        key.encode(&kv, k)
                    })?
                }
                None => rows.par_chunks_mut(kb).enumerate().try_for_each(|(t, r)| {
                    let mut v = vec![0f32; kv_row.d_qk()];
                    wl.kv_row(id.0, l, t, &mut v);
                    kv_row.encode(&v, r)
                })?,
            }
            Ok(())
        })?;
        if got != Admission::Admitted {
            return Ok(got);
        }
        let (g, mode, b) = (&self.cfg.geometry, self.cfg.mode, self.cfg.hisparse.device_buffer_size);
        let preload = mode == Mode::HiSparse && prompt < b;
        let (rows, keys) = ((g.layers * prompt * kb) as u64, (g.index_layers() * prompt * keyb) as u64);
        m.bytes_prompt_device += keys;
        match mode {
            Mode::Resident => m.bytes_prompt_device += rows,
            Mode::HiSparse => {
                m.bytes_prompt_host += rows;
                if preload {
                    m.bytes_prompt_device += rows;
                }
            }
        }
        if let Some(d) = self.dswap.as_mut() {
            let seat = self.cache.device.hot_row(id, 0)? / (b + 1);
            d.reset_seat(seat, if preload { prompt } else { 0 })?;
        }
        self.running.push(Running {
            spec,
            seq_len: prompt,
            generated: 0,
            drift: self.workload.start(id.0),
            first_step: self.step + 1,
        });
        Ok(Admission::Admitted)
    }
}
