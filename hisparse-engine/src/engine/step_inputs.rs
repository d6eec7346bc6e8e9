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
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvGeometry, KvRowLayout};
use rayon::prelude::*;

use super::Engine;
use super::step::secs;
use crate::error::Result;
use crate::metrics::StepMetrics;
use crate::workload::{RequestDrift, Workload};

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

/// Which request, at which position, with which drift step.
type StepKey = (u64, usize, u32);

/// The next step's host inputs and drift states, generated while this step's kernels run.
struct Pending {
    key: Vec<StepKey>,
    host: Vec<HostLayer>,
    drifts: Vec<RequestDrift>,
}

/// Every layer's inputs of one step.
pub(super) struct StepInputs<M: DeviceMemory> {
    pub layers: Vec<LayerInputs<M>>,
    /// Changes whenever a device buffer above is reallocated.
    pub generation: u64,
    host: Vec<HostLayer>,
    pending: Option<Pending>,
    /// The host buffers of a used-up pending step, reused by the next one.
    spare: Vec<HostLayer>,
}

impl<M: DeviceMemory> Default for StepInputs<M> {
    fn default() -> Self {
        Self { layers: Vec::new(), generation: 0, host: Vec::new(), pending: None, spare: Vec::new() }
    }
}

impl<M: DeviceMemory> StepInputs<M> {
    /// The new KV rows of layer `l` on the host, one per running request.
    pub fn host_rows(&self, l: usize, n: usize) -> &[u8] {
        self.host.get(l).map_or(&[], |h| &h.rows[4 * n..])
    }
}

/// The data of every layer's inputs (not the destination rows, which the first `4 n` bytes of
/// `keys` and `rows` leave room for) for requests `(id, position, drift)`.
fn generate(
    wl: &Workload,
    g: &KvGeometry,
    key: IndexKeyLayout,
    kv_row: KvRowLayout,
    reqs: &[(u64, usize, &RequestDrift)],
    host: &mut Vec<HostLayer>,
) -> Result<()> {
    let (h, dim, n) = (g.index_heads, g.index_dim, reqs.len());
    host.resize_with(g.layers, HostLayer::default);
    host.par_iter_mut().enumerate().try_for_each(|(l, hl)| -> Result<()> {
        hl.keys.resize(4 * n + n * key.row_bytes(), 0);
        hl.rows.resize(4 * n + n * kv_row.row_bytes(), 0);
        hl.index_q.resize(n * h * dim, bf16::ZERO);
        hl.index_w.resize(n * h, 0.0);
        hl.seeds.clear();
        hl.seeds.extend(reqs.iter().map(|&(id, _, d)| wl.attention_query_seed(id, l, d.step)));
        let keys = hl.keys[4 * n..].par_chunks_mut(key.row_bytes().max(1));
        let rows = hl.rows[4 * n..].par_chunks_mut(kv_row.row_bytes().max(1));
        let qs = hl.index_q.par_chunks_mut((h * dim).max(1)).zip(hl.index_w.par_chunks_mut(h.max(1)));
        keys.zip(rows).zip(qs).zip(reqs.par_iter()).try_for_each(|(((kb, rb), (q, w)), &(id, p, d))| -> Result<()> {
            let (mut vals, mut kvals, mut qf) = (vec![0f32; g.d_qk()], vec![0f32; dim], vec![0f32; h * dim]);
            wl.kv_row(id, l, p, &mut vals);
            kv_row.encode(&vals, rb)?;
            // A shared layer (IndexShare) has no keys and runs no indexer.
            if g.is_full(l) {
                wl.index_key(id, l, p, &mut kvals);
                key.encode(&kvals, kb)?;
                wl.indexer_query(id, l, d, &mut qf, w);
                q.iter_mut().zip(&qf).for_each(|(o, x)| *o = bf16::from_f32(*x));
            }
            Ok(())
        })
    })
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
        let (layers, n) = (g.layers, self.running.len());
        let (key, kv_row) = (self.cache.key, self.cache.kv_row);

        // Destination rows: the same in every layer's pool.
        let t = Instant::now();
        let (key_rows, kv_rows) = self.new_token_rows(m)?;
        m.stages.append += secs(t);

        // Every layer's data: generated during the previous step's kernels when the batch
        // is the one foreseen then, else now.
        let t = Instant::now();
        let now: Vec<StepKey> = self.running.iter().map(|r| (r.spec.id.0, r.seq_len, r.drift.step)).collect();
        match inputs.pending.take() {
            Some(p) if p.key == now => {
                inputs.spare = std::mem::replace(&mut inputs.host, p.host);
                m.inputs_ahead = true;
            }
            stale => {
                if let Some(p) = stale {
                    inputs.spare = p.host;
                }
                let reqs: Vec<(u64, usize, &RequestDrift)> =
                    self.running.iter().map(|r| (r.spec.id.0, r.seq_len, &r.drift)).collect();
                generate(&self.workload, &g, key, kv_row, &reqs, &mut inputs.host)?;
            }
        }
        for hl in &mut inputs.host {
            for (dest, buf) in [(&key_rows, &mut hl.keys), (&kv_rows, &mut hl.rows)] {
                buf[..4 * n].chunks_exact_mut(4).zip(dest).for_each(|(o, r)| o.copy_from_slice(&r.to_le_bytes()));
            }
        }
        m.stages.workload += secs(t);

        // Uploads into buffers that stay put while the batch size does.
        let t = Instant::now();
        let mem = self.cache.backend.memory();
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

    /// Generates the next step's inputs while this step's kernels run, for the batch as it
    /// stands (each request one position further, its drift one step on). Nothing is
    /// generated when a request finishes with this step (the batch will differ).
    pub(super) fn pregenerate(&self, inputs: &mut StepInputs<B::Memory>) -> Result<()> {
        if self.running.iter().any(|r| r.generated + 1 >= r.spec.output_tokens) {
            return Ok(());
        }
        let wl = &self.workload;
        let drifts: Vec<RequestDrift> = self
            .running
            .par_iter()
            .map(|r| {
                let mut d = r.drift.clone();
                wl.advance(r.spec.id.0, &mut d);
                d
            })
            .collect();
        let reqs: Vec<(u64, usize, &RequestDrift)> =
            self.running.iter().zip(&drifts).map(|(r, d)| (r.spec.id.0, r.seq_len + 1, d)).collect();
        let key = reqs.iter().map(|&(id, p, d)| (id, p, d.step)).collect();
        let mut host = std::mem::take(&mut inputs.spare);
        generate(wl, &self.cfg.geometry, self.cache.key, self.cache.kv_row, &reqs, &mut host)?;
        inputs.pending = Some(Pending { key, host, drifts });
        Ok(())
    }

    /// Advances every running request's drift by one step, taking the states generated with
    /// the pending inputs when they are for this batch.
    pub(super) fn advance_drifts(&mut self) {
        let pending = self.scratch.as_mut().and_then(|sb| sb.inputs.pending.as_mut());
        if let Some(p) = pending {
            let fits = p.key.len() == self.running.len()
                && p.key
                    .iter()
                    .zip(&self.running)
                    .all(|(&(id, pos, step), r)| id == r.spec.id.0 && pos == r.seq_len && step == r.drift.step + 1);
            if fits {
                for (r, d) in self.running.iter_mut().zip(p.drifts.drain(..)) {
                    r.drift = d;
                }
                return;
            }
        }
        let wl = &self.workload;
        self.running.par_iter_mut().for_each(|r| wl.advance(r.spec.id.0, &mut r.drift));
    }
}
