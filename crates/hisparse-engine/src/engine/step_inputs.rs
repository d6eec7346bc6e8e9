//! The device path's per-step inputs: every layer's new index keys and KV rows (each behind
//! its destination rows), indexer queries and head weights, and attention-query seeds,
//! generated on the host in parallel before the layer loop and copied into per-layer device
//! buffers that stay where they are from step to step, so that a captured launch sequence
//! reads them there ([`super::layer_graph`]).
//!
//! Invariant: `generation` changes whenever any per-layer buffer is reallocated.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, Mode};
use rayon::prelude::*;

use super::Engine;
use super::step::secs;
use crate::error::Result;
use crate::metrics::StepMetrics;

/// One layer's inputs on the device.
pub(super) struct LayerInputs<M: DeviceMemory> {
    /// `n` destination rows (little-endian `u32`) in the index-key pool, then the `n` keys.
    pub keys: M::Buffer<u8>,
    /// `n` destination rows in the KV pool (resident) or hot buffers (hisparse), then the rows.
    pub rows: M::Buffer<u8>,
    /// Indexer queries, `[n, index_heads, index_dim]`.
    pub index_q: M::Buffer<bf16>,
    /// Indexer head weights, `[n, index_heads]`.
    pub index_w: M::Buffer<f32>,
    /// Attention-query seeds, `[n]`.
    pub seeds: M::Buffer<u64>,
}

/// One layer's inputs on the host (reused from step to step).
#[derive(Default)]
struct HostLayer {
    keys: Vec<u8>,
    rows: Vec<u8>,
    index_q: Vec<bf16>,
    index_w: Vec<f32>,
    seeds: Vec<u64>,
}

/// Every layer's inputs of one step.
pub(super) struct StepInputs<M: DeviceMemory> {
    pub layers: Vec<LayerInputs<M>>,
    /// Changes whenever a device buffer above is reallocated.
    pub generation: u64,
    host: Vec<HostLayer>,
}

impl<M: DeviceMemory> Default for StepInputs<M> {
    fn default() -> Self {
        Self { layers: Vec::new(), generation: 0, host: Vec::new() }
    }
}

impl<M: DeviceMemory> StepInputs<M> {
    /// The new KV rows of layer `l` on the host, one per running request.
    pub fn host_rows(&self, l: usize, n: usize) -> &[u8] {
        self.host.get(l).map_or(&[], |h| &h.rows[4 * n..])
    }
}

