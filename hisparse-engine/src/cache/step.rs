//! One decode step through the cache: [`KvCache::begin_step`] grows every request of the batch
//! by one position and plans what its layers share (the indexer's page table, the top-k
//! spans); [`DecodeStep::layer`] runs one layer on the caller's tensors (`layer.rs`);
//! [`DecodeStep::end`] applies next-step prefetches and advances the requests.
//!
//! Invariant: a step's layers run in order, each once; a step dropped before [`DecodeStep::end`]
//! marks its requests broken (their newest position is incomplete) and they can only be freed.

use std::collections::HashSet;

use half::bf16;
use hisparse_kernels::{Backend, IndexerRequest, Span};
use hisparse_memory::{DeviceMemory, Mode, RequestId};
use hisparse_policy::prefetch::When;

use super::KvCache;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;
use crate::prefetch_queue::{PrefetchTarget, StepView};

/// Buffers a step reuses from the last one (kernels overwrite their outputs whole).
pub(crate) struct StepScratch<M: DeviceMemory> {
    pub table: M::Buffer<u32>,
    pub scores: M::Buffer<f32>,
    pub top: M::Buffer<i32>,
    pub locs: M::Buffer<i32>,
    pub stage_top: Vec<i32>,
    pub selections: Vec<u32>,
    pub sel_spans: Vec<Span>,
    pub locations: Vec<i32>,
}

/// One layer's inputs from the caller's model, for the step's batch in its order (`n`
/// requests), in the backend's memory.
pub struct LayerInputs<'a, M: DeviceMemory> {
    /// Indexer queries, `[n, index_heads, index_dim]` (`None` on a layer that shares another's
    /// index, IndexShare).
    pub index_queries: Option<&'a M::Buffer<bf16>>,
    /// Indexer head weights, `[n, index_heads]` (`None` with `index_queries`).
    pub index_weights: Option<&'a M::Buffer<f32>>,
    /// The new token's index key, `[n, key row bytes]` (`None` with `index_queries`).
    pub new_index_keys: Option<&'a M::Buffer<u8>>,
    /// Attention queries, `[n, q_heads, d_qk]`.
    pub attention_queries: &'a M::Buffer<bf16>,
    /// The new token's KV row, `[n, row bytes]`.
    pub new_kv_rows: &'a M::Buffer<u8>,
}

/// What a layer left behind, for observers (traces, dumps): valid until the next layer runs.
pub struct LayerView<'s, M: DeviceMemory> {
    /// The batch's indexer requests (page-table offset, sequence length with the newest token,
    /// score offset).
    pub requests: &'s [IndexerRequest],
    /// The indexer's page table of the batch (index-key pages, per request from `first_page`).
    pub page_table: &'s M::Buffer<u32>,
    /// Indexer scores of every position of every request (the last full layer's).
    pub scores: &'s M::Buffer<f32>,
    /// Selected positions, ascending per request, concatenated.
    pub selections: &'s [u32],
    /// Each request's span of `selections`.
    pub spans: &'s [Span],
    /// The pool row attention read for each selected position (hot-buffer row in hisparse
    /// mode, KV-pool row in resident mode).
    pub locations: &'s [i32],
}

/// A decode step in progress: see the module documentation.
pub struct DecodeStep<'c, B: Backend>
where
    B::Memory: Clone,
{
    pub(super) cache: &'c mut KvCache<B>,
    pub(super) ids: Vec<RequestId>,
    pub(super) reqs: Vec<IndexerRequest>,
    /// Requests longer than top-k (their selection is a top-k), and their score spans.
    pub(super) long: Vec<usize>,
    pub(super) spans: Vec<Span>,
    pub(super) next_layer: usize,
    pub(super) metrics: StepMetrics,
    /// A layer failed after its checks: the step can only be dropped.
    pub(super) failed: bool,
    ended: bool,
}

impl<M: DeviceMemory> StepScratch<M> {
    pub(crate) fn new(mem: &M) -> Result<Self> {
        Ok(Self {
            table: mem.alloc_zeroed(0)?,
            scores: mem.alloc_zeroed(0)?,
            top: mem.alloc_zeroed(0)?,
            locs: mem.alloc_zeroed(0)?,
            stage_top: Vec::new(),
            selections: Vec::new(),
            sel_spans: Vec::new(),
            locations: Vec::new(),
        })
    }
}

fn fit<M: DeviceMemory, T: hisparse_memory::Element>(mem: &M, buf: &mut M::Buffer<T>, len: usize) -> Result<()> {
    if mem.len(buf) < len {
        *buf = mem.alloc_zeroed(len)?;
    }
    Ok(())
}

