//! The engine's decode step on a backend that reads selections on the host (CPU): a client of
//! the per-layer API. For each layer the synthetic workload makes the batch's inputs (new index
//! keys and KV rows, indexer queries and weights, attention queries) in the engine's buffers,
//! [`crate::DecodeStep::layer`] runs the layer, then the emulated model's GEMMs and the
//! observers (trace, dump, digests) see its outputs. Also the observers both paths share.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, Mode, RequestId};
use hisparse_policy::trace::{TraceRecord, TraceWriter};
use rayon::prelude::*;

use super::step::{LayerDump, StepReport, digest, secs};
use super::{Engine, Running};
use crate::cache::{KvCache, LayerInputs, LayerView};
use crate::error::{EngineError, Result};
use crate::workload::Workload;

/// The host path's per-layer input and output buffers (reused from step to step).
pub(crate) struct HostPathInputs<M: DeviceMemory> {
    keys: M::Buffer<u8>,
    rows: M::Buffer<u8>,
    index_q: M::Buffer<bf16>,
    index_w: M::Buffer<f32>,
    attn_q: M::Buffer<bf16>,
    out: M::Buffer<f32>,
    lse: M::Buffer<f32>,
    stage_keys: Vec<u8>,
    stage_rows: Vec<u8>,
    stage_q: Vec<bf16>,
    stage_w: Vec<f32>,
}

/// Makes `buf` hold exactly `len` elements.
fn fit<M: DeviceMemory, T: hisparse_memory::Element>(mem: &M, buf: &mut M::Buffer<T>, len: usize) -> Result<()> {
    if mem.len(buf) != len {
        *buf = mem.alloc_zeroed(len)?;
    }
    Ok(())
}

impl<M: DeviceMemory> HostPathInputs<M> {
    fn new(mem: &M) -> Result<Self> {
        Ok(Self {
            keys: mem.alloc_zeroed(0)?,
            rows: mem.alloc_zeroed(0)?,
            index_q: mem.alloc_zeroed(0)?,
            index_w: mem.alloc_zeroed(0)?,
            attn_q: mem.alloc_zeroed(0)?,
            out: mem.alloc_zeroed(0)?,
            lse: mem.alloc_zeroed(0)?,
            stage_keys: Vec::new(),
            stage_rows: Vec::new(),
            stage_q: Vec::new(),
            stage_w: Vec::new(),
        })
    }

