//! One layer of a decode step for the whole batch: the new token's row and key → indexer →
//! top-k → swap-in (hisparse) or rows by position (resident) → sparse attention → backup.
//! Kernel stages time the backend call alone; generating the emulated model's data counts as
//! `workload`; the rest of what happens here is the engine's bookkeeping.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::{AttentionBatch, Backend, IndexerBatch, Span};
use hisparse_memory::{DeviceMemory, Mode};
use hisparse_policy::trace::TraceRecord;
use hisparse_policy::{EvictionPolicy, StepCtx, SwapInPlan, copy_missing_rows};

use super::Engine;
use super::step::{LayerDump, StepBatch, StepReport, digest, secs};
use crate::error::{EngineError, Result};

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// One layer of the step for the whole batch.
    pub(super) fn layer(
        &mut self,
        l: usize,
        policy: &dyn EvictionPolicy,
        sb: &mut StepBatch<B::Memory>,
        rep: &mut StepReport,
    ) -> Result<()> {
        let g = &self.cfg.geometry;
        let (b, k, p_tok) = (self.cfg.hisparse.device_buffer_size, g.top_k, self.cfg.hisparse.page_tokens);
        let (h, dim, qh, d_qk) = (g.index_heads, g.index_dim, g.q_heads, g.d_qk());
        let (kv_row, key) = (self.kv_row, self.key);
        let mode = self.cfg.mode;
        let mem = self.backend.memory().clone();
        let m = &mut rep.metrics;

        // 1. The new token's row and key.
        let mut new_rows = Vec::with_capacity(self.running.len());
        let mut vals = vec![0f32; d_qk];
        let mut kvals = vec![0f32; dim];
        let mut kbytes = vec![0u8; key.row_bytes()];
        for r in &self.running {
            let (id, p) = (r.spec.id, r.seq_len);
            let t = Instant::now();
            self.workload.index_key(id.0, l, p, &mut kvals);
            key.encode(&kvals, &mut kbytes)?;
            self.workload.kv_row(id.0, l, p, &mut vals);
            let mut row = vec![0u8; kv_row.row_bytes()];
            kv_row.encode(&vals, &mut row)?;
            m.stages.workload += secs(t);
            let t = Instant::now();
            self.device.write_index_key(id, l, p, &kbytes)?;
            match mode {
                Mode::Resident => self.device.write_kv_row(id, l, p, &row)?,
                Mode::HiSparse => {
                    let slot = if p < b { p } else { b };
                    if slot == b {
                        // The reserved slot's previous token must be safe in the host tier first.
                        let tw = Instant::now();
                        if let Some(bk) = &self.backup {
                            bk.wait(r.last_backup[l])?;
                        }
                        m.stages.backup += secs(tw);
                    }
                    self.device.write_hot_row(id, l, slot, &row)?;
                }
            }
            m.stages.append += secs(t);
            if mode == Mode::HiSparse {
                new_rows.push(row);
            }
        }

        // 2. Indexer over every position of every request (queries: the emulated model's).
        let t = Instant::now();
        let mut q = vec![0f32; h * dim];
        let mut w = vec![0f32; h];
        sb.stage_q.clear();
        sb.stage_w.clear();
        for r in &self.running {
            self.workload.indexer_query(r.spec.id.0, l, &r.drift, &mut q, &mut w);
            sb.stage_q.extend(q.iter().map(|x| bf16::from_f32(*x)));
            sb.stage_w.extend_from_slice(&w);
        }
        mem.write(&mut sb.index_q, 0, &sb.stage_q)?;
        mem.write(&mut sb.index_w, 0, &sb.stage_w)?;
        m.stages.workload += secs(t);
        {
            let _s = tracing::debug_span!("indexer", layer = l).entered();
            let batch = IndexerBatch {
                heads: h,
                key_layout: key,
                queries: &sb.index_q,
                weights: &sb.index_w,
                keys: self.device.keys(l),
                page_tokens: p_tok,
                page_table: &sb.table,
                requests: &sb.reqs,
            };
            let t = Instant::now();
            self.backend.indexer_scores(&batch, &mut sb.scores)?;
            m.stages.indexer += secs(t);
        }
        // The newest token is always attended to.
        for r in &sb.reqs {
            mem.write(&mut sb.scores, r.score_offset + r.seq_len - 1, &[f32::INFINITY])?;
        }

        // 3. Top-k for the requests longer than k; shorter ones select everything.
        if !sb.spans.is_empty() {
            let _s = tracing::debug_span!("top_k", layer = l).entered();
            let t = Instant::now();
            self.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.top)?;
            m.stages.top_k += secs(t);
        }
        mem.read(&sb.top, 0, &mut sb.stage_top)?;
        let top = &sb.stage_top;
        sb.selections.clear();
        sb.sel_spans.clear();
        let mut j = 0;
        for (i, r) in sb.reqs.iter().enumerate() {
            let start = sb.selections.len();
            if sb.long.get(j) == Some(&i) {
                sb.selections.extend(top[j * k..(j + 1) * k].iter().map(|&x| x as u32));
                j += 1;
            } else {
                sb.selections.extend(0..r.seq_len as u32);
            }
            sb.sel_spans.push(Span::new(start, sb.selections.len() - start));
        }

        // 4. Swap-in (hisparse) or rows by position (resident).
        let t = Instant::now();
        sb.locations.clear();
        let mut plan = SwapInPlan::default();
        for (i, span) in sb.sel_spans.iter().enumerate() {
            let sel = &sb.selections[span.offset..span.end()];
            let (id, n) = (self.running[i].spec.id, sb.reqs[i].seq_len);
            match mode {
                Mode::Resident => {
                    for &tok in sel {
                        sb.locations.push(self.device.kv_row(id, tok as usize)? as i32);
                    }
                    m.hits += sel.len() as u64;
                }
                Mode::HiSparse => {
                    let r = &mut self.running[i];
                    let ctx = StepCtx {
                        step: r.generated as u32 + 1,
                        layer: l as u32,
                        request: id.0,
                        buffer_slots: b as u32,
                        seed: policy.seed(),
                    };
                    r.swap[l].step(policy, sel, n, &ctx, None, &mut plan)?;
                    let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                    m.bytes_h2d += copy_missing_rows(&plan, host, &mut self.device, id, l)? as u64;
                    m.hits += plan.hits.len() as u64;
                    m.misses += plan.misses.len() as u64;
                    m.max_misses = m.max_misses.max(plan.misses.len() as u64);
                    let base = self.device.hot_row(id, 0)? as i32;
                    sb.locations.extend(plan.locations.iter().map(|&slot| base + slot as i32));
                }
            }
            if let Some(tr) = self.trace.as_mut() {
                tr.write(&TraceRecord {
                    step: self.step as u32,
                    request: id.0,
                    layer: l as u32,
                    seq_len: n as u32,
                    selected: sel.to_vec(),
                    scores: None,
                })?;
            }
        }
        m.stages.swap_in += secs(t);

        // 5. Attention (queries: the emulated model's).
        let t = Instant::now();
        let mut aq = vec![0f32; qh * d_qk];
        sb.stage_q.clear();
        for r in &self.running {
            self.workload.attention_query(r.spec.id.0, l, r.drift.step, &mut aq);
            sb.stage_q.extend(aq.iter().map(|x| bf16::from_f32(*x)));
        }
        mem.write(&mut sb.attn_q, 0, &sb.stage_q)?;
        m.stages.workload += secs(t);
        mem.write(&mut sb.locs, 0, &sb.locations)?;
        {
            let _s = tracing::debug_span!("attention", layer = l).entered();
            let rows = if mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
            let batch = AttentionBatch {
                heads: qh,
                layout: kv_row,
                softmax_scale: g.default_softmax_scale(),
                queries: &sb.attn_q,
                rows,
                locations: &sb.locs,
                selections: &sb.sel_spans,
            };
            let t = Instant::now();
            self.backend.sparse_attention(&batch, &mut sb.out, &mut sb.lse)?;
            m.stages.attention += secs(t);
        }
        if self.capture_next {
            self.dump_layer(l, sb, rep)?;
        }
        if self.cfg.capture_digests {
            let (out, lse) = (mem.download(&sb.out)?, mem.download(&sb.lse)?);
            let per = qh * g.d_v();
            for (i, r) in self.running.iter().enumerate() {
                let d = digest(&out[i * per..(i + 1) * per], &lse[i * qh..(i + 1) * qh]);
                rep.digests.push((r.spec.id, r.generated as u32, l as u32, d));
            }
        }

        // 6. Backup of the new rows (hisparse).
        let m = &mut rep.metrics;
        if let (Some(bk), Some(host)) = (self.backup.as_mut(), self.host.as_ref()) {
            let t = Instant::now();
            for (r, row) in self.running.iter_mut().zip(new_rows) {
                let at = host.locate(r.spec.id, l, r.seq_len)?;
                m.bytes_d2h += row.len() as u64;
                r.last_backup[l] = bk.submit(at, row)?;
            }
            m.stages.backup += secs(t);
        }
        Ok(())
    }

    /// Copies every input and output of layer `l` into the report (`hisparse dump-step`).
    fn dump_layer(&self, l: usize, sb: &StepBatch<B::Memory>, rep: &mut StepReport) -> Result<()> {
        let mem = self.backend.memory();
        let rows = if self.cfg.mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
        let rows = mem.download(rows)?;
        let rb = self.kv_row.row_bytes();
        rep.dump.push(LayerDump {
            layer: l as u32,
            requests: self.running.iter().map(|r| r.spec.id.0).collect(),
            seq_lens: sb.reqs.iter().map(|r| r.seq_len as u32).collect(),
            index_queries: mem.download(&sb.index_q)?,
            index_weights: mem.download(&sb.index_w)?,
            scores: mem.download(&sb.scores)?,
            selections: sb.selections.clone(),
            selection_lens: sb.sel_spans.iter().map(|s| s.len as u32).collect(),
            attention_queries: mem.download(&sb.attn_q)?,
            selected_rows: sb
                .locations
                .iter()
                .flat_map(|&x| rows[x as usize * rb..(x as usize + 1) * rb].iter().copied())
                .collect(),
            out: mem.download(&sb.out)?,
            lse: mem.download(&sb.lse)?,
        });
        Ok(())
    }
}