impl<B: Backend> KvCache<B>
where
    B::Memory: Clone,
{
    /// Begins a decode step for `batch` (each request at most once; each decodes one token at
    /// its next position, which must lie within its reservation). Fails, changing nothing,
    /// naming the request that cannot take part.
    pub fn begin_step(&mut self, batch: &[RequestId]) -> Result<DecodeStep<'_, B>> {
        let (reqs, table) = self.grow_for_step(batch)?;
        let k = self.cfg.geometry.top_k;
        let total = reqs.iter().map(|r| r.seq_len).sum::<usize>();
        let long: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].seq_len > k).collect();
        let spans: Vec<Span> = long.iter().map(|&i| Span::new(reqs[i].score_offset, reqs[i].seq_len)).collect();
        let mem = self.backend.memory();
        let sb = &mut self.scratch;
        fit(mem, &mut sb.table, table.len().max(1))?;
        mem.write(&mut sb.table, 0, &table)?;
        // Scores grow by one position per request and step: keep headroom.
        if mem.len(&sb.scores) < total {
            sb.scores = mem.alloc_zeroed(total + 64 * reqs.len())?;
        }
        // Exact: top-k writes its whole output.
        if mem.len(&sb.top) != spans.len() * k {
            sb.top = mem.alloc_zeroed(spans.len() * k)?;
        }
        fit(mem, &mut sb.locs, reqs.iter().map(|r| r.seq_len.min(k)).sum::<usize>().max(1))?;
        sb.stage_top.resize(spans.len() * k, 0);
        sb.selections.clear();
        sb.sel_spans.clear();
        sb.locations.clear();
        Ok(DecodeStep {
            cache: self,
            ids: batch.to_vec(),
            reqs,
            long,
            spans,
            next_layer: 0,
            metrics: StepMetrics::default(),
            failed: false,
            ended: false,
        })
    }

    /// Checks that every request of `batch` may decode a token, then grows each by one position
    /// in the tiers; returns the indexer's requests and page table of the batch.
    pub(crate) fn grow_for_step(&mut self, batch: &[RequestId]) -> Result<(Vec<IndexerRequest>, Vec<u32>)> {
        let mut seen = HashSet::with_capacity(batch.len());
        for &id in batch {
            let r = self.request(id)?;
            let why = if !seen.insert(id) {
                Some("appears twice in the batch".to_string())
            } else if r.broken {
                Some("a step it took part in did not end: abort it".to_string())
            } else if r.seq_len >= r.reserved {
                Some(format!("holds {} positions, all used: `reserve` more", r.reserved))
            } else {
                None
            };
            if let Some(reason) = why {
                return Err(EngineError::Request { id: id.0, reason });
            }
        }
        let p_tok = self.cfg.hisparse.page_tokens;
        let (mut table, mut reqs, mut total) = (Vec::new(), Vec::with_capacity(batch.len()), 0);
        for &id in batch {
            let n = self.request(id)?.seq_len + 1;
            // Within the reservation, which admission holds for it: cannot run short.
            self.device.grow(id, n)?;
            if let Some(host) = self.host.as_mut() {
                host.grow(id, n)?;
            }
            reqs.push(IndexerRequest { first_page: table.len(), seq_len: n, score_offset: total });
            table.extend_from_slice(&self.device.index_pages(id)?[..n.div_ceil(p_tok)]);
            total += n;
        }
        Ok((reqs, table))
    }

    /// After a step's last layer: every request of `batch` holds one more position.
    pub(crate) fn advance(&mut self, batch: &[RequestId]) {
        for id in batch {
            if let Some(r) = self.requests.get_mut(id) {
                r.seq_len += 1;
                r.steps += 1;
            }
        }
    }
}

impl<B: Backend> DecodeStep<'_, B>
where
    B::Memory: Clone,
{
    /// The batch, in the order every input and output is laid out.
    pub fn batch(&self) -> &[RequestId] {
        &self.ids
    }

    /// The layer the next [`DecodeStep::layer`] call must be for.
    pub fn next_layer(&self) -> usize {
        self.next_layer
    }

    /// The last layer's selections, locations and scores.
    pub fn view(&self) -> LayerView<'_, B::Memory> {
        let sb = &self.cache.scratch;
        LayerView {
            requests: &self.reqs,
            page_table: &sb.table,
            scores: &sb.scores,
            selections: &sb.selections,
            spans: &sb.sel_spans,
            locations: &sb.locations,
        }
    }

    /// The cache (its tiers, to read pools for dumps).
    pub fn cache(&self) -> &KvCache<B> {
        self.cache
    }

    /// Ends the step after its last layer: next-step prefetches are applied and every request
    /// of the batch moves one position on. Returns what the step counted and timed.
    pub fn end(mut self) -> Result<StepMetrics> {
        let layers = self.cache.cfg.geometry.layers;
        if self.next_layer != layers {
            return Err(EngineError::Input {
                field: "layer".into(),
                value: self.next_layer.to_string(),
                reason: format!("a step ends after its {layers} layers; requests of this one must be aborted"),
            });
        }
        self.prefetch_next_step()?;
        self.cache.advance(&self.ids);
        self.ended = true;
        self.metrics.tokens = self.ids.len();
        Ok(std::mem::take(&mut self.metrics))
    }

    /// After the last layer: every request's next-step nominations.
    fn prefetch_next_step(&mut self) -> Result<()> {
        let c = &mut *self.cache;
        if c.cfg.mode != Mode::HiSparse || c.prefetcher.name() == "none" {
            return Ok(());
        }
        let policy = c.policy.clone();
        // Scores of the last full layer, for score-aware policies' hooks.
        let scores = if policy.needs_scores() { Some(c.backend.memory().download(&c.scratch.scores)?) } else { None };
        let host = c.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
        for (i, id) in self.ids.iter().enumerate() {
            let q = &self.reqs[i];
            let own = scores.as_ref().and_then(|s| s.get(q.score_offset..q.score_offset + q.seq_len));
            let r = c.requests.get_mut(id).ok_or(EngineError::Request { id: id.0, reason: "not admitted".into() })?;
            let view =
                StepView { step: r.steps + 1, seq_len: q.seq_len, buffer_slots: c.cfg.hisparse.device_buffer_size };
            let to = PrefetchTarget { id: *id, swap: &mut r.swap, host, device: &mut c.device };
            let got = r.prefetch.apply(None, When::NextStep, policy.as_ref(), view, own, to)?;
            self.metrics.add_prefetch(got);
            r.prefetch.end_step();
        }
        Ok(())
    }
}

impl<B: Backend> Drop for DecodeStep<'_, B>
where
    B::Memory: Clone,
{
    fn drop(&mut self) {
        if !self.ended {
            for id in &self.ids {
                if let Some(r) = self.cache.requests.get_mut(id) {
                    r.broken = true;
                }
            }
        }
    }
}
