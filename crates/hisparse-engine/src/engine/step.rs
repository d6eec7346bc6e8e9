//! One decode step for every running request, layer by layer: the new token's KV row and index
//! key into the device tier → indexer → top-k (the newest token always selected) → swap-in
//! (hisparse: policy decisions, missed rows host → device; resident: rows by position) → sparse
//! attention → backup of the new row to the host tier (hisparse). Then finished requests leave
//! and free everything they held.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::{AttentionBatch, Backend, IndexerBatch, IndexerRequest, Span};
use hisparse_memory::{DeviceMemory, Mode, RequestId};
use hisparse_policy::trace::TraceRecord;
use hisparse_policy::{StepCtx, SwapInPlan, copy_missing_rows};

use super::Engine;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;
use crate::request::Outcome;

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Its metrics.
    pub metrics: StepMetrics,
    /// With `capture_digests`: a 64-bit digest of the attention output and LSE bits of each
    /// (request, token index, layer), token index counting the request's generated tokens from 0.
    pub digests: Vec<(RequestId, u32, u32, u64)>,
}

/// FNV-1a over the bits of `a` then `b`.
fn digest(a: &[f32], b: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for x in a.iter().chain(b) {
        for byte in x.to_bits().to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Admits what fits, decodes one token for every running request, retires finished ones.
    pub fn step(&mut self) -> Result<StepReport> {
        self.step += 1;
        let mut rep = StepReport::default();
        let m = &mut rep.metrics;
        m.step = self.step;
        self.admit(m)?;
        let rt = self.runtime.load_full();
        if !std::sync::Arc::ptr_eq(&rt.policy, &self.last_policy) {
            // A new policy: rebuild its records from the slots' current contents.
            for r in &mut self.running {
                r.swap.iter_mut().for_each(|s| s.reset_policy());
            }
            self.last_policy = std::sync::Arc::clone(&rt.policy);
        }
        let t0 = Instant::now();
        if !self.running.is_empty() {
            let _span = tracing::info_span!("decode_step", step = self.step, batch = self.running.len()).entered();
            for r in &mut self.running {
                self.workload.advance(r.spec.id.0, &mut r.drift);
            }
            for l in 0..self.cfg.geometry.layers {
                self.layer(l, rt.policy.as_ref(), &mut rep)?;
            }
            for r in &mut self.running {
                r.seq_len += 1;
                r.generated += 1;
            }
        }
        let m = &mut rep.metrics;
        m.tokens = self.running.len();
        m.running = self.running.len();
        m.seconds = secs(t0);
        self.retire()?;
        let m = &mut rep.metrics;
        m.queued = self.queue.len();
        m.device_bytes_in_use = self.device.bytes_in_use() as u64;
        m.host_bytes_in_use = self.host_bytes_in_use() as u64;
        m.rejected = self.outcomes.iter().filter(|o| matches!(o.1, Outcome::Rejected { .. })).count();
        m.finished = self.outcomes.len() - m.rejected;
        Ok(rep)
    }

    /// Runs steps until nothing is queued or running (at most `max_steps`); returns the reports.
    pub fn run(&mut self, max_steps: u64) -> Result<Vec<StepReport>> {
        let mut out = Vec::new();
        while !self.is_idle() && (out.len() as u64) < max_steps {
            out.push(self.step()?);
        }
        Ok(out)
    }

    /// One layer of the step for the whole batch.
    fn layer(&mut self, l: usize, policy: &dyn hisparse_policy::EvictionPolicy, rep: &mut StepReport) -> Result<()> {
        let g = &self.cfg.geometry;
        let (b, k, p_tok) = (self.cfg.hisparse.device_buffer_size, g.top_k, self.cfg.hisparse.page_tokens);
        let (h, dim, qh, d_qk) = (g.index_heads, g.index_dim, g.q_heads, g.d_qk());
        let (kv_row, key) = (self.kv_row, self.key);
        let mode = self.cfg.mode;
        let mem = self.backend.memory().clone();
        let m = &mut rep.metrics;

        // 1. The new token's row and key.
        let t = Instant::now();
        let mut new_rows = Vec::with_capacity(self.running.len());
        let mut vals = vec![0f32; d_qk];
        let mut kvals = vec![0f32; dim];
        let mut kbytes = vec![0u8; key.row_bytes()];
        for r in &self.running {
            let (id, p) = (r.spec.id, r.seq_len);
            self.device.grow(id, p + 1)?;
            if let Some(host) = self.host.as_mut() {
                host.grow(id, p + 1)?;
            }
            self.workload.index_key(id.0, l, p, &mut kvals);
            key.encode(&kvals, &mut kbytes)?;
            self.device.write_index_key(id, l, p, &kbytes)?;
            self.workload.kv_row(id.0, l, p, &mut vals);
            let mut row = vec![0u8; kv_row.row_bytes()];
            kv_row.encode(&vals, &mut row)?;
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
            new_rows.push(row);
        }
        m.stages.append += secs(t);

        // 2. Indexer over every position of every request.
        let t = Instant::now();
        let mut q = vec![0f32; h * dim];
        let mut w = vec![0f32; h];
        let (mut qs, mut ws, mut table, mut reqs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut total = 0;
        for r in &self.running {
            let n = r.seq_len + 1;
            self.workload.indexer_query(r.spec.id.0, l, &r.drift, &mut q, &mut w);
            qs.extend(q.iter().map(|x| bf16::from_f32(*x)));
            ws.extend_from_slice(&w);
            reqs.push(IndexerRequest { first_page: table.len(), seq_len: n, score_offset: total });
            table.extend_from_slice(&self.device.index_pages(r.spec.id)?[..n.div_ceil(p_tok)]);
            total += n;
        }
        let (qs, ws, table_d) = (mem.upload(&qs)?, mem.upload(&ws)?, mem.upload(&table)?);
        let mut scores = mem.alloc_zeroed::<f32>(total)?;
        {
            let _s = tracing::debug_span!("indexer", layer = l).entered();
            let batch = IndexerBatch {
                heads: h,
                key_layout: key,
                queries: &qs,
                weights: &ws,
                keys: self.device.keys(l),
                page_tokens: p_tok,
                page_table: &table_d,
                requests: &reqs,
            };
            self.backend.indexer_scores(&batch, &mut scores)?;
        }
        // The newest token is always attended to.
        for r in &reqs {
            mem.write(&mut scores, r.score_offset + r.seq_len - 1, &[f32::INFINITY])?;
        }
        m.stages.indexer += secs(t);

        // 3. Top-k for the requests longer than k; shorter ones select everything.
        let t = Instant::now();
        let long: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].seq_len > k).collect();
        let spans: Vec<Span> = long.iter().map(|&i| Span::new(reqs[i].score_offset, reqs[i].seq_len)).collect();
        let mut top = mem.alloc_zeroed::<i32>(spans.len() * k)?;
        if !spans.is_empty() {
            let _s = tracing::debug_span!("top_k", layer = l).entered();
            self.backend.top_k(&scores, &spans, k, &mut top)?;
        }
        let top = mem.download(&top)?;
        let mut selections: Vec<Vec<u32>> = reqs.iter().map(|r| (0..r.seq_len as u32).collect()).collect();
        for (j, &i) in long.iter().enumerate() {
            selections[i] = top[j * k..(j + 1) * k].iter().map(|&x| x as u32).collect();
        }
        m.stages.top_k += secs(t);

        // 4. Swap-in (hisparse) or rows by position (resident).
        let t = Instant::now();
        let mut locations: Vec<i32> = Vec::new();
        let mut sel_spans = Vec::with_capacity(selections.len());
        let mut plan = SwapInPlan::default();
        for (i, sel) in selections.iter().enumerate() {
            let (id, n) = (self.running[i].spec.id, reqs[i].seq_len);
            sel_spans.push(Span::new(locations.len(), sel.len()));
            match mode {
                Mode::Resident => {
                    for &tok in sel {
                        locations.push(self.device.kv_row(id, tok as usize)? as i32);
                    }
                }
                Mode::HiSparse => {
                    let r = &mut self.running[i];
                    let ctx = StepCtx { step: r.generated as u32 + 1, layer: l as u32, request: id.0, buffer_slots: b as u32, seed: policy.seed() };
                    r.swap[l].step(policy, sel, n, &ctx, None, &mut plan)?;
                    let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                    m.bytes_h2d += copy_missing_rows(&plan, host, &mut self.device, id, l)? as u64;
                    m.hits += plan.hits.len() as u64;
                    m.misses += plan.misses.len() as u64;
                    m.max_misses = m.max_misses.max(plan.misses.len() as u64);
                    for &slot in &plan.locations {
                        locations.push(self.device.hot_row(id, slot as usize)? as i32);
                    }
                }
            }
            if let Some(tr) = self.trace.as_mut() {
                tr.write(&TraceRecord { step: self.step as u32, request: id.0, layer: l as u32, seq_len: n as u32, selected: sel.clone(), scores: None })?;
            }
        }
        if mode == Mode::Resident {
            m.hits += locations.len() as u64;
        }
        m.stages.swap_in += secs(t);

        // 5. Attention.
        let t = Instant::now();
        let mut aq = vec![0f32; qh * d_qk];
        let mut queries = Vec::with_capacity(self.running.len() * qh * d_qk);
        for r in &self.running {
            self.workload.attention_query(r.spec.id.0, l, r.drift.step, &mut aq);
            queries.extend(aq.iter().map(|x| bf16::from_f32(*x)));
        }
        let (queries, locs) = (mem.upload(&queries)?, mem.upload(&locations)?);
        let n = self.running.len();
        let (mut out, mut lse) = (mem.alloc_zeroed::<f32>(n * qh * g.d_v())?, mem.alloc_zeroed::<f32>(n * qh)?);
        {
            let _s = tracing::debug_span!("attention", layer = l).entered();
            let rows = if mode == Mode::Resident { self.device.kv(l) } else { self.device.hot(l) };
            let batch = AttentionBatch {
                heads: qh,
                layout: kv_row,
                softmax_scale: g.default_softmax_scale(),
                queries: &queries,
                rows,
                locations: &locs,
                selections: &sel_spans,
            };
            self.backend.sparse_attention(&batch, &mut out, &mut lse)?;
        }
        if self.cfg.capture_digests {
            let (out, lse) = (mem.download(&out)?, mem.download(&lse)?);
            for (i, r) in self.running.iter().enumerate() {
                let per = qh * g.d_v();
                let d = digest(&out[i * per..(i + 1) * per], &lse[i * qh..(i + 1) * qh]);
                rep.digests.push((r.spec.id, r.generated as u32, l as u32, d));
            }
        }
        let m = &mut rep.metrics;
        m.stages.attention += secs(t);

        // 6. Backup of the new rows (hisparse).
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

    /// Retires finished requests: waits for their backups, frees their tiers and reservation.
    fn retire(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].generated < self.running[i].spec.output_tokens {
                i += 1;
                continue;
            }
            let r = self.running.swap_remove(i);
            if let Some(bk) = &self.backup {
                bk.wait(r.last_backup.iter().copied().max().unwrap_or(0))?;
            }
            self.device.release(r.spec.id)?;
            if let Some(h) = self.host.as_mut() {
                h.release(r.spec.id)?;
            }
            self.admission.release(&r.need)?;
            self.outcomes.push((r.spec.id, Outcome::Finished { steps: self.step + 1 - r.first_step }));
        }
        Ok(())
    }
}