    /// Generates layer `l`'s inputs of the batch `running` from the workload into the buffers.
    fn generate<B: Backend<Memory = M>>(
        &mut self,
        cache: &KvCache<B>,
        wl: &Workload,
        running: &[Running],
        l: usize,
    ) -> Result<()> {
        let g = &cache.config().geometry;
        let (kv_row, key) = cache.layouts();
        let (n, h, dim, full) = (running.len(), g.index_heads, g.index_dim, g.is_full(l));
        let mem = cache.backend().memory();
        self.stage_rows.resize(n * kv_row.row_bytes(), 0);
        self.stage_keys.resize(if full { n * key.row_bytes() } else { 0 }, 0);
        let keys = self.stage_keys.par_chunks_mut(key.row_bytes().max(1));
        let rows = self.stage_rows.par_chunks_mut(kv_row.row_bytes().max(1));
        if full {
            keys.zip(rows).zip(running.par_iter()).try_for_each(|((kb, rb), r)| {
                let (mut vals, mut kvals) = (vec![0f32; g.d_qk()], vec![0f32; dim]);
                wl.index_key(r.spec.id.0, l, r.seq_len, &mut kvals);
                key.encode(&kvals, kb)?;
                wl.kv_row(r.spec.id.0, l, r.seq_len, &mut vals);
                kv_row.encode(&vals, rb)
            })?;
            self.stage_q.resize(n * h * dim, bf16::ZERO);
            self.stage_w.resize(n * h, 0.0);
            let qs = self.stage_q.par_chunks_mut((h * dim).max(1)).zip(self.stage_w.par_chunks_mut(h.max(1)));
            qs.zip(running.par_iter()).for_each(|((q, w), r)| {
                let mut qf = vec![0f32; h * dim];
                wl.indexer_query(r.spec.id.0, l, &r.drift, &mut qf, w);
                q.iter_mut().zip(&qf).for_each(|(o, x)| *o = bf16::from_f32(*x));
            });
            fit(mem, &mut self.index_q, self.stage_q.len())?;
            mem.write(&mut self.index_q, 0, &self.stage_q)?;
            fit(mem, &mut self.index_w, self.stage_w.len())?;
            mem.write(&mut self.index_w, 0, &self.stage_w)?;
        } else {
            // A shared layer (IndexShare) has no keys or queries: the last full layer's stay.
            rows.zip(running.par_iter()).try_for_each(|(rb, r)| {
                let mut vals = vec![0f32; g.d_qk()];
                wl.kv_row(r.spec.id.0, l, r.seq_len, &mut vals);
                kv_row.encode(&vals, rb)
            })?;
        }
        for (buf, host) in [(&mut self.keys, &self.stage_keys), (&mut self.rows, &self.stage_rows)] {
            fit(mem, buf, host.len())?;
            mem.write(buf, 0, host)?;
        }
        // Attention queries are generated where the kernels run.
        fit(mem, &mut self.attn_q, n * g.q_heads * g.d_qk())?;
        let seeds: Vec<u64> = running.iter().map(|r| wl.attention_query_seed(r.spec.id.0, l, r.drift.step)).collect();
        cache.backend().fill_unit_bf16(&seeds, g.q_heads * g.d_qk(), &mut self.attn_q)?;
        fit(mem, &mut self.out, n * g.q_heads * g.d_v())?;
        fit(mem, &mut self.lse, n * g.q_heads)?;
        Ok(())
    }
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Every layer of the step through the cache's [`crate::DecodeStep`].
    pub(super) fn host_step(&mut self, rep: &mut StepReport) -> Result<()> {
        let ids: Vec<RequestId> = self.running.iter().map(|r| r.spec.id).collect();
        let mut inp = match self.host_inputs.take() {
            Some(i) => i,
            None => HostPathInputs::new(self.cache.backend().memory())?,
        };
        let Engine { cache, workload, running, model, trace, cfg, step, capture_next, .. } = self;
        let (layers, capture) = (cfg.geometry.layers, *capture_next);
        let mut ds = cache.begin_step(&ids)?;
        let mut run = || -> Result<()> {
            for l in 0..layers {
                let t = Instant::now();
                inp.generate(ds.cache(), workload, running, l)?;
                rep.metrics.stages.workload += secs(t);
                let full = cfg.geometry.is_full(l);
                let inputs = LayerInputs {
                    index_queries: full.then_some(&inp.index_q),
                    index_weights: full.then_some(&inp.index_w),
                    new_index_keys: full.then_some(&inp.keys),
                    attention_queries: &inp.attn_q,
                    new_kv_rows: &inp.rows,
                };
                ds.layer(l, &inputs, &mut inp.out, &mut inp.lse)?;
                if let Some(m) = model.as_mut() {
                    let t = Instant::now();
                    m.launch(l, running.len(), ds.cache().backend())?;
                    rep.metrics.stages.model += secs(t);
                }
                let view = ds.view();
                if let Some(tr) = trace.as_mut() {
                    write_trace(tr, *step, l, &ids, &view)?;
                }
                let c = ds.cache();
                if capture {
                    let t = LayerTensors {
                        index_q: &inp.index_q,
                        index_w: &inp.index_w,
                        attn_q: &inp.attn_q,
                        out: &inp.out,
                        lse: &inp.lse,
                    };
                    rep.dump.push(dump_layer(c, l, &ids, &view, &t)?);
                }
                if cfg.capture_digests {
                    let mem = c.backend().memory();
                    push_digests(&cfg.geometry, running, l, &mem.download(&inp.out)?, &mem.download(&inp.lse)?, rep);
                }
            }
            Ok(())
        };
        let res = run();
        let done = res.and_then(|()| ds.end());
        self.host_inputs = Some(inp);
        rep.metrics.absorb(&done?);
        Ok(())
    }
}

