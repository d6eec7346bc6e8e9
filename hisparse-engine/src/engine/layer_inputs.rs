//! The new token's rows and the queries of a layer as the host path makes them, one layer at a
//! time: the destination rows of every request's new token (shared with the device path, which
//! stages all layers at once in `step_inputs.rs`), the batched append of its index key and KV
//! row, the indexer's queries and weights, the attention queries.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, Mode};
use rayon::prelude::*;

use super::Engine;
use super::step::{StepBatch, secs};
use crate::error::Result;
use crate::metrics::StepMetrics;

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Where every running request's new token goes: its index-key row and its KV row (resident)
    /// or reserved hot-buffer slot (hisparse), the same in every layer's pool. A reserved slot
    /// about to be reused waits for the backup of the token it holds — of `layer`, or of every
    /// layer (`None`).
    pub(super) fn new_token_rows(&self, layer: Option<usize>, m: &mut StepMetrics) -> Result<(Vec<u32>, Vec<u32>)> {
        let (b, n) = (self.cfg.hisparse.device_buffer_size, self.running.len());
        let (mut key_rows, mut kv_rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in &self.running {
            let (id, p) = (r.spec.id, r.seq_len);
            key_rows.push(self.device.index_key_row(id, p)? as u32);
            match self.cfg.mode {
                Mode::Resident => kv_rows.push(self.device.kv_row(id, p)? as u32),
                Mode::HiSparse => {
                    let slot = p.min(b);
                    if slot == b {
                        let tw = Instant::now();
                        if let Some(bk) = &self.backup {
                            let seq = match layer {
                                Some(l) => r.last_backup[l],
                                None => r.last_backup.iter().copied().max().unwrap_or(0),
                            };
                            bk.wait(seq)?;
                        }
                        m.stages.backup += secs(tw);
                    }
                    kv_rows.push(self.device.hot_row(id, slot)? as u32);
                }
            }
        }
        Ok((key_rows, kv_rows))
    }

    /// Writes the new token's index key and KV row of layer `l` for every running request (one
    /// batched write per pool); returns the rows (hisparse: for the backup).
    pub(super) fn append_tokens(&mut self, l: usize, m: &mut StepMetrics) -> Result<Vec<u8>> {
        let g = self.cfg.geometry.clone();
        let (d_qk, dim, full) = (g.d_qk(), g.index_dim, g.is_full(l));
        let (kv_row, key, mode) = (self.kv_row, self.key, self.cfg.mode);
        let n = self.running.len();
        let mut keys = vec![0u8; n * key.row_bytes()];
        let mut rows = vec![0u8; n * kv_row.row_bytes()];
        let t = Instant::now();
        let wl = &self.workload;
        keys.par_chunks_mut(key.row_bytes())
            .zip(rows.par_chunks_mut(kv_row.row_bytes()))
            .zip(self.running.par_iter())
            .try_for_each(|((kb, rb), r)| {
                let (id, p) = (r.spec.id, r.seq_len);
                let (mut vals, mut kvals) = (vec![0f32; d_qk], vec![0f32; dim]);
                if full {
                    wl.index_key(id.0, l, p, &mut kvals);
                    key.encode(&kvals, kb)?;
                }
                wl.kv_row(id.0, l, p, &mut vals);
                kv_row.encode(&vals, rb)
            })?;
        m.stages.workload += secs(t);
        let t = Instant::now();
        let (key_rows, kv_rows) = self.new_token_rows(Some(l), m)?;
        if let Some(slot) = g.index_slot(l) {
            self.backend.write_rows(self.device.keys_mut(slot), key.row_bytes(), &key_rows, &keys)?;
        }
        let pool = if mode == Mode::Resident { self.device.kv_mut(l) } else { self.device.hot_mut(l) };
        self.backend.write_rows(pool, kv_row.row_bytes(), &kv_rows, &rows)?;
        m.stages.append += secs(t);
        Ok(match mode {
            Mode::Resident => Vec::new(),
            Mode::HiSparse => rows,
        })
    }

    /// The indexer's queries and head weights of layer `l` for every running request, generated
    /// in parallel on the host and copied to the device.
    pub(super) fn stage_index_queries(
        &self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let t = Instant::now();
        let g = &self.cfg.geometry;
        let (h, dim, n) = (g.index_heads, g.index_dim, self.running.len());
        sb.stage_q.resize(n * h * dim, bf16::ZERO);
        sb.stage_w.resize(n * h, 0.0);
        let wl = &self.workload;
        sb.stage_q.par_chunks_mut(h * dim).zip(sb.stage_w.par_chunks_mut(h)).zip(self.running.par_iter()).for_each(
            |((q, w), r)| {
                let mut qf = vec![0f32; h * dim];
                wl.indexer_query(r.spec.id.0, l, &r.drift, &mut qf, w);
                q.iter_mut().zip(&qf).for_each(|(o, x)| *o = bf16::from_f32(*x));
            },
        );
        let mem = self.backend.memory();
        mem.write(&mut sb.index_q, 0, &sb.stage_q)?;
        mem.write(&mut sb.index_w, 0, &sb.stage_w)?;
        m.stages.workload += secs(t);
        Ok(())
    }

    /// The attention queries of layer `l`, generated where the kernels run
    /// (`Backend::fill_unit_bf16`).
    pub(super) fn stage_attention_queries(
        &self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let t = Instant::now();
        let g = &self.cfg.geometry;
        let seeds: Vec<u64> =
            self.running.iter().map(|r| self.workload.attention_query_seed(r.spec.id.0, l, r.drift.step)).collect();
        self.backend.fill_unit_bf16(&seeds, g.q_heads * g.d_qk(), &mut sb.attn_q)?;
        m.stages.workload += secs(t);
        Ok(())
    }
}
