//! The synthetic workload as the engine's input source: what a real model would hand the cache.
//! Per request it keeps the AR(1) drift state of the indexer queries; per step it makes every
//! layer's indexer queries and head weights on the host (generated while the previous step's
//! kernels ran when the batch is the one foreseen) and the seeds of the layer's attention
//! queries, new KV rows and new index keys, uploads them into per-layer buffers that stay where
//! they are from step to step (so that a captured launch sequence reads them there); per layer
//! the emulated model's projections then write the new rows, keys and attention queries in the
//! backend's memory ([`ModelKernels::fill_new_rows`], [`ModelKernels::fill_unit_bf16_seeded`]), as a real
//! model's would. A request's prompt is made on the host, one layer at a time, at admission.
//!
//! Invariant: `generation` changes whenever any buffer of this source is reallocated.

use std::collections::HashMap;

use half::bf16;
use hisparse_kernels::{Backend, NewRows};
use hisparse_memory::{Admission, DeviceMemory, Element, KvGeometry, RequestId};
use rayon::prelude::*;

use super::model::BatchEntry;
use super::observe::LayerTensors;
use crate::cache::{KvCache, LayerInputs};
use crate::error::{EngineError, Result};
use crate::workload::{RequestDrift, Workload};

/// One layer's inputs on the host (reused from step to step).
#[derive(Default)]
struct HostLayer {
    index_q: Vec<bf16>,
    index_w: Vec<f32>,
    attn_seeds: Vec<u64>,
    kv_seeds: Vec<u64>,
    key_seeds: Vec<u64>,
}

/// One layer's inputs in the backend's memory.
struct DeviceLayer<M: DeviceMemory> {
    index_q: M::Buffer<bf16>,
    index_w: M::Buffer<f32>,
    attn_seeds: M::Buffer<u64>,
    kv_seeds: M::Buffer<u64>,
    key_seeds: M::Buffer<u64>,
}

/// Which request, at which position, with which drift step.
type StepKey = (u64, usize, u32);

/// The next step's host inputs and drift states, generated while this step's kernels run.
struct Pending {
    key: Vec<StepKey>,
    host: Vec<HostLayer>,
    drifts: Vec<RequestDrift>,
}

/// The input source: see the module documentation.
pub(crate) struct SyntheticInputs<M: DeviceMemory> {
    pub workload: Workload,
    geometry: KvGeometry,
    drifts: HashMap<RequestId, RequestDrift>,
    layers: Vec<DeviceLayer<M>>,
    /// The projections' outputs, shared by every layer: new KV rows, new keys, attention
    /// queries.
    rows: M::Buffer<u8>,
    keys: M::Buffer<u8>,
    attn_q: M::Buffer<bf16>,
    pub generation: u64,
    host: Vec<HostLayer>,
    pending: Option<Pending>,
    /// The host buffers of a used-up pending step, reused by the next one.
    spare: Vec<HostLayer>,
    /// The caller's stop, observed by a prompt's prefill.
    stop: crate::StopFlag,
}

/// Makes `buf` hold exactly `len` elements; `true` when it was reallocated. An empty input (a
/// shared layer's queries and keys) keeps whatever buffer it has: a device may hand out one
/// element for an empty allocation, and reallocating it every step would move the buffer (and
/// change a captured sequence's key) for nothing.
fn fit_exact<M: DeviceMemory, T: Element>(mem: &M, buf: &mut M::Buffer<T>, len: usize) -> Result<bool> {
    if len == 0 || mem.len(buf) == len {
        return Ok(false);
    }
    *buf = mem.alloc_zeroed(len)?;
    Ok(true)
}

/// Every layer's host inputs for requests `(id, position, drift)`.
fn generate(wl: &Workload, g: &KvGeometry, reqs: &[(u64, usize, &RequestDrift)], host: &mut Vec<HostLayer>) {
    let (h, dim, n) = (g.index_heads, g.index_dim, reqs.len());
    host.resize_with(g.layers, HostLayer::default);
    host.par_iter_mut().enumerate().for_each(|(l, hl)| {
        hl.attn_seeds.clear();
        hl.attn_seeds.extend(reqs.iter().map(|&(id, _, d)| wl.attention_query_seed(id, l, d.step)));
        hl.kv_seeds.clear();
        hl.kv_seeds.extend(reqs.iter().map(|&(id, p, _)| wl.kv_row_seed(id, l, p)));
        hl.key_seeds.clear();
        // A shared layer (IndexShare) has no keys and runs no indexer.
        if !g.is_full(l) {
            hl.index_q.clear();
            hl.index_w.clear();
            return;
        }
        hl.key_seeds.extend(reqs.iter().flat_map(|&(id, p, _)| wl.index_key_seeds(id, l, p)));
        hl.index_q.resize(n * h * dim, bf16::ZERO);
        hl.index_w.resize(n * h, 0.0);
        let qs = hl.index_q.par_chunks_mut((h * dim).max(1)).zip(hl.index_w.par_chunks_mut(h.max(1)));
        qs.zip(reqs.par_iter()).for_each(|((q, w), &(id, _, d))| {
            let mut qf = vec![0f32; h * dim];
            wl.indexer_query(id, l, d, &mut qf, w);
            q.iter_mut().zip(&qf).for_each(|(o, x)| *o = bf16::from_f32(*x));
        });
    });
}

