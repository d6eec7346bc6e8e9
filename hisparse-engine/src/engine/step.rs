//! One decode step for every running request, layer by layer: the new token's KV row and index
//! key into the device tier → indexer → top-k (the newest token always selected) → swap-in
//! (hisparse: policy decisions, missed rows host → device; resident: rows by position) → sparse
//! attention → backup of the new row to the host tier (hisparse). Then finished requests leave
//! and free everything they held.

use std::time::Instant;

use half::bf16;
use hisparse_kernels::{Backend, DeviceSwapIn, IndexerRequest, Span};
use hisparse_memory::{DeviceMemory, RequestId};

use super::Engine;
use super::step_inputs::StepInputs;
use crate::error::Result;
use crate::metrics::StepMetrics;
use crate::request::Outcome;

/// Every input and output of one layer of one step, for `hisparse dump-step` (requests in
/// running order; per-request arrays concatenated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerDump {
    /// The layer.
    pub layer: u32,
    /// Request ids.
    pub requests: Vec<u64>,
    /// Sequence length of each request this step (the newest token included).
    pub seq_lens: Vec<u32>,
    /// Indexer queries, `[batch, index_heads, index_dim]`.
    pub index_queries: Vec<bf16>,
    /// Indexer head weights, `[batch, index_heads]`.
    pub index_weights: Vec<f32>,
    /// Every position's index key row (`index_key` layout: e4m3 codes then the f32 scale),
    /// requests concatenated in position order, `[sum of seq_lens, key row bytes]`.
    pub index_keys: Vec<u8>,
    /// Indexer scores of every position of every request, concatenated (the newest set to
    /// +inf): exactly `sum of seq_lens` values.
    pub scores: Vec<f32>,
    /// Selected positions, concatenated, ascending per request.
    pub selections: Vec<u32>,
    /// Selected positions per request.
    pub selection_lens: Vec<u32>,
    /// Attention queries, `[batch, heads, d_qk]`.
    pub attention_queries: Vec<bf16>,
    /// The pool row attention read for each selected position (hot-buffer row in hisparse mode,
    /// KV-pool row in resident mode), selection order.
    pub locations: Vec<i32>,
    /// The selected KV rows' bytes in selection order, `[total selected, row_bytes]`: row `i` is
    /// the KV row of position `selections[i]`.
    pub selected_rows: Vec<u8>,
    /// Attention output, `[batch, heads, d_v]`.
    pub out: Vec<f32>,
    /// Log-sum-exp per head, `[batch, heads]`.
    pub lse: Vec<f32>,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Its metrics.
    pub metrics: StepMetrics,
    /// After [`Engine::capture_next_step`]: every layer's inputs and outputs.
    pub dump: Vec<LayerDump>,
    /// With `capture_digests`: a 64-bit digest of the attention output and LSE bits of each
    /// (request, token index, layer), token index counting the request's generated tokens from 0.
    pub digests: Vec<(RequestId, u32, u32, u64)>,
}

/// What every layer of one step shares, and the buffers every layer reuses (kernels overwrite
/// their outputs whole, so nothing is cleared between layers).
pub(super) struct StepBatch<M: DeviceMemory> {
    pub reqs: Vec<IndexerRequest>,
    pub table: M::Buffer<u32>,
    pub long: Vec<usize>,
    pub spans: Vec<Span>,
    pub index_q: M::Buffer<bf16>,
    pub index_w: M::Buffer<f32>,
    pub scores: M::Buffer<f32>,
    pub top: M::Buffer<i32>,
    pub attn_q: M::Buffer<bf16>,
    pub out: M::Buffer<f32>,
    pub lse: M::Buffer<f32>,
    pub locs: M::Buffer<i32>,
    /// Host staging reused by every layer.
    pub stage_top: Vec<i32>,
    pub selections: Vec<u32>,
    pub sel_spans: Vec<Span>,
    pub locations: Vec<i32>,
    /// Device path: every request's selection at `i * k` (`sel_dev_spans`), and the host form
    /// of the short requests' selections (all their positions) for the layers to complete.
    pub sel: M::Buffer<i32>,
    pub sel_dev_spans: Vec<Span>,
    pub sel_template: Vec<i32>,
    /// Device path, resident mode: the KV page table and each request's first entry.
    pub kv_table: M::Buffer<u32>,
    pub kv_first: Vec<usize>,
    /// Device path: every layer's inputs of the step.
    pub inputs: StepInputs<M>,
    /// Device path with digests: each layer's attention output and LSE (empty otherwise).
    pub layer_out: Vec<M::Buffer<f32>>,
    pub layer_lse: Vec<M::Buffer<f32>>,
}

