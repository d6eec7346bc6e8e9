//! The decode step on a backend that keeps selections on the device (CUDA): every kernel of a
//! layer is launched back to back with no host round trip — new rows and keys in one batched
//! write each, indexer (newest pinned), top-k, then the device swap-in (hisparse) or rows by
//! position through the page table (resident), then attention. The host only prepares inputs;
//! hit and miss counts and the stages' device times are read once at the end of the step.
//! Also here: the batched append of the new tokens, shared with the host path.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::{
    AttentionBatch, Backend, DeviceSwapIn, DeviceSwapReq, IndexerBatch, IndexerRequest, KernelStage,
};
use hisparse_memory::{DeviceMemory, Mode};
use hisparse_policy::trace::TraceRecord;
use rayon::prelude::*;

use super::Engine;
use super::step::{StepBatch, StepReport, secs};
use crate::error::{EngineError, Result};
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
        let g = &self.cfg.geometry;
        let (d_qk, dim) = (g.d_qk(), g.index_dim);
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
                wl.index_key(id.0, l, p, &mut kvals);
                key.encode(&kvals, kb)?;
                wl.kv_row(id.0, l, p, &mut vals);
                kv_row.encode(&vals, rb)
            })?;
        m.stages.workload += secs(t);
        let t = Instant::now();
        let (key_rows, kv_rows) = self.new_token_rows(Some(l), m)?;
        self.backend.write_rows(self.device.keys_mut(l), key.row_bytes(), &key_rows, &keys)?;
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

    /// Device path, once per step: the resident page table; the device swap-in's requests.
    pub(super) fn plan_device_step(&mut self, reqs: &[IndexerRequest], sb: &mut StepBatch<B::Memory>) -> Result<()> {
        let (k, b) = (self.cfg.geometry.top_k, self.cfg.hisparse.device_buffer_size);
        match self.cfg.mode {
            Mode::Resident => {
                let (mut table, mut first) = (Vec::new(), Vec::with_capacity(reqs.len()));
                for r in &self.running {
                    first.push(table.len());
                    table.extend_from_slice(self.device.kv_pages(r.spec.id)?);
                }
                let mem = self.backend.memory();
                if mem.len(&sb.kv_table) < table.len().max(1) {
                    sb.kv_table = mem.alloc_zeroed(table.len().max(1).next_power_of_two())?;
                }
                mem.write(&mut sb.kv_table, 0, &table)?;
                sb.kv_first = first;
            }
            Mode::HiSparse => {
                let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                let (mut dreqs, mut pages) = (Vec::with_capacity(reqs.len()), Vec::new());
                for (i, (r, q)) in self.running.iter().zip(reqs).enumerate() {
                    let seat = self.device.hot_row(r.spec.id, 0)? / (b + 1);
                    dreqs.push(DeviceSwapReq {
                        seat: seat as u32,
                        seq_len: q.seq_len as u32,
                        step: r.generated as u32 + 1,
                        sel_offset: (i * k) as u32,
                        sel_len: q.seq_len.min(k) as u32,
                        page_offset: pages.len() as u32,
                        request: r.spec.id.0,
                    });
                    pages.extend_from_slice(host.pages(r.spec.id)?);
                }
                if let Some(d) = self.dswap.as_mut() {
                    d.begin_step(&dreqs, &pages)?;
                }
            }
        }
        Ok(())
    }

    /// Device path, end of step: the swap-in's counts and the stages' device times.
    pub(super) fn finish_device_step(&mut self, m: &mut StepMetrics) -> Result<()> {
        if let Some(d) = self.dswap.as_mut() {
            let c = d.end_step()?;
            m.hits += c.hits;
            m.misses += c.misses;
            m.max_misses = m.max_misses.max(c.max_misses);
            m.bytes_h2d += c.bytes_h2d;
        }
        if let Some(s) = self.backend.finish_step()? {
            m.stages.indexer = s.indexer;
            m.stages.top_k = s.top_k;
            m.stages.swap_in = s.swap_in;
            m.stages.attention = s.attention;
            m.stages.graph = s.graph;
            m.stages.model = s.model;
        }
        Ok(())
    }

    /// The launches of layer `l` on the device path (nothing here waits for the device, so the
    /// sequence can be captured): the new keys and rows, indexer, top-k, swap-in or rows by
    /// position, attention queries, attention.
    pub(super) fn launch_layer_device(
        &mut self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let g = &self.cfg.geometry;
        let (k, p_tok, n) = (g.top_k, self.cfg.hisparse.page_tokens, self.running.len());
        let (h, qh, mode) = (g.index_heads, g.q_heads, self.cfg.mode);
        let mem = self.backend.memory().clone();
        let inp = &sb.inputs.layers[l];
        let t = Instant::now();
        self.backend.write_rows_packed(self.device.keys_mut(l), self.key.row_bytes(), n, &inp.keys)?;
        let pool = if mode == Mode::Resident { self.device.kv_mut(l) } else { self.device.hot_mut(l) };
        self.backend.write_rows_packed(pool, self.kv_row.row_bytes(), n, &inp.rows)?;
        m.stages.append += secs(t);

        // Indexer (the newest token pinned to +inf), then top-k into the selection buffer.
        let batch = IndexerBatch {
            heads: h,
            key_layout: self.key,
            queries: &inp.index_q,
            weights: &inp.index_w,
            keys: self.device.keys(l),
            page_tokens: p_tok,
            page_table: &sb.table,
            requests: &sb.reqs,
            pin_newest: true,
        };
        let t = Instant::now();
        self.backend.mark_stage(KernelStage::Indexer, true)?;
        self.backend.indexer_scores(&batch, &mut sb.scores)?;
        self.backend.mark_stage(KernelStage::Indexer, false)?;
        m.stages.indexer += secs(t);
        if !sb.spans.is_empty() {
            let t = Instant::now();
            self.backend.mark_stage(KernelStage::TopK, true)?;
            if sb.long.len() == sb.reqs.len() {
                // Every request is long: request j of the top-k is request j of the batch.
                self.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.sel)?;
            } else {
                self.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.top)?;
                mem.read(&sb.top, 0, &mut sb.stage_top)?;
                for (j, &i) in sb.long.iter().enumerate() {
                    sb.sel_template[i * k..(i + 1) * k].copy_from_slice(&sb.stage_top[j * k..(j + 1) * k]);
                }
                mem.write(&mut sb.sel, 0, &sb.sel_template)?;
            }
            self.backend.mark_stage(KernelStage::TopK, false)?;
            m.stages.top_k += secs(t);
        }

        // Swap-in (hisparse) or rows by position (resident).
        let t = Instant::now();
        self.backend.mark_stage(KernelStage::SwapIn, true)?;
        match (mode, self.dswap.as_mut()) {
            (Mode::HiSparse, Some(d)) => d.launch(l, &sb.sel, self.device.hot_mut(l), &mut sb.locs)?,
            (Mode::HiSparse, None) => return Err(EngineError::Worker("no device swap-in".into())),
            (Mode::Resident, _) => {
                self.backend.locate_rows(
                    &sb.sel,
                    &sb.sel_dev_spans,
                    &sb.kv_table,
                    &sb.kv_first,
                    p_tok,
                    &mut sb.locs,
                )?;
            }
        }
        self.backend.mark_stage(KernelStage::SwapIn, false)?;
        m.stages.swap_in += secs(t);

        // Attention.
        let t = Instant::now();
        self.backend.fill_unit_bf16_seeded(&inp.seeds, g.q_heads * g.d_qk(), &mut sb.attn_q)?;
        m.stages.workload += secs(t);
        let rows = if mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
        let batch = AttentionBatch {
            heads: qh,
            layout: self.kv_row,
            softmax_scale: g.default_softmax_scale(),
            queries: &sb.attn_q,
            rows,
            locations: &sb.locs,
            selections: &sb.sel_dev_spans,
        };
        let t = Instant::now();
        self.backend.mark_stage(KernelStage::Attention, true)?;
        self.backend.sparse_attention(&batch, &mut sb.out, &mut sb.lse)?;
        self.backend.mark_stage(KernelStage::Attention, false)?;
        m.stages.attention += secs(t);
        self.launch_model_layer(l, m)
    }

    /// The emulated model's GEMMs of layer `l` for the running batch, if it is emulated.
    pub(super) fn launch_model_layer(&mut self, l: usize, m: &mut StepMetrics) -> Result<()> {
        let n = self.running.len();
        if let Some(model) = self.model.as_mut() {
            let t = Instant::now();
            self.backend.mark_stage(KernelStage::Model, true)?;
            model.launch(l, n, &self.backend)?;
            self.backend.mark_stage(KernelStage::Model, false)?;
            m.stages.model += secs(t);
        }
        Ok(())
    }

    /// The host's part of layer `l` after its launches: the trace and dump (which read the
    /// device), the resident mode's hit count, and [`Engine::finish_layer`]. `outputs`: whether
    /// the attention output buffers hold this layer's output (not so for a replayed layer other
    /// than the last).
    pub(super) fn after_layer_device(
        &mut self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        rep: &mut StepReport,
        outputs: bool,
    ) -> Result<()> {
        let mem = self.backend.memory().clone();
        if self.cfg.mode == Mode::Resident {
            rep.metrics.hits += sb.sel_dev_spans.iter().map(|s| s.len as u64).sum::<u64>();
        }
        if self.trace.is_some() || self.capture_next {
            let sel = mem.download(&sb.sel)?;
            sb.selections.clear();
            sb.sel_spans.clear();
            for s in &sb.sel_dev_spans {
                sb.sel_spans.push(hisparse_kernels::Span::new(sb.selections.len(), s.len));
                sb.selections.extend(sel[s.offset..s.end()].iter().map(|&x| x as u32));
            }
            let locs = mem.download(&sb.locs)?;
            sb.locations = sb.sel_dev_spans.iter().flat_map(|s| locs[s.offset..s.end()].iter().copied()).collect();
        }
        if let Some(tr) = self.trace.as_mut() {
            for ((r, q), s) in self.running.iter().zip(&sb.reqs).zip(&sb.sel_spans) {
                tr.write(&TraceRecord {
                    step: self.step as u32,
                    request: r.spec.id.0,
                    layer: l as u32,
                    seq_len: q.seq_len as u32,
                    selected: sb.selections[s.offset..s.end()].to_vec(),
                    scores: None,
                })?;
            }
        }
        let rows = if self.cfg.mode == Mode::HiSparse { sb.inputs.host_rows(l, self.running.len()) } else { &[] };
        self.finish_layer(l, rows, sb, rep, outputs)
    }
}