impl<M: DeviceMemory> SyntheticInputs<M> {
    pub fn new(mem: &M, geometry: &KvGeometry, seed: u64, stop: crate::StopFlag) -> Result<Self> {
        Ok(Self {
            stop,
            workload: Workload::new(geometry, seed),
            geometry: geometry.clone(),
            drifts: HashMap::new(),
            layers: Vec::new(),
            rows: mem.alloc_zeroed(0)?,
            keys: mem.alloc_zeroed(0)?,
            attn_q: mem.alloc_zeroed(0)?,
            generation: 0,
            host: Vec::new(),
            pending: None,
            spare: Vec::new(),
        })
    }

    /// Admits `id` into `cache` with its prompt of `prompt` positions (the workload's rows and
    /// keys, one layer at a time, generated in parallel), reserving `total`; starts its drift.
    pub fn admit<B: Backend<Memory = M>>(
        &mut self,
        cache: &mut KvCache<B>,
        id: RequestId,
        prompt: usize,
        total: usize,
    ) -> Result<Admission>
    where
        M: Clone,
    {
        let (kv_row, key) = cache.layouts();
        let (kb, keyb) = (kv_row.row_bytes(), key.row_bytes());
        let (wl, stop) = (&self.workload, &self.stop);
        stop.check()?;
        let got = cache.admit_with(id, prompt, total, |l, rows, keys| {
            // A long prompt's prefill observes a stop between rows (then the admission is undone).
            rows.par_chunks_mut(kb).enumerate().try_for_each(|(t, r)| {
                stop.check()?;
                let mut v = vec![0f32; kv_row.row_dims()];
                wl.kv_row(id.0, l, t, &mut v);
                kv_row.encode(&v, r).map_err(EngineError::from)
            })?;
            if let Some(keys) = keys {
                keys.par_chunks_mut(keyb).enumerate().try_for_each(|(t, k)| {
                    let mut v = vec![0f32; key.dim()];
                    wl.index_key(id.0, l, t, &mut v);
                    key.encode(&v, k)
                })?;
            }
            Ok(())
        })?;
        if got == Admission::Admitted {
            self.drifts.insert(id, self.workload.start(id.0));
        }
        Ok(got)
    }

    /// Forgets a request that left.
    pub fn finish(&mut self, id: RequestId) {
        self.drifts.remove(&id);
    }

    fn drift(&self, id: RequestId) -> Result<&RequestDrift> {
        self.drifts.get(&id).ok_or(EngineError::Request { id: id.0, reason: "no workload state".into() })
    }

    /// Prepares every layer's inputs of a step of `batch`: advances the drifts (taking the
    /// states generated ahead when they are for this batch), generates the host data (or takes
    /// it from the step before), uploads it. Returns whether the data was generated ahead.
    pub fn prepare(&mut self, mem: &M, batch: &[BatchEntry]) -> Result<bool> {
        let mut ahead = false;
        let advanced = match self.pending.take() {
            Some(p) => {
                let now: Result<Vec<StepKey>> =
                    batch.iter().map(|e| Ok((e.id.0, e.position, self.drift(e.id)?.step + 1))).collect();
                if p.key == now? {
                    for (e, d) in batch.iter().zip(p.drifts) {
                        self.drifts.insert(e.id, d);
                    }
                    self.spare = std::mem::replace(&mut self.host, p.host);
                    ahead = true;
                    true
                } else {
                    self.spare = p.host;
                    false
                }
            }
            None => false,
        };
        if !advanced {
            let wl = &self.workload;
            let mut ds: Vec<(RequestId, RequestDrift)> =
                batch.iter().map(|e| Ok((e.id, self.drift(e.id)?.clone()))).collect::<Result<_>>()?;
            ds.par_iter_mut().for_each(|(id, d)| wl.advance(id.0, d));
            self.drifts.extend(ds);
            let drifts = &self.drifts;
            let reqs: Vec<(u64, usize, &RequestDrift)> = batch
                .iter()
                .map(|e| {
                    let d = drifts
                        .get(&e.id)
                        .ok_or(EngineError::Request { id: e.id.0, reason: "no workload state".into() });
                    Ok((e.id.0, e.position, d?))
                })
                .collect::<Result<_>>()?;
            generate(&self.workload, &self.geometry, &reqs, &mut self.host);
        }
        self.upload(mem, batch.len())?;
        Ok(ahead)
    }

