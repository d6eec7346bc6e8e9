//! One layer of a decode step on the caller's tensors, every kernel on the backend's own
//! buffers (no host round trip): the new token's index key and KV row scattered into the device
//! tier (the reserved hot-buffer slot in hisparse mode, after the backup fence) → indexer (the
//! newest token pinned) → top-k of the requests longer than top-k, into the selection buffer →
//! the backend's swap-in (hisparse: prefetches due, policy decisions, missed rows host → device)
//! or rows by position (resident) → sparse attention into the caller's output → the new rows'
//! backup to the host tier queued (hisparse). Host timers around the calls; a backend that times
//! its own stages ([`hisparse_kernels::StepControl::mark_stage`]) replaces them at the step's end.

use std::time::Instant;

use hisparse_kernels::{AttentionQuery, Backend, Buf, DeviceSwapIn, IndexerBatch, KernelStage, RowBackup};
use hisparse_memory::{DeviceMemory, Mode};

use super::step::{DecodeStep, LayerInputs};
use crate::error::{EngineError, Result};

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

    /// Runs the caller's own launches `f` (a model's GEMMs between layers, say) as stage
    /// `stage` of this step: timed and marked on the backend's clock like the layers' kernels,
    /// and reported by [`DecodeStep::end`].
    pub fn time_stage<T>(&mut self, stage: KernelStage, f: impl FnOnce(&B) -> Result<T>) -> Result<T> {
        self.stage(stage, |s| f(&s.cache.backend))
    }

    /// Runs `f` as stages, starting with `first`: `f` gets the backend and a switch that ends the
    /// current stage and begins another (a no-op for the current one), each timed on the host
    /// and marked on the backend's clock as [`DecodeStep::time_stage`] times one.
    pub fn time_stages<T>(
        &mut self,
        first: KernelStage,
        f: impl FnOnce(&B, &mut dyn FnMut(KernelStage) -> Result<()>) -> Result<T>,
    ) -> Result<T> {
        let backend = &self.cache.backend;
        let stages = &mut self.metrics.stages;
        let (mut cur, mut t) = (first, Instant::now());
        backend.mark_stage(cur, true)?;
        let mut switch = |next: KernelStage| -> Result<()> {
            if next != cur {
                backend.mark_stage(cur, false)?;
                stages.add_kernel(cur, secs(t));
                (cur, t) = (next, Instant::now());
                backend.mark_stage(cur, true)?;
            }
            Ok(())
        };
        let r = f(backend, &mut switch)?;
        backend.mark_stage(cur, false)?;
        stages.add_kernel(cur, secs(t));
        Ok(r)
    }

    /// Runs `f` as stage `stage`: timed on the host, and marked on the backend's clock.
    fn stage<T>(&mut self, stage: KernelStage, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let t = Instant::now();
        self.cache.backend.mark_stage(stage, true)?;
        let r = f(self)?;
        self.cache.backend.mark_stage(stage, false)?;
        self.metrics.stages.add_kernel(stage, secs(t));
        Ok(r)
    }

    fn run_layer(
        &mut self,
        l: usize,
        inputs: &LayerInputs<'_, B::Memory>,
        out: &mut Buf<B, f32>,
        lse: &mut Buf<B, f32>,
    ) -> Result<()> {
        self.viewed = None;
        let g = &self.cache.cfg.geometry;
        let (k, mode, full) = (g.top_k, self.cache.cfg.mode, g.index_slot(l));
        let (index_heads, q_heads, softmax_scale) = (g.index_heads, g.q_heads, g.default_softmax_scale());

        // 1. The new token's index key and KV row, into the same row of every layer's pool; a
        // reserved slot about to be rewritten waits (in the device's order) for its backup.
        let t = Instant::now();
        if self.fence
            && let Some(bk) = self.cache.backup.as_mut()
        {
            bk.fence(l)?;
        }
        let c = &mut *self.cache;
        let sb = &c.scratch;
        if let (Some(slot), Some(keys), true) = (full, inputs.new_index_keys, c.cfg.keeps_index()) {
            if sb.key_positions.is_empty() {
                c.backend.scatter_rows(c.device.keys_mut(slot), c.key.row_bytes(), &sb.dest_keys, keys)?;
            } else {
                // Page summaries: each key folds into the row its page's earlier positions
                // wrote (on the host, through the tier).
                let keys = c.backend.memory().download(keys)?;
                let rb = c.key.row_bytes();
                for ((id, &p), k) in self.ids.iter().zip(&sb.key_positions).zip(keys.chunks_exact(rb)) {
                    c.device.write_index_key(*id, slot, p, k)?;
                }
            }
        }
        let pool = if mode == Mode::Resident { c.device.kv_mut(l) } else { c.device.hot_mut(l) };
        c.backend.scatter_rows(pool, c.kv_row.row_bytes(), &sb.dest_rows, inputs.new_kv_rows)?;
        self.metrics.stages.append += secs(t);

        // 2–3. Indexer and top-k on a full layer; a shared layer (IndexShare) keeps its full
        // layer's selection (the last one made: layers run in order).
        // The oracle (a model without an indexer) is skipped where every request holds all its
        // positions and nothing reads the scores: it could only select everything. A cache
        // without index keys (dense attention) scores nothing.
        let c = &*self.cache;
        let scores_unread = !c.cfg.keeps_index()
            || (matches!(c.cfg.index_score, hisparse_kernels::IndexScore::Oracle(_))
                && self.topk_spans.is_empty()
                && !c.policy.needs_scores()
                && !c.prefetcher.needs_near());
        if let (Some(slot), Some(q), Some(w), false) = (full, inputs.index_queries, inputs.index_weights, scores_unread)
        {
            self.stage(KernelStage::Indexer, |s| {
                let c = &mut *s.cache;
                let batch = IndexerBatch {
                    heads: index_heads,
                    key_layout: c.key,
                    queries: q,
                    weights: w,
                    keys: c.device.keys(slot),
                    page_tokens: c.cfg.hisparse.page_tokens,
                    page_table: &c.scratch.table,
                    requests: &s.reqs,
                    pin_newest: true,
                    queries_as: c.cfg.index_queries,
                    score: c.cfg.index_score,
                };
                Ok(c.backend.indexer_scores(&batch, &mut c.scratch.scores)?)
            })?;
            if !self.topk_spans.is_empty() {
                self.stage(KernelStage::TopK, |s| {
                    let c = &mut *s.cache;
                    Ok(c.backend.top_k(&c.scratch.scores, &s.topk_spans, k, &mut c.scratch.sel)?)
                })?;
            }
        }

        // 4. Swap-in (hisparse) or rows by position (resident).
        self.stage(KernelStage::SwapIn, |s| {
            let c = &mut *s.cache;
            let sb = &mut c.scratch;
            if s.swaps {
                let swap =
                    c.swap.as_mut().ok_or_else(|| EngineError::Worker(format!("{mode} mode without a swap-in")))?;
                let scores = (c.policy.needs_scores() || c.prefetcher.needs_near()).then_some(&sb.scores);
                swap.launch(l, &sb.sel, scores, c.device.hot_pools_mut(), &mut sb.locs)?;
            }
            if !s.kv_spans.is_empty() {
                let p_tok = c.cfg.hisparse.page_tokens;
                c.backend.locate_rows(&sb.sel, &s.kv_spans, &sb.kv_table, &s.kv_first, p_tok, &mut sb.locs)?;
            }
            Ok(())
        })?;

        // 5. Attention over the selected rows (through the swap-in where it leaves the misses
        // for the attention to bring in).
        self.stage(KernelStage::Attention, |s| {
            let c = &mut *s.cache;
            let q = AttentionQuery {
                heads: q_heads,
                layout: c.kv_row,
                softmax_scale,
                queries: inputs.attention_queries,
                locations: &c.scratch.locs,
                selections: &s.sel_spans,
            };
            if let (true, Some(swap)) = (s.swaps, c.swap.as_mut())
                && swap.fills_in_attention()
            {
                return Ok(swap.attend(l, &q, c.device.hot_pools_mut(), out, lse)?);
            }
            // Hybrid placement's pages live in the hot buffers' pool: one pool either way.
            let rows = if mode == Mode::Resident { c.device.kv(l) } else { c.device.hot(l) };
            Ok(c.backend.sparse_attention(&q.with_rows(rows), out, lse)?)
        })?;

        // 6. The new rows, backed up from their slots to the host tier off the critical path.
        if let Some(bk) = self.cache.backup.as_mut() {
            let t = Instant::now();
            bk.backup(l, self.cache.device.hot(l))?;
            self.metrics.stages.backup += secs(t);
        }
        Ok(())
    }
}
