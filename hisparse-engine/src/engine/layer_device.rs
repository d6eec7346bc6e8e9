//! The decode step on a backend that keeps selections on the device (CUDA): every kernel of a
//! layer is launched back to back with no host round trip — new rows and keys in one batched
//! write each, indexer (newest pinned), top-k, then the device swap-in (hisparse) or rows by
//! position through the page table (resident), then attention. The host only prepares inputs;
//! hit and miss counts and the stages' device times are read once at the end of the step.

use std::time::Instant;

use hisparse_kernels::{
    AttentionBatch, Backend, DeviceSwapIn, DeviceSwapReq, IndexerBatch, IndexerRequest, KernelStage,
};
use hisparse_memory::{DeviceMemory, Mode, RequestId};

use super::Engine;
use super::layer::{LayerTensors, dump_layer, push_digests, write_trace};
use super::step::{StepBatch, StepReport, secs};
use crate::cache::LayerView;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Device path, once per step: the resident page table; the device swap-in's requests.
    pub(super) fn plan_device_step(&mut self, reqs: &[IndexerRequest], sb: &mut StepBatch<B::Memory>) -> Result<()> {
        let (k, b) = (self.cfg.geometry.top_k, self.cfg.hisparse.device_buffer_size);
        match self.cfg.mode {
            Mode::Resident => {
                let (mut table, mut first) = (Vec::new(), Vec::with_capacity(reqs.len()));
                for r in &self.running {
                    first.push(table.len());
                    table.extend_from_slice(self.cache.device.kv_pages(r.spec.id)?);
                }
                let mem = self.cache.backend.memory();
                if mem.len(&sb.kv_table) < table.len().max(1) {
                    sb.kv_table = mem.alloc_zeroed(table.len().max(1).next_power_of_two())?;
                }
                mem.write(&mut sb.kv_table, 0, &table)?;
                sb.kv_first = first;
            }
            Mode::HiSparse => {
                let host = self.cache.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                let (mut dreqs, mut pages) = (Vec::with_capacity(reqs.len()), Vec::new());
                for (i, (r, q)) in self.running.iter().zip(reqs).enumerate() {
                    let seat = self.cache.device.hot_row(r.spec.id, 0)? / (b + 1);
                    dreqs.push(DeviceSwapReq {
                        seat: seat as u32,
                        seq_len: q.seq_len as u32,
                        step: r.generated as u32 + 1,
                        sel_offset: (i * k) as u32,
                        sel_len: q.seq_len.min(k) as u32,
                        page_offset: pages.len() as u32,
                        score_offset: q.score_offset as u32,
                        pad: 0,
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
        if let Some(s) = self.cache.backend.finish_step()? {
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
        let (h, mode) = (g.index_heads, self.cfg.mode);
        let mem = self.cache.backend.memory().clone();
        let inp = &sb.inputs.layers[l];
        let full = g.index_slot(l);
        let t = Instant::now();
        if let Some(slot) = full {
            self.cache.backend.write_rows_packed(
                self.cache.device.keys_mut(slot),
                self.cache.key.row_bytes(),
                n,
                &inp.keys,
            )?;
        }
        let pool = if mode == Mode::Resident { self.cache.device.kv_mut(l) } else { self.cache.device.hot_mut(l) };
        self.cache.backend.write_rows_packed(pool, self.cache.kv_row.row_bytes(), n, &inp.rows)?;
        m.stages.append += secs(t);

        // Indexer (the newest token pinned to +inf), then top-k into the selection buffer; a
        // shared layer (IndexShare) runs neither and keeps its full layer's selection there
        // (the last one made: layers run in order).
        let Some(slot) = full else {
            return self.launch_swap_and_attention(l, sb, m);
        };
        let batch = IndexerBatch {
            heads: h,
            key_layout: self.cache.key,
            queries: &inp.index_q,
            weights: &inp.index_w,
            keys: self.cache.device.keys(slot),
            page_tokens: p_tok,
            page_table: &sb.table,
            requests: &sb.reqs,
            pin_newest: true,
        };
        let t = Instant::now();
        self.cache.backend.mark_stage(KernelStage::Indexer, true)?;
        self.cache.backend.indexer_scores(&batch, &mut sb.scores)?;
        self.cache.backend.mark_stage(KernelStage::Indexer, false)?;
        m.stages.indexer += secs(t);
        if !sb.spans.is_empty() {
            let t = Instant::now();
            self.cache.backend.mark_stage(KernelStage::TopK, true)?;
            if sb.long.len() == sb.reqs.len() {
                // Every request is long: request j of the top-k is request j of the batch.
                self.cache.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.sel)?;
            } else {
                self.cache.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.top)?;
                mem.read(&sb.top, 0, &mut sb.stage_top)?;
                for (j, &i) in sb.long.iter().enumerate() {
                    sb.sel_template[i * k..(i + 1) * k].copy_from_slice(&sb.stage_top[j * k..(j + 1) * k]);
                }
                mem.write(&mut sb.sel, 0, &sb.sel_template)?;
            }
            self.cache.backend.mark_stage(KernelStage::TopK, false)?;
            m.stages.top_k += secs(t);
        }
        self.launch_swap_and_attention(l, sb, m)
    }

    /// The rest of layer `l`'s launches: swap-in or rows by position, attention queries,
    /// attention, the emulated model's GEMMs.
    fn launch_swap_and_attention(
        &mut self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let g = &self.cfg.geometry;
        let (p_tok, qh, mode) = (self.cfg.hisparse.page_tokens, g.q_heads, self.cfg.mode);
        let inp = &sb.inputs.layers[l];

        // Swap-in (hisparse) or rows by position (resident).
        let t = Instant::now();
        self.cache.backend.mark_stage(KernelStage::SwapIn, true)?;
        match (mode, self.dswap.as_mut()) {
            (Mode::HiSparse, Some(d)) => {
                let scores = self.last_policy.needs_scores().then_some(&sb.scores);
                d.launch(l, &sb.sel, scores, self.cache.device.hot_mut(l), &mut sb.locs)?
            }
            (Mode::HiSparse, None) => return Err(EngineError::Worker("no device swap-in".into())),
            (Mode::Resident, _) => {
                self.cache.backend.locate_rows(
                    &sb.sel,
                    &sb.sel_dev_spans,
                    &sb.kv_table,
                    &sb.kv_first,
                    p_tok,
                    &mut sb.locs,
                )?;
            }
        }
        self.cache.backend.mark_stage(KernelStage::SwapIn, false)?;
        m.stages.swap_in += secs(t);

        // Attention.
        let t = Instant::now();
        self.cache.backend.fill_unit_bf16_seeded(&inp.seeds, g.q_heads * g.d_qk(), &mut sb.attn_q)?;
        m.stages.workload += secs(t);
        let rows = if mode == Mode::Resident { self.cache.device.kv(l) } else { self.cache.device.hot(l) };
        let batch = AttentionBatch {
            heads: qh,
            layout: self.cache.kv_row,
            softmax_scale: g.default_softmax_scale(),
            queries: &sb.attn_q,
            rows,
            locations: &sb.locs,
            selections: &sb.sel_dev_spans,
        };
        let t = Instant::now();
        self.cache.backend.mark_stage(KernelStage::Attention, true)?;
        // With digests, every layer keeps its own output (a replayed graph would otherwise leave
        // only the last layer's).
        match (sb.layer_out.get_mut(l), sb.layer_lse.get_mut(l)) {
            (Some(out), Some(lse)) => self.cache.backend.sparse_attention(&batch, out, lse)?,
            _ => self.cache.backend.sparse_attention(&batch, &mut sb.out, &mut sb.lse)?,
        }
        self.cache.backend.mark_stage(KernelStage::Attention, false)?;
        m.stages.attention += secs(t);
        self.launch_model_layer(l, m)
    }

    /// The emulated model's GEMMs of layer `l` for the running batch, if it is emulated.
    pub(super) fn launch_model_layer(&mut self, l: usize, m: &mut StepMetrics) -> Result<()> {
        let n = self.running.len();
        if let Some(model) = self.model.as_mut() {
            let t = Instant::now();
            self.cache.backend.mark_stage(KernelStage::Model, true)?;
            model.launch(l, n, &self.cache.backend)?;
            self.cache.backend.mark_stage(KernelStage::Model, false)?;
            m.stages.model += secs(t);
        }
        Ok(())
    }

    /// The host's part of layer `l` after its launches: the trace and dump (which read the
    /// device), the resident mode's hit count, digests, and the new rows queued for backup to the
    /// host tier (hisparse). `outputs`: whether
    /// the attention output buffers hold this layer's output (not so for a replayed layer other
    /// than the last).
    pub(super) fn after_layer_device(
        &mut self,
        l: usize,
        sb: &mut StepBatch<B::Memory>,
        rep: &mut StepReport,
        outputs: bool,
    ) -> Result<()> {
        let mem = self.cache.backend.memory().clone();
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
        let ids: Vec<RequestId> = self.running.iter().map(|r| r.spec.id).collect();
        let view = LayerView {
            requests: &sb.reqs,
            page_table: &sb.table,
            scores: &sb.scores,
            selections: &sb.selections,
            spans: &sb.sel_spans,
            locations: &sb.locations,
        };
        if let Some(tr) = self.trace.as_mut() {
            write_trace(tr, self.step, l, &ids, &view)?;
        }
        if self.capture_next {
            let inp = &sb.inputs.layers[l];
            let t = LayerTensors {
                index_q: &inp.index_q,
                index_w: &inp.index_w,
                attn_q: &sb.attn_q,
                out: sb.layer_out.get(l).unwrap_or(&sb.out),
                lse: sb.layer_lse.get(l).unwrap_or(&sb.lse),
            };
            rep.dump.push(dump_layer(&self.cache, l, &ids, &view, &t)?);
        }
        if self.cfg.capture_digests && outputs {
            let (out, lse) = match (sb.layer_out.get(l), sb.layer_lse.get(l)) {
                (Some(o), Some(s)) => (mem.download(o)?, mem.download(s)?),
                _ => (mem.download(&sb.out)?, mem.download(&sb.lse)?),
            };
            push_digests(&self.cfg.geometry, &self.running, l, &out, &lse, rep);
        }
        // The new rows (made on the host with the step's inputs), queued for backup.
        let m = &mut rep.metrics;
        if let (Some(bk), Some(host)) = (self.cache.backup.as_mut(), self.cache.host.as_ref()) {
            let t = Instant::now();
            let rows = sb.inputs.host_rows(l, self.running.len());
            for (r, row) in self.running.iter().zip(rows.chunks_exact(self.cache.kv_row.row_bytes().max(1))) {
                let at = host.locate(r.spec.id, l, r.seq_len)?;
                m.bytes_d2h += row.len() as u64;
                let seq = bk.submit(at, row.to_vec())?;
                if let Some(c) = self.cache.requests.get_mut(&r.spec.id) {
                    c.last_backup[l] = seq;
                }
            }
            m.stages.backup += secs(t);
        }
        Ok(())
    }
}