/// Makes `buf` hold exactly `len` elements; `true` when it was reallocated.
fn fit_exact<M: DeviceMemory, T: hisparse_memory::Element>(
    mem: &M,
    buf: &mut M::Buffer<T>,
    len: usize,
) -> Result<bool> {
    if mem.len(buf) == len {
        return Ok(false);
    }
    *buf = mem.alloc_zeroed(len)?;
    Ok(true)
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Generates and uploads every layer's inputs of this step into `inputs`.
    pub(super) fn stage_step_inputs(&mut self, inputs: &mut StepInputs<B::Memory>, m: &mut StepMetrics) -> Result<()> {
        let g = self.cfg.geometry.clone();
        let (b, mode, layers, n) = (self.cfg.hisparse.device_buffer_size, self.cfg.mode, g.layers, self.running.len());
        let (key, kv_row) = (self.key, self.kv_row);

        // Destination rows: the same in every layer's pool.
        let t = Instant::now();
        let (mut key_rows, mut kv_rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in &self.running {
            let (id, p) = (r.spec.id, r.seq_len);
            key_rows.push(self.device.index_key_row(id, p)? as u32);
            match mode {
                Mode::Resident => kv_rows.push(self.device.kv_row(id, p)? as u32),
                Mode::HiSparse => {
                    let slot = p.min(b);
                    if slot == b {
                        // The reserved slot's previous token must be safe in the host tier
                        // before any layer overwrites it.
                        let tw = Instant::now();
                        if let Some(bk) = &self.backup {
                            bk.wait(r.last_backup.iter().copied().max().unwrap_or(0))?;
                        }
                        m.stages.backup += secs(tw);
                    }
                    kv_rows.push(self.device.hot_row(id, slot)? as u32);
                }
            }
        }
        m.stages.append += secs(t);

        // Every layer's data, generated in parallel.
        let t = Instant::now();
        let (h, dim) = (g.index_heads, g.index_dim);
        inputs.host.resize_with(layers, HostLayer::default);
        let (wl, running) = (&self.workload, &self.running);
        let pack = |out: &mut Vec<u8>, dest: &[u32], bytes: usize| {
            out.clear();
            dest.iter().for_each(|r| out.extend_from_slice(&r.to_le_bytes()));
            out.resize(4 * n + n * bytes, 0);
        };
        inputs.host.par_iter_mut().enumerate().try_for_each(|(l, hl)| -> Result<()> {
            pack(&mut hl.keys, &key_rows, key.row_bytes());
            pack(&mut hl.rows, &kv_rows, kv_row.row_bytes());
            hl.index_q.resize(n * h * dim, bf16::ZERO);
            hl.index_w.resize(n * h, 0.0);
            hl.seeds.clear();
            hl.seeds.extend(running.iter().map(|r| wl.attention_query_seed(r.spec.id.0, l, r.drift.step)));
            let keys = hl.keys[4 * n..].par_chunks_mut(key.row_bytes().max(1));
            let rows = hl.rows[4 * n..].par_chunks_mut(kv_row.row_bytes().max(1));
            let qs = hl.index_q.par_chunks_mut((h * dim).max(1)).zip(hl.index_w.par_chunks_mut(h.max(1)));
            keys.zip(rows).zip(qs).zip(running.par_iter()).try_for_each(|(((kb, rb), (q, w)), r)| -> Result<()> {
                let (id, p) = (r.spec.id.0, r.seq_len);
                let (mut vals, mut kvals, mut qf) = (vec![0f32; g.d_qk()], vec![0f32; dim], vec![0f32; h * dim]);
                wl.index_key(id, l, p, &mut kvals);
                key.encode(&kvals, kb)?;
                wl.kv_row(id, l, p, &mut vals);
                kv_row.encode(&vals, rb)?;
                wl.indexer_query(id, l, &r.drift, &mut qf, w);
                q.iter_mut().zip(&qf).for_each(|(o, x)| *o = bf16::from_f32(*x));
                Ok(())
            })
        })?;
        m.stages.workload += secs(t);

        // Uploads into buffers that stay put while the batch size does.
        let t = Instant::now();
        let mem = self.backend.memory();
        while inputs.layers.len() < layers {
            inputs.layers.push(LayerInputs {
                keys: mem.alloc_zeroed(0)?,
                rows: mem.alloc_zeroed(0)?,
                index_q: mem.alloc_zeroed(0)?,
                index_w: mem.alloc_zeroed(0)?,
                seeds: mem.alloc_zeroed(0)?,
            });
            inputs.generation += 1;
        }
        let mut moved = false;
        for (d, hl) in inputs.layers.iter_mut().zip(&inputs.host) {
            moved |= fit_exact(mem, &mut d.keys, hl.keys.len())?;
            moved |= fit_exact(mem, &mut d.rows, hl.rows.len())?;
            moved |= fit_exact(mem, &mut d.index_q, hl.index_q.len())?;
            moved |= fit_exact(mem, &mut d.index_w, hl.index_w.len())?;
            moved |= fit_exact(mem, &mut d.seeds, hl.seeds.len())?;
            mem.write(&mut d.keys, 0, &hl.keys)?;
            mem.write(&mut d.rows, 0, &hl.rows)?;
            mem.write(&mut d.index_q, 0, &hl.index_q)?;
            mem.write(&mut d.index_w, 0, &hl.index_w)?;
            mem.write(&mut d.seeds, 0, &hl.seeds)?;
        }
        inputs.generation += u64::from(moved);
        m.stages.append += secs(t);
        Ok(())
    }
}