    /// Copies the host inputs into the per-layer buffers (which stay put while the batch size
    /// does).
    fn upload(&mut self, mem: &M, n: usize) -> Result<()> {
        let g = &self.geometry;
        while self.layers.len() < g.layers {
            self.layers.push(DeviceLayer {
                index_q: mem.alloc_zeroed(0)?,
                index_w: mem.alloc_zeroed(0)?,
                attn_seeds: mem.alloc_zeroed(0)?,
                kv_seeds: mem.alloc_zeroed(0)?,
                key_seeds: mem.alloc_zeroed(0)?,
            });
            self.generation += 1;
        }
        let mut moved = false;
        for (d, hl) in self.layers.iter_mut().zip(&self.host) {
            moved |= fit_exact(mem, &mut d.index_q, hl.index_q.len())?;
            moved |= fit_exact(mem, &mut d.index_w, hl.index_w.len())?;
            moved |= fit_exact(mem, &mut d.attn_seeds, hl.attn_seeds.len())?;
            moved |= fit_exact(mem, &mut d.kv_seeds, hl.kv_seeds.len())?;
            moved |= fit_exact(mem, &mut d.key_seeds, hl.key_seeds.len())?;
            mem.write(&mut d.index_q, 0, &hl.index_q)?;
            mem.write(&mut d.index_w, 0, &hl.index_w)?;
            mem.write(&mut d.attn_seeds, 0, &hl.attn_seeds)?;
            mem.write(&mut d.kv_seeds, 0, &hl.kv_seeds)?;
            mem.write(&mut d.key_seeds, 0, &hl.key_seeds)?;
        }
        moved |= fit_exact(mem, &mut self.rows, n * g.kv_row()?.row_bytes())?;
        moved |= fit_exact(mem, &mut self.keys, n * g.index_key()?.row_bytes())?;
        moved |= fit_exact(mem, &mut self.attn_q, n * g.q_heads * g.d_qk())?;
        self.generation += u64::from(moved);
        Ok(())
    }

    /// The emulated model's projections of layer `l` on `backend`: the new KV rows and index
    /// keys and the attention queries of the batch, written where the kernels run. Returns the
    /// layer's inputs for the cache.
    pub fn project<B: Backend<Memory = M>>(&mut self, backend: &B, l: usize) -> Result<LayerInputs<'_, M>> {
        let g = &self.geometry;
        let d = self.layers.get(l).ok_or_else(|| EngineError::Worker(format!("no inputs prepared for layer {l}")))?;
        let full = g.is_full(l);
        let fill = NewRows {
            kv_layout: g.kv_row()?,
            kv_seeds: &d.kv_seeds,
            key_layout: g.index_key()?,
            key_seeds: full.then_some(&d.key_seeds),
            key_mix: self.workload.key_mix(l),
        };
        backend.fill_new_rows(&fill, &mut self.rows, full.then_some(&mut self.keys))?;
        backend.fill_unit_bf16_seeded(&d.attn_seeds, g.q_heads * g.d_qk(), &mut self.attn_q)?;
        Ok(LayerInputs {
            index_queries: full.then_some(&d.index_q),
            index_weights: full.then_some(&d.index_w),
            new_index_keys: full.then_some(&self.keys),
            attention_queries: &self.attn_q,
            new_kv_rows: &self.rows,
        })
    }

    /// Layer `l`'s indexer queries and weights and the attention queries last projected, with
    /// the layer's outputs (for dumps).
    pub fn tensors<'a>(
        &'a self,
        l: usize,
        out: &'a M::Buffer<f32>,
        lse: &'a M::Buffer<f32>,
    ) -> Option<LayerTensors<'a, M>> {
        self.layers.get(l).map(|d| LayerTensors {
            index_q: &d.index_q,
            index_w: &d.index_w,
            attn_q: &self.attn_q,
            out,
            lse,
        })
    }

    /// Generates the next step's host inputs while this step's kernels run, for `batch` as it
    /// will stand (each request one position further, its drift one step on); `None` when the
    /// batch will differ (nothing is generated).
    pub fn pregenerate(&mut self, next: Option<&[BatchEntry]>) -> Result<()> {
        let Some(next) = next else { return Ok(()) };
        let wl = &self.workload;
        let drifts: Vec<RequestDrift> = next
            .par_iter()
            .map(|e| {
                let mut d = self.drift(e.id)?.clone();
                wl.advance(e.id.0, &mut d);
                Ok(d)
            })
            .collect::<Result<_>>()?;
        let reqs: Vec<(u64, usize, &RequestDrift)> =
            next.iter().zip(&drifts).map(|(e, d)| (e.id.0, e.position, d)).collect();
        let key = reqs.iter().map(|&(id, p, d)| (id, p, d.step)).collect();
        let mut host = std::mem::take(&mut self.spare);
        generate(wl, &self.geometry, &reqs, &mut host);
        self.pending = Some(Pending { key, host, drifts });
        Ok(())
    }
}