/// Writes the selection of every request of `ids` at layer `l` into the trace.
pub(super) fn write_trace<W: std::io::Write, M: DeviceMemory>(
    tr: &mut TraceWriter<W>,
    step: u64,
    l: usize,
    ids: &[RequestId],
    view: &LayerView<'_, M>,
) -> Result<()> {
    for ((id, q), s) in ids.iter().zip(view.requests).zip(view.spans) {
        tr.write(&TraceRecord {
            step: step as u32,
            request: id.0,
            layer: l as u32,
            seq_len: q.seq_len as u32,
            selected: view.selections[s.offset..s.end()].to_vec(),
            ..TraceRecord::default()
        })?;
    }
    Ok(())
}

/// A digest of every running request's attention output and LSE of layer `l`.
pub(super) fn push_digests(
    g: &hisparse_memory::KvGeometry,
    running: &[Running],
    l: usize,
    out: &[f32],
    lse: &[f32],
    rep: &mut StepReport,
) {
    let (qh, per) = (g.q_heads, g.q_heads * g.d_v());
    for (i, r) in running.iter().enumerate() {
        let d = digest(&out[i * per..(i + 1) * per], &lse[i * qh..(i + 1) * qh]);
        rep.digests.push((r.spec.id, r.generated as u32, l as u32, d));
    }
}

/// A layer's query and output tensors, for a dump.
pub(super) struct LayerTensors<'a, M: DeviceMemory> {
    pub index_q: &'a M::Buffer<bf16>,
    pub index_w: &'a M::Buffer<f32>,
    pub attn_q: &'a M::Buffer<bf16>,
    pub out: &'a M::Buffer<f32>,
    pub lse: &'a M::Buffer<f32>,
}

/// Every input and output of layer `l` (`hisparse dump-step`).
pub(super) fn dump_layer<B: Backend>(
    cache: &KvCache<B>,
    l: usize,
    ids: &[RequestId],
    view: &LayerView<'_, B::Memory>,
    t: &LayerTensors<'_, B::Memory>,
) -> Result<LayerDump>
where
    B::Memory: Clone,
{
    let mem = cache.backend().memory();
    let g = &cache.config().geometry;
    let resident = cache.config().mode == Mode::Resident;
    let rows = mem.download(if resident { cache.device.kv(l) } else { cache.device.hot(l) })?;
    let (kv_row, key) = cache.layouts();
    let rb = kv_row.row_bytes();
    let bad = |what: &str, x: i64| EngineError::Config {
        field: "dump",
        value: x.to_string(),
        reason: format!("{what} outside its pool"),
    };
    let selected_rows = view
        .locations
        .iter()
        .map(|&x| {
            let r = usize::try_from(x).map_err(|_| bad("a location", i64::from(x)))?;
            rows.get(r * rb..(r + 1) * rb).ok_or_else(|| bad("a location", i64::from(x)))
        })
        .collect::<Result<Vec<_>>>()?
        .concat();
    // Every position's index key, through the requests' page tables. A shared layer's
    // selection (and scores) are its full layer's: so are the keys shown.
    let slot = g.index_slot(g.index_source(l)).unwrap_or(0);
    let (keys, table) = (mem.download(cache.device.keys(slot))?, mem.download(view.page_table)?);
    let (kb, p) = (key.row_bytes(), cache.config().hisparse.page_tokens);
    let mut index_keys = Vec::new();
    for r in view.requests {
        for t in 0..r.seq_len {
            let page = *table.get(r.first_page + t / p).ok_or_else(|| bad("a page", t as i64))? as usize;
            let row = page * p + t % p;
            index_keys
                .extend_from_slice(keys.get(row * kb..(row + 1) * kb).ok_or_else(|| bad("a key row", row as i64))?);
        }
    }
    let total: usize = view.requests.iter().map(|r| r.seq_len).sum();
    let mut scores = mem.download(view.scores)?;
    scores.truncate(total);
    Ok(LayerDump {
        layer: l as u32,
        requests: ids.iter().map(|id| id.0).collect(),
        seq_lens: view.requests.iter().map(|r| r.seq_len as u32).collect(),
        index_queries: mem.download(t.index_q)?,
        index_weights: mem.download(t.index_w)?,
        index_keys,
        scores,
        selections: view.selections.to_vec(),
        selection_lens: view.spans.iter().map(|s| s.len as u32).collect(),
        attention_queries: mem.download(t.attn_q)?,
        locations: view.locations.to_vec(),
        selected_rows,
        out: mem.download(t.out)?,
        lse: mem.download(t.lse)?,
    })
}
