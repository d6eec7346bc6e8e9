//! One layer of a decode step on the caller's tensors: the new token's index key and KV row
//! into the device tier (the reserved hot-buffer slot in hisparse mode, fenced by the backup of
//! the token it held) → indexer (the newest token pinned) → top-k for requests longer than
//! top-k → swap-in (hisparse: pending prefetches, policy decisions, missed rows host → device,
//! then the prefetcher's nominations) or rows by position (resident) → sparse attention into
//! the caller's output → the new row queued for backup to the host tier (hisparse).

use std::time::Instant;

use hisparse_kernels::{AttentionBatch, Backend, Buf, IndexerBatch, Span};
use hisparse_memory::{DeviceMemory, Mode};
use hisparse_policy::prefetch::When;
use hisparse_policy::{StepCtx, SwapInPlan, SwapInputs, copy_missing_rows};

use super::step::{DecodeStep, LayerInputs};
use crate::error::{EngineError, Result};
use crate::prefetch_queue::{PrefetchTarget, StepView};

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl<B: Backend> DecodeStep<'_, B>
where
    B::Memory: Clone,
{
    /// Runs layer `l` (the step's next) for the batch: `inputs` from the caller's model; the
    /// attention output `[n, q_heads, d_v]` and log-sum-exp `[n, q_heads]` are written to `out`
    /// and `lse`. Fails naming the field when an input has the wrong shape or is missing; a
    /// failure after the checks leaves the step unusable (drop it and abort its requests).
    pub fn layer(
        &mut self,
        l: usize,
        inputs: &LayerInputs<'_, B::Memory>,
        out: &mut Buf<B, f32>,
        lse: &mut Buf<B, f32>,
    ) -> Result<()> {
        self.check_layer(l, inputs, out, lse)?;
        self.failed = true;
        self.run_layer(l, inputs, out, lse)?;
        self.failed = false;
        self.next_layer += 1;
        Ok(())
    }

    fn check_layer(
        &self,
        l: usize,
        inputs: &LayerInputs<'_, B::Memory>,
        out: &Buf<B, f32>,
        lse: &Buf<B, f32>,
    ) -> Result<()> {
        let bad =
            |field: &str, value: String, reason: String| Err(EngineError::Input { field: field.into(), value, reason });
        if self.failed {
            return bad("layer", l.to_string(), "an earlier layer of this step failed: abort its requests".into());
        }
        if l != self.next_layer {
            return bad("layer", l.to_string(), format!("layers run in order: layer {} is next", self.next_layer));
        }
        let c = &self.cache;
        let g = &c.cfg.geometry;
        let mem = c.backend.memory();
        let n = self.ids.len();
        let full = g.is_full(l);
        let given = [inputs.index_queries.is_some(), inputs.index_weights.is_some(), inputs.new_index_keys.is_some()];
        let names = ["index_queries", "index_weights", "new_index_keys"];
        for (name, has) in names.iter().zip(given) {
            if has != full {
                let reason = if full {
                    format!("layer {l} runs an indexer and needs it")
                } else {
                    format!("layer {l} reuses layer {}'s selection (IndexShare) and takes none", g.index_source(l))
                };
                return bad(name, if has { "given" } else { "missing" }.into(), reason);
            }
        }
        let mut sizes = vec![
            ("attention_queries", mem.len(inputs.attention_queries), n * g.q_heads * g.d_qk(), "[n, q_heads, d_qk]"),
            ("new_kv_rows", mem.len(inputs.new_kv_rows), n * c.kv_row.row_bytes(), "[n, kv row bytes]"),
            ("out", mem.len(out), n * g.q_heads * g.d_v(), "[n, q_heads, d_v]"),
            ("lse", mem.len(lse), n * g.q_heads, "[n, q_heads]"),
        ];
        if let (Some(q), Some(w), Some(k)) = (inputs.index_queries, inputs.index_weights, inputs.new_index_keys) {
            sizes.push(("index_queries", mem.len(q), n * g.index_heads * g.index_dim, "[n, index_heads, index_dim]"));
            sizes.push(("index_weights", mem.len(w), n * g.index_heads, "[n, index_heads]"));
            sizes.push(("new_index_keys", mem.len(k), n * c.key.row_bytes(), "[n, key row bytes]"));
        }
        for (name, have, want, shape) in sizes {
            if have != want {
                return bad(name, format!("{have} elements"), format!("{shape} is {want} for a batch of {n}"));
            }
        }
        Ok(())
    }

    fn run_layer(
        &mut self,
        l: usize,
        inputs: &LayerInputs<'_, B::Memory>,
        out: &mut Buf<B, f32>,
        lse: &mut Buf<B, f32>,
    ) -> Result<()> {
        let c = &mut *self.cache;
        let m = &mut self.metrics;
        let g = &c.cfg.geometry;
        let (b, k, mode) = (c.cfg.hisparse.device_buffer_size, g.top_k, c.cfg.mode);
        let (full, scale, qh, ih) = (g.index_slot(l), g.default_softmax_scale(), g.q_heads, g.index_heads);
        let mem = c.backend.memory().clone();
        let sb = &mut c.scratch;

        // 1. The new token's index key and KV row, into the same row of every layer's pool. A
        // reserved slot about to be reused waits for the backup of the token it holds.
        let t = Instant::now();
        let rows = mem.download(inputs.new_kv_rows)?;
        let (mut key_rows, mut kv_rows) = (Vec::with_capacity(self.ids.len()), Vec::with_capacity(self.ids.len()));
        for id in &self.ids {
            let r = c.requests.get(id).ok_or(EngineError::Request { id: id.0, reason: "not admitted".into() })?;
            let p = r.seq_len;
            key_rows.push(c.device.index_key_row(*id, p)? as u32);
            kv_rows.push(match mode {
                Mode::Resident => c.device.kv_row(*id, p)? as u32,
                Mode::HiSparse => {
                    if p >= b
                        && let Some(bk) = &c.backup
                    {
                        let tw = Instant::now();
                        bk.wait(r.last_backup[l])?;
                        m.stages.backup += secs(tw);
                    }
                    c.device.hot_row(*id, p.min(b))? as u32
                }
            });
        }
        if let (Some(slot), Some(keys)) = (full, inputs.new_index_keys) {
            let keys = mem.download(keys)?;
            c.backend.write_rows(c.device.keys_mut(slot), c.key.row_bytes(), &key_rows, &keys)?;
        }
        let pool = if mode == Mode::Resident { c.device.kv_mut(l) } else { c.device.hot_mut(l) };
        c.backend.write_rows(pool, c.kv_row.row_bytes(), &kv_rows, &rows)?;
        m.stages.append += secs(t);

        // 2–3. Indexer and top-k on a full layer; a shared layer (IndexShare) keeps its full
        // layer's selection (the last one made: layers run in order).
        if let (Some(slot), Some(q), Some(w)) = (full, inputs.index_queries, inputs.index_weights) {
            let batch = IndexerBatch {
                heads: ih,
                key_layout: c.key,
                queries: q,
                weights: w,
                keys: c.device.keys(slot),
                page_tokens: c.cfg.hisparse.page_tokens,
                page_table: &sb.table,
                requests: &self.reqs,
                pin_newest: true,
            };
            let t = Instant::now();
            c.backend.indexer_scores(&batch, &mut sb.scores)?;
            m.stages.indexer += secs(t);
            if !self.spans.is_empty() {
                let t = Instant::now();
                c.backend.top_k(&sb.scores, &self.spans, k, &mut sb.top)?;
                mem.read(&sb.top, 0, &mut sb.stage_top)?;
                m.stages.top_k += secs(t);
            }
            sb.selections.clear();
            sb.sel_spans.clear();
            let mut j = 0;
            for (i, r) in self.reqs.iter().enumerate() {
                let start = sb.selections.len();
                if self.long.get(j) == Some(&i) {
                    sb.selections.extend(sb.stage_top[j * k..(j + 1) * k].iter().map(|&x| x as u32));
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
        let policy = c.policy.clone();
        let hs = mode == Mode::HiSparse;
        // Scores for policies and prefetchers that read them (a shared layer's are its full
        // layer's).
        let scores = if hs && (policy.needs_scores() || c.prefetcher.needs_near()) {
            Some(mem.download(&sb.scores)?)
        } else {
            None
        };
        let mut plan = SwapInPlan::default();
        for (i, span) in sb.sel_spans.iter().enumerate() {
            let sel = &sb.selections[span.offset..span.end()];
            let (id, q) = (self.ids[i], &self.reqs[i]);
            let n = q.seq_len;
            if !hs {
                for &tok in sel {
                    sb.locations.push(c.device.kv_row(id, tok as usize)? as i32);
                }
                m.hits += sel.len() as u64;
                continue;
            }
            let own = scores.as_ref().and_then(|s| s.get(q.score_offset..q.score_offset + n));
            let host = c.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
            let r = c.requests.get_mut(&id).ok_or(EngineError::Request { id: id.0, reason: "not admitted".into() })?;
            let view = StepView { step: r.steps + 1, seq_len: n, buffer_slots: b };
            // Rows nominated for this layer earlier in the step come in first.
            let to = PrefetchTarget { id, swap: &mut r.swap, host, device: &mut c.device };
            let got = r.prefetch.apply(Some(l), When::ThisStep, policy.as_ref(), view, own, to)?;
            m.add_prefetch(got);
            let ctx = StepCtx {
                step: r.steps + 1,
                layer: l as u32,
                request: id.0,
                buffer_slots: b as u32,
                seed: policy.seed(),
            };
            let inputs = SwapInputs { next_use: None, scores: own };
            r.swap[l].step(policy.as_ref(), sel, n, &ctx, inputs, &mut plan)?;
            m.bytes_h2d += copy_missing_rows(&plan, host, &mut c.device, id, l)? as u64;
            m.hits += plan.hits.len() as u64;
            m.misses += plan.misses.len() as u64;
            m.max_misses = m.max_misses.max(plan.misses.len() as u64);
            m.prefetch_useful += plan.prefetch_used as u64;
            m.prefetch_wasted += plan.prefetch_wasted as u64;
            let base = c.device.hot_row(id, 0)? as i32;
            sb.locations.extend(plan.locations.iter().map(|&slot| base + slot as i32));
            let budget = c.cfg.hisparse.prefetch_budget;
            r.prefetch.nominate(c.prefetcher.as_ref(), &c.cfg.geometry, budget, view, l, sel, own);
        }
        m.stages.swap_in += secs(t);

        // 5. Attention over the selected rows.
        mem.write(&mut sb.locs, 0, &sb.locations)?;
        let batch = AttentionBatch {
            heads: qh,
            layout: c.kv_row,
            softmax_scale: scale,
            queries: inputs.attention_queries,
            rows: if hs { c.device.hot(l) } else { c.device.kv(l) },
            locations: &sb.locs,
            selections: &sb.sel_spans,
        };
        let t = Instant::now();
        c.backend.sparse_attention(&batch, out, lse)?;
        m.stages.attention += secs(t);

        // 6. The new rows, queued for backup to the host tier.
        if let (Some(bk), Some(host)) = (c.backup.as_mut(), c.host.as_ref()) {
            let t = Instant::now();
            let rb = c.kv_row.row_bytes().max(1);
            for (id, row) in self.ids.iter().zip(rows.chunks_exact(rb)) {
                let r =
                    c.requests.get_mut(id).ok_or(EngineError::Request { id: id.0, reason: "not admitted".into() })?;
                let at = host.locate(*id, l, r.seq_len)?;
                m.bytes_d2h += row.len() as u64;
                r.last_backup[l] = bk.submit(at, row.to_vec())?;
            }
            m.stages.backup += secs(t);
        }
        Ok(())
    }
}