/// Makes `buf` hold `len` elements (exactly, or at least), reallocating only when it must.
fn fit<M: DeviceMemory, T: hisparse_memory::Element>(
    mem: &M,
    buf: &mut M::Buffer<T>,
    len: usize,
    exact: bool,
) -> Result<()> {
    let have = mem.len(buf);
    if have != len && (exact || have < len) {
        *buf = mem.alloc_zeroed(len)?;
    }
    Ok(())
}

/// FNV-1a over the bits of `a` then `b`.
pub(super) fn digest(a: &[f32], b: &[f32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for x in a.iter().chain(b) {
        for byte in x.to_bits().to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

pub(super) fn secs(t: Instant) -> f64 {
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
            self.cache.set_policy(std::sync::Arc::clone(&rt.policy))?;
            if let Some(d) = self.dswap.as_mut() {
                d.set_policy(std::sync::Arc::clone(&rt.policy))?;
            }
            self.last_policy = std::sync::Arc::clone(&rt.policy);
        }
        let t0 = Instant::now();
        let capture = self.capture_next;
        if !self.running.is_empty() {
            let _span = tracing::info_span!("decode_step", step = self.step, batch = self.running.len()).entered();
            let t = Instant::now();
            self.advance_drifts();
            rep.metrics.stages.workload += secs(t);
            if self.device_path {
                let ids: Vec<RequestId> = self.running.iter().map(|r| r.spec.id).collect();
                let (reqs, table) = self.cache.grow_for_step(&ids)?;
                let mut sb = self.plan_batch(reqs, &table)?;
                let res = self.layers_device(&mut sb, &mut rep);
                self.scratch = Some(sb);
                res?;
                self.finish_device_step(&mut rep.metrics)?;
                self.cache.advance(&ids);
            } else {
                self.host_step(&mut rep)?;
            }
            for r in &mut self.running {
                r.seq_len += 1;
                r.generated += 1;
            }
        }
        if capture && !self.running.is_empty() {
            self.capture_next = false;
        }
        let m = &mut rep.metrics;
        m.tokens = self.running.len();
        m.running = self.running.len();
        m.seconds = secs(t0);
        let st = &m.stages;
        let counted = st.workload
            + st.append
            + st.indexer
            + st.top_k
            + st.swap_in
            + st.attention
            + st.graph
            + st.model
            + st.backup;
        m.stages.bookkeeping = (m.seconds - counted).max(0.0);
        self.retire()?;
        let m = &mut rep.metrics;
        m.queued = self.queue.len();
        m.device_bytes_in_use = self.cache.device_bytes_in_use() as u64;
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

    /// Device path: assembles what every layer of the step shares from the indexer's requests
    /// and page table (the tiers grown already): the top-k spans, the selection buffer.
    fn plan_batch(&mut self, reqs: Vec<IndexerRequest>, table: &[u32]) -> Result<StepBatch<B::Memory>> {
        let k = self.cfg.geometry.top_k;
        let total: usize = reqs.iter().map(|r| r.seq_len).sum();
        let long: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].seq_len > k).collect();
        let spans: Vec<Span> = long.iter().map(|&i| Span::new(reqs[i].score_offset, reqs[i].seq_len)).collect();
        let mem = self.cache.backend.memory();
        let g = &self.cfg.geometry;
        let n = reqs.len();

        // Reuse the previous step's buffers where their sizes still fit.
        let mut sb = match self.scratch.take() {
            Some(sb) => sb,
            None => StepBatch {
                table: mem.alloc_zeroed(0)?,
                index_q: mem.alloc_zeroed(0)?,
                index_w: mem.alloc_zeroed(0)?,
                scores: mem.alloc_zeroed(0)?,
                top: mem.alloc_zeroed(0)?,
                attn_q: mem.alloc_zeroed(0)?,
                out: mem.alloc_zeroed(0)?,
                lse: mem.alloc_zeroed(0)?,
                locs: mem.alloc_zeroed(0)?,
                sel: mem.alloc_zeroed(0)?,
                kv_table: mem.alloc_zeroed(0)?,
                sel_dev_spans: Vec::new(),
                sel_template: Vec::new(),
                kv_first: Vec::new(),
                stage_top: Vec::new(),
                selections: Vec::new(),
                sel_spans: Vec::new(),
                locations: Vec::new(),
                reqs: Vec::new(),
                long: Vec::new(),
                spans: Vec::new(),
                inputs: StepInputs::default(),
                layer_out: Vec::new(),
                layer_lse: Vec::new(),
            },
        };
        // In place while it fits: a captured launch sequence reads it there.
        fit(mem, &mut sb.table, table.len().max(1), false)?;
        mem.write(&mut sb.table, 0, table)?;
        fit(mem, &mut sb.index_q, n * g.index_heads * g.index_dim, true)?;
        fit(mem, &mut sb.index_w, n * g.index_heads, true)?;
        // Scores grow by one position per request and step: keep headroom.
        if mem.len(&sb.scores) < total {
            sb.scores = mem.alloc_zeroed(total + 64 * n)?;
        }
        fit(mem, &mut sb.top, spans.len() * k, true)?;
        fit(mem, &mut sb.attn_q, n * g.q_heads * g.d_qk(), true)?;
        fit(mem, &mut sb.out, n * g.q_heads * g.d_v(), true)?;
        fit(mem, &mut sb.lse, n * g.q_heads, true)?;
        {
            fit(mem, &mut sb.locs, n * k, false)?;
            // Exact: when every request is long, top-k writes into it whole.
            fit(mem, &mut sb.sel, n * k, true)?;
            sb.sel_dev_spans = reqs.iter().enumerate().map(|(i, r)| Span::new(i * k, r.seq_len.min(k))).collect();
            sb.sel_template.clear();
            if long.len() < n {
                // Short requests select all their positions; long ones are filled per layer.
                sb.sel_template.resize(n * k, 0);
                for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.seq_len <= k) {
                    sb.sel_template[i * k..i * k + r.seq_len].iter_mut().zip(0..).for_each(|(x, t)| *x = t);
                }
                mem.write(&mut sb.sel, 0, &sb.sel_template)?;
            }
            if self.cfg.capture_digests {
                // Per-layer outputs; a reallocation changes the inputs' generation (graph key).
                let (lo, ll) = (n * g.q_heads * g.d_v(), n * g.q_heads);
                let mut moved = sb.layer_out.len() != g.layers;
                while sb.layer_out.len() < g.layers {
                    sb.layer_out.push(mem.alloc_zeroed(lo)?);
                    sb.layer_lse.push(mem.alloc_zeroed(ll)?);
                }
                for l in 0..g.layers {
                    moved |= mem.len(&sb.layer_out[l]) != lo || mem.len(&sb.layer_lse[l]) != ll;
                    fit(mem, &mut sb.layer_out[l], lo, true)?;
                    fit(mem, &mut sb.layer_lse[l], ll, true)?;
                }
                sb.inputs.generation += u64::from(moved);
            }
            self.plan_device_step(&reqs, &mut sb)?;
        }
        sb.stage_top.resize(spans.len() * k, 0);
        sb.reqs = reqs;
        sb.long = long;
        sb.spans = spans;
        Ok(sb)
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
            self.cache.free(r.spec.id)?;
            self.outcomes.push((r.spec.id, Outcome::Finished { steps: self.step + 1 - r.first_step }));
        }
        Ok(())
    }
}
