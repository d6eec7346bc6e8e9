//! One layer of a decode step for the whole batch: the new token's row and key → indexer →
//! top-k → swap-in (hisparse) or rows by position (resident) → sparse attention → backup.
//! Kernel stages time the backend call alone; generating the emulated model's data counts as
//! `workload`; the rest of what happens here is the engine's bookkeeping.

use std::time::Instant;

use hisparse_kernels::{AttentionBatch, Backend, IndexerBatch, Span};
use hisparse_memory::{DeviceMemory, Mode};
use hisparse_policy::prefetch::When;
use hisparse_policy::trace::TraceRecord;
use hisparse_policy::{EvictionPolicy, StepCtx, SwapInPlan, SwapInputs, copy_missing_rows};

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
        // 1. The new token's row and key.
        let new_rows = self.append_tokens(l, &mut rep.metrics)?;
        let g = &self.cfg.geometry;
        let (b, k, p_tok) = (self.cfg.hisparse.device_buffer_size, g.top_k, self.cfg.hisparse.page_tokens);
        let (h, qh) = (g.index_heads, g.q_heads);
        let (full, scale) = (g.index_slot(l), g.default_softmax_scale());
        let (kv_row, key) = (self.kv_row, self.key);
        let mode = self.cfg.mode;
        let mem = self.backend.memory().clone();
        let m = &mut rep.metrics;

        // 2. Indexer over every position of every request (queries: the emulated model's); a
        // shared layer (IndexShare) runs none and keeps its full layer's selection (the last
        // one made: layers run in order).
        if let Some(slot) = full {
            self.stage_index_queries(l, sb, m)?;
            let _s = tracing::debug_span!("indexer", layer = l).entered();
            let batch = IndexerBatch {
                heads: h,
                key_layout: key,
                queries: &sb.index_q,
                weights: &sb.index_w,
                keys: self.device.keys(slot),
                page_tokens: p_tok,
                page_table: &sb.table,
                requests: &sb.reqs,
                pin_newest: true,
            };
            let t = Instant::now();
            self.backend.indexer_scores(&batch, &mut sb.scores)?;
            m.stages.indexer += secs(t);
        }

        // 3. Top-k for the requests longer than k; shorter ones select everything.
        if full.is_some() && !sb.spans.is_empty() {
            let _s = tracing::debug_span!("top_k", layer = l).entered();
            let t = Instant::now();
            self.backend.top_k(&sb.scores, &sb.spans, k, &mut sb.top)?;
            m.stages.top_k += secs(t);
        }
        if full.is_some() {
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
        }

        // 4. Swap-in (hisparse) or rows by position (resident).
        let t = Instant::now();
        sb.locations.clear();
        let mut plan = SwapInPlan::default();
        // Scores for policies and prefetchers that read them (a shared layer's are its full
        // layer's).
        let hs = mode == Mode::HiSparse;
        let scores = if hs && (policy.needs_scores() || self.prefetcher.needs_near()) {
            Some(mem.download(&sb.scores)?)
        } else {
            None
        };
        for (i, span) in sb.sel_spans.iter().enumerate() {
            let sel = &sb.selections[span.offset..span.end()];
            let (id, n) = (self.running[i].spec.id, sb.reqs[i].seq_len);
            let off = sb.reqs[i].score_offset;
            let own_scores = scores.as_ref().and_then(|s| s.get(off..off + n));
            match mode {
                Mode::Resident => {
                    for &tok in sel {
                        sb.locations.push(self.device.kv_row(id, tok as usize)? as i32);
                    }
                    m.hits += sel.len() as u64;
                }
                Mode::HiSparse => {
                    // Rows nominated for this layer earlier in the step come in first.
                    self.apply_prefetch(i, Some(l), When::ThisStep, policy, own_scores, m)?;
                    let r = &mut self.running[i];
                    let ctx = StepCtx {
                        step: r.generated as u32 + 1,
                        layer: l as u32,
                        request: id.0,
                        buffer_slots: b as u32,
                        seed: policy.seed(),
                    };
                    let inputs = SwapInputs { next_use: None, scores: own_scores };
                    r.swap[l].step(policy, sel, n, &ctx, inputs, &mut plan)?;
                    let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                    m.bytes_h2d += copy_missing_rows(&plan, host, &mut self.device, id, l)? as u64;
                    m.hits += plan.hits.len() as u64;
                    m.misses += plan.misses.len() as u64;
                    m.max_misses = m.max_misses.max(plan.misses.len() as u64);
                    m.prefetch_useful += plan.prefetch_used as u64;
                    m.prefetch_wasted += plan.prefetch_wasted as u64;
                    let base = self.device.hot_row(id, 0)? as i32;
                    sb.locations.extend(plan.locations.iter().map(|&slot| base + slot as i32));
                    self.nominate(i, l, sel, own_scores);
                }
            }
            if let Some(tr) = self.trace.as_mut() {
                tr.write(&TraceRecord {
                    step: self.step as u32,
                    request: id.0,
                    layer: l as u32,
                    seq_len: n as u32,
                    selected: sel.to_vec(),
                    ..TraceRecord::default()
                })?;
            }
        }
        m.stages.swap_in += secs(t);

        // 5. Attention (queries: the emulated model's).
        self.stage_attention_queries(l, sb, m)?;
        mem.write(&mut sb.locs, 0, &sb.locations)?;
        {
            let _s = tracing::debug_span!("attention", layer = l).entered();
            let rows = if mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
            let batch = AttentionBatch {
                heads: qh,
                layout: kv_row,
                softmax_scale: scale,
                queries: &sb.attn_q,
                rows,
                locations: &sb.locs,
                selections: &sb.sel_spans,
            };
            let t = Instant::now();
            self.backend.sparse_attention(&batch, &mut sb.out, &mut sb.lse)?;
            m.stages.attention += secs(t);
        }
        // 6. The emulated model's GEMMs; dump, digests, backup of the new rows (hisparse).
        self.launch_model_layer(l, &mut rep.metrics)?;
        self.finish_layer(l, &new_rows, sb, rep, true)
    }

    /// The end of a layer on either path: the dump and digests when asked for, and the new rows
    /// queued for backup to the host tier (hisparse).
    pub(super) fn finish_layer(
        &mut self,
        l: usize,
        new_rows: &[u8],
        sb: &StepBatch<B::Memory>,
        rep: &mut StepReport,
        outputs: bool,
    ) -> Result<()> {
        if self.capture_next {
            self.dump_layer(l, sb, rep)?;
        }
        if self.cfg.capture_digests && outputs {
            let mem = self.backend.memory();
            let (out, lse) = match (sb.layer_out.get(l), sb.layer_lse.get(l)) {
                (Some(o), Some(s)) => (mem.download(o)?, mem.download(s)?),
                _ => (mem.download(&sb.out)?, mem.download(&sb.lse)?),
            };
            let qh = self.cfg.geometry.q_heads;
            let per = qh * self.cfg.geometry.d_v();
            for (i, r) in self.running.iter().enumerate() {
                let d = digest(&out[i * per..(i + 1) * per], &lse[i * qh..(i + 1) * qh]);
                rep.digests.push((r.spec.id, r.generated as u32, l as u32, d));
            }
        }
        let m = &mut rep.metrics;
        if let (Some(bk), Some(host)) = (self.backup.as_mut(), self.host.as_ref()) {
            let t = Instant::now();
            for (r, row) in self.running.iter_mut().zip(new_rows.chunks_exact(self.kv_row.row_bytes().max(1))) {
                let row = row.to_vec();
                let at = host.locate(r.spec.id, l, r.seq_len)?;
                m.bytes_d2h += row.len() as u64;
                r.last_backup[l] = bk.submit(at, row)?;
            }
            m.stages.backup += secs(t);
        }
        Ok(())
    }

    /// Copies every input and output of layer `l` into the report (`hisparse dump-step`).
    pub(super) fn dump_layer(&self, l: usize, sb: &StepBatch<B::Memory>, rep: &mut StepReport) -> Result<()> {
        let mem = self.backend.memory();
        let rows = if self.cfg.mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
        let rows = mem.download(rows)?;
        let rb = self.kv_row.row_bytes();
        let bad = |what: &str, x: i64| EngineError::Config {
            field: "dump",
            value: x.to_string(),
            reason: format!("{what} outside its pool"),
        };
        let selected_rows = sb
            .locations
            .iter()
            .map(|&x| {
                let r = usize::try_from(x).map_err(|_| bad("a location", i64::from(x)))?;
                rows.get(r * rb..(r + 1) * rb).ok_or_else(|| bad("a location", i64::from(x)))
            })
            .collect::<Result<Vec<_>>>()?
            .concat();
        // Every position's index key, through the requests' page tables.
        // A shared layer's selection (and scores) are its full layer's: so are the keys shown.
        let slot = self.cfg.geometry.index_slot(self.cfg.geometry.index_source(l)).unwrap_or(0);
        let (keys, table) = (mem.download(self.device.keys(slot))?, mem.download(&sb.table)?);
        let (kb, p) = (self.key.row_bytes(), self.cfg.hisparse.page_tokens);
        let mut index_keys = Vec::new();
        for r in &sb.reqs {
            for t in 0..r.seq_len {
                let page = *table.get(r.first_page + t / p).ok_or_else(|| bad("a page", t as i64))? as usize;
                let row = page * p + t % p;
                index_keys
                    .extend_from_slice(keys.get(row * kb..(row + 1) * kb).ok_or_else(|| bad("a key row", row as i64))?);
            }
        }
        let total: usize = sb.reqs.iter().map(|r| r.seq_len).sum();
        let mut scores = mem.download(&sb.scores)?;
        scores.truncate(total);
        rep.dump.push(LayerDump {
            layer: l as u32,
            requests: self.running.iter().map(|r| r.spec.id.0).collect(),
            seq_lens: sb.reqs.iter().map(|r| r.seq_len as u32).collect(),
            index_queries: match sb.inputs.layers.get(l) {
                Some(inp) if self.device_path => mem.download(&inp.index_q)?,
                _ => mem.download(&sb.index_q)?,
            },
            index_weights: match sb.inputs.layers.get(l) {
                Some(inp) if self.device_path => mem.download(&inp.index_w)?,
                _ => mem.download(&sb.index_w)?,
            },
            index_keys,
            scores,
            selections: sb.selections.clone(),
            selection_lens: sb.sel_spans.iter().map(|s| s.len as u32).collect(),
            attention_queries: mem.download(&sb.attn_q)?,
            locations: sb.locations.clone(),
            selected_rows,
            out: mem.download(sb.layer_out.get(l).unwrap_or(&sb.out))?,
            lse: mem.download(sb.layer_lse.get(l).unwrap_or(&sb.lse))?,
        });
        Ok(())
    }
}
