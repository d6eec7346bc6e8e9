//! One decode step through the cache: [`KvCache::begin_step`] grows every request of the batch
//! by one position and plans, once for all layers, what they share in the backend's memory —
//! the indexer's page table, where each request's selection goes (requests longer than top-k
//! first, at `j * top_k`, where top-k writes them; shorter ones after, holding all their
//! positions), the new token's destination rows, the resident page table, the swap-in's
//! requests and the backup's rows; [`DecodeStep::layer`] runs one layer on the caller's tensors
//! (`layer.rs`); [`DecodeStep::end`] applies the step-end prefetches, rejoins the backups and
//! advances the requests.
//!
//! Invariant: a step's layers run in order, each once; a step dropped before [`DecodeStep::end`]
//! marks its requests broken (their newest position is incomplete) and they can only be freed.
//! Invariant: `StepScratch::generation` changes whenever a buffer the layers read by address is
//! reallocated (a launch sequence captured earlier may then not be replayed).

use std::collections::HashSet;

use half::bf16;
use hisparse_kernels::{Backend, DeviceSwapIn, DeviceSwapReq, IndexerRequest, RowBackup, Span};
use hisparse_memory::{DeviceMemory, Element, RequestId};

use super::KvCache;
use crate::error::{EngineError, Result};
use crate::metrics::StepMetrics;

/// Buffers a step reuses from the last one, in the backend's memory (kernels overwrite their
/// outputs whole), and host copies for views.
pub(crate) struct StepScratch<M: DeviceMemory> {
    pub table: M::Buffer<u32>,
    pub scores: M::Buffer<f32>,
    pub sel: M::Buffer<i32>,
    pub locs: M::Buffer<i32>,
    pub dest_keys: M::Buffer<u32>,
    /// The new keys' positions, in the batch's order, where a row summarises several positions
    /// (page summaries: a key folds into its row; empty otherwise).
    pub key_positions: Vec<usize>,
    pub dest_rows: M::Buffer<u32>,
    pub kv_table: M::Buffer<u32>,
    /// Bumped whenever a buffer above is reallocated.
    pub generation: u64,
    /// The short requests' selections (all their positions), staged.
    pub template: Vec<i32>,
    /// The view of the last layer (host copies), when asked for.
    pub selections: Vec<u32>,
    pub view_spans: Vec<Span>,
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
    /// Selected positions, ascending per request, concatenated in batch order.
    pub selections: &'s [u32],
    /// Each request's span of `selections`.
    pub spans: &'s [Span],
    /// The pool row attention read for each selected position (hot-buffer row in hisparse
    /// mode, KV-pool row in resident mode), as `selections`.
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
    /// The score spans of the requests longer than top-k, in batch order (top-k's input).
    pub(super) topk_spans: Vec<Span>,
    /// Each request's span of the selection buffer (and of the locations).
    pub(super) sel_spans: Vec<Span>,
    /// The requests read by position (resident mode; hybrid placement's requests on the
    /// device): each one's first entry of the KV page table, and its span of the selections.
    pub(super) kv_first: Vec<usize>,
    pub(super) kv_spans: Vec<Span>,
    /// Some request of the batch reads its hot buffer (hisparse, or demoted in hybrid).
    pub(super) swaps: bool,
    /// Some request rewrites its reserved slot this step (hisparse): layers fence first.
    pub(super) fence: bool,
    pub(super) next_layer: usize,
    pub(super) metrics: StepMetrics,
    /// A layer failed after its checks: the step can only be dropped.
    pub(super) failed: bool,
    /// The layer whose view the scratch holds.
    pub(super) viewed: Option<usize>,
    ended: bool,
}

impl<M: DeviceMemory> StepScratch<M> {
    pub(crate) fn new(mem: &M) -> Result<Self> {
        Ok(Self {
            table: mem.alloc_zeroed(0)?,
            scores: mem.alloc_zeroed(0)?,
            sel: mem.alloc_zeroed(0)?,
            locs: mem.alloc_zeroed(0)?,
            dest_keys: mem.alloc_zeroed(0)?,
            key_positions: Vec::new(),
            dest_rows: mem.alloc_zeroed(0)?,
            kv_table: mem.alloc_zeroed(0)?,
            generation: 0,
            template: Vec::new(),
            selections: Vec::new(),
            view_spans: Vec::new(),
            locations: Vec::new(),
        })
    }
}

/// Writes `src` into `buf` from its start, reallocating it (to exactly `src.len()` with `exact`,
/// else with headroom) only when it must; `true` when it was reallocated. An empty `src` leaves
/// `buf` as it is: a backend may give a zero-length allocation one element (CUDA does), and
/// reallocating it every step would make every step's launch graph new.
fn put<M: DeviceMemory, T: Element>(mem: &M, buf: &mut M::Buffer<T>, src: &[T], exact: bool) -> Result<bool> {
    if src.is_empty() {
        return Ok(false);
    }
    let have = mem.len(buf);
    let moved = if exact { have != src.len() } else { have < src.len() };
    if moved {
        *buf = mem.alloc_zeroed(if exact { src.len() } else { src.len().max(1).next_power_of_two() })?;
    }
    mem.write(buf, 0, src)?;
    Ok(moved)
}

/// Makes `buf` hold at least `len` elements (with headroom); `true` when it was reallocated.
fn room<M: DeviceMemory, T: Element>(mem: &M, buf: &mut M::Buffer<T>, len: usize) -> Result<bool> {
    if mem.len(buf) >= len {
        return Ok(false);
    }
    *buf = mem.alloc_zeroed(len.max(1).next_power_of_two())?;
    Ok(true)
}

impl<B: Backend> KvCache<B>
where
    B::Memory: Clone,
{
    /// Begins a decode step for `batch` (each request at most once; each decodes one token at
    /// its next position, which must lie within its reservation). Fails, changing nothing,
    /// naming the request that cannot take part.
    pub fn begin_step(&mut self, batch: &[RequestId]) -> Result<DecodeStep<'_, B>> {
        self.check_batch(batch)?;
        self.promote_where_room()?;
        let on_device = batch.iter().map(|&id| self.on_device(id)).collect::<Result<Vec<bool>>>()?;
        let (reqs, table) = self.grow_for_step(batch)?;
        let (k, b) = (self.cfg.geometry.top_k, self.cfg.hisparse.device_buffer_size);
        let long: Vec<usize> = (0..reqs.len()).filter(|&i| reqs[i].seq_len > k).collect();
        let topk_spans: Vec<Span> = long.iter().map(|&i| Span::new(reqs[i].score_offset, reqs[i].seq_len)).collect();

        // Where each request's selection goes: long ones where top-k writes them, then the
        // short ones (all their positions, written here once for every layer).
        let mut sel_spans = vec![Span::default(); reqs.len()];
        for (j, &i) in long.iter().enumerate() {
            sel_spans[i] = Span::new(j * k, k);
        }
        let sb = &mut self.scratch;
        sb.template.clear();
        let short_base = long.len() * k;
        for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.seq_len <= k) {
            sel_spans[i] = Span::new(short_base + sb.template.len(), r.seq_len);
            sb.template.extend(0..r.seq_len as i32);
        }
        let selected = short_base + sb.template.len();

        // The new token's destination rows (the same row of every layer's pool), and the
        // resident page table or the swap-in's requests and the backup's rows.
        let (mut dest_keys, mut dest_rows) = (Vec::with_capacity(batch.len()), Vec::with_capacity(batch.len()));
        let mut fence = false;
        let keeps_index = self.cfg.keeps_index();
        let summaries = self.key.positions_per_row() > 1;
        self.scratch.key_positions.clear();
        for ((id, q), &by_position) in batch.iter().zip(&reqs).zip(&on_device) {
            let p = q.seq_len - 1;
            if keeps_index {
                dest_keys.push(self.device.index_key_row(*id, p)? as u32);
            }
            if keeps_index && summaries {
                self.scratch.key_positions.push(p);
            }
            dest_rows.push(if by_position {
                self.device.kv_row(*id, p)? as u32
            } else {
                fence |= p >= b;
                self.device.hot_row(*id, p.min(b))? as u32
            });
        }
        let mem = self.backend.memory().clone();
        let sb = &mut self.scratch;
        let mut moved = put(&mem, &mut sb.table, &table, false)?;
        // Scores grow by one position per request and step: keep headroom.
        let total = reqs.iter().map(|r| r.seq_len).sum::<usize>();
        moved |= room(&mem, &mut sb.scores, total + 64 * reqs.len())?;
        moved |= room(&mem, &mut sb.sel, selected)?;
        moved |= room(&mem, &mut sb.locs, selected)?;
        if !sb.template.is_empty() {
            mem.write(&mut sb.sel, short_base, &sb.template)?;
        }
        moved |= put(&mem, &mut sb.dest_keys, &dest_keys, true)?;
        moved |= put(&mem, &mut sb.dest_rows, &dest_rows, true)?;
        let (mut kv_first, mut kv_spans, mut kv_table) = (Vec::new(), Vec::new(), Vec::new());
        let mut hot = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, id) in batch.iter().enumerate() {
            if on_device[i] {
                kv_first.push(kv_table.len());
                kv_spans.push(sel_spans[i]);
                kv_table.extend_from_slice(self.device.kv_pages(*id)?);
            } else {
                hot.0.push(*id);
                hot.1.push(reqs[i]);
                hot.2.push(sel_spans[i]);
                hot.3.push(dest_rows[i]);
            }
        }
        moved |= put(&mem, &mut self.scratch.kv_table, &kv_table, false)?;
        let swaps = !hot.0.is_empty();
        if self.cfg.mode.has_host_tier() {
            // Every step begins the swap-in's and the backup's (an empty plan where every
            // request of a hybrid batch is on the device).
            self.plan_hisparse(&hot.0, &hot.1, &hot.2, &hot.3)?;
        }
        self.scratch.generation += u64::from(moved);
        Ok(DecodeStep {
            cache: self,
            ids: batch.to_vec(),
            reqs,
            topk_spans,
            sel_spans,
            kv_first,
            kv_spans,
            swaps,
            fence,
            next_layer: 0,
            metrics: StepMetrics::default(),
            failed: false,
            viewed: None,
            ended: false,
        })
    }

    /// The swap-in's requests and host pages, and the backup's rows, of a hisparse step.
    fn plan_hisparse(
        &mut self,
        batch: &[RequestId],
        reqs: &[IndexerRequest],
        sel_spans: &[Span],
        dest_rows: &[u32],
    ) -> Result<()> {
        let host = self.host.as_ref().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
        let rb = host.row_bytes() as u64;
        let (mut dreqs, mut pages, mut host_rows) = (Vec::new(), Vec::new(), Vec::with_capacity(batch.len()));
        for ((id, q), s) in batch.iter().zip(reqs).zip(sel_spans) {
            let r = self.request(*id)?;
            // Offsets and lengths below 2^31: positions and the batch's selections are.
            dreqs.push(DeviceSwapReq {
                seat: self.device.seat(*id)? as u32,
                seq_len: q.seq_len as u32,
                step: r.steps + 1,
                sel_offset: s.offset as u32,
                sel_len: s.len as u32,
                page_offset: pages.len() as u32,
                score_offset: q.score_offset as u32,
                prefetch_budget: 0,
                request: id.0,
            });
            pages.extend_from_slice(host.pages(*id)?);
            host_rows.push(host.locate(*id, 0, q.seq_len - 1)?.0 / rb);
        }
        let (swap, backup) = (self.swap.as_mut(), self.backup.as_mut());
        let (Some(swap), Some(backup)) = (swap, backup) else {
            return Err(EngineError::Worker("hisparse mode without a swap-in".into()));
        };
        swap.begin_step(&dreqs, &pages)?;
        backup.begin_step(dest_rows, &host_rows)?;
        Ok(())
    }

    /// Checks that every request of `batch` may decode a token now.
    fn check_batch(&self, batch: &[RequestId]) -> Result<()> {
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
        Ok(())
    }

    /// Grows each request of `batch` by one position in the tiers; returns the indexer's
    /// requests and page table of the batch.
    fn grow_for_step(&mut self, batch: &[RequestId]) -> Result<(Vec<IndexerRequest>, Vec<u32>)> {
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
            // Pages for positions 0..n were grown above (none where the cache keeps no keys).
            let pages = self.device.index_pages(id)?;
            table.extend_from_slice(&pages[..n.div_ceil(p_tok).min(pages.len())]);
            total += n;
        }
        Ok((reqs, table))
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

    /// The cache (its tiers, to read pools for dumps).
    pub fn cache(&self) -> &KvCache<B> {
        self.cache
    }

    /// A number that changes whenever a buffer the step's launches read by address moved
    /// (for keying captured launch sequences).
    pub fn generation(&self) -> u64 {
        self.cache.scratch.generation
    }

    /// The last layer's selections, locations and scores. Reads them from the backend's memory
    /// (on a GPU, it waits for the layer's kernels), once per layer.
    pub fn view(&mut self) -> Result<LayerView<'_, B::Memory>> {
        self.load_view()?;
        Ok(self.loaded_view())
    }

    /// Reads the last layer's selections and locations into the scratch (once per layer).
    pub(crate) fn load_view(&mut self) -> Result<()> {
        let last = self.next_layer.checked_sub(1);
        if last.is_none() || self.viewed == last {
            return Ok(());
        }
        let mem = self.cache.backend.memory();
        let sb = &mut self.cache.scratch;
        let (sel, locs) = (mem.download(&sb.sel)?, mem.download(&sb.locs)?);
        sb.selections.clear();
        sb.view_spans.clear();
        sb.locations.clear();
        for s in &self.sel_spans {
            sb.view_spans.push(Span::new(sb.selections.len(), s.len));
            sb.selections.extend(sel[s.offset..s.end()].iter().map(|&x| x as u32));
            sb.locations.extend_from_slice(&locs[s.offset..s.end()]);
        }
        self.viewed = last;
        Ok(())
    }

    /// The view [`DecodeStep::load_view`] read.
    pub(crate) fn loaded_view(&self) -> LayerView<'_, B::Memory> {
        let sb = &self.cache.scratch;
        LayerView {
            requests: &self.reqs,
            page_table: &sb.table,
            scores: &sb.scores,
            selections: &sb.selections,
            spans: &sb.view_spans,
            locations: &sb.locations,
        }
    }

    /// Ends the step after its last layer: the step-end prefetches are applied, the backups
    /// rejoin the backend's order, the backend's work is waited for, and every request of the
    /// batch moves one position on. Returns what the step counted and timed.
    pub fn end(mut self) -> Result<StepMetrics> {
        let layers = self.cache.cfg.geometry.layers;
        if self.next_layer != layers || self.failed {
            return Err(EngineError::Input {
                field: "layer".into(),
                value: self.next_layer.to_string(),
                reason: format!("a step ends after its {layers} layers; requests of this one must be aborted"),
            });
        }
        let c = &mut *self.cache;
        let m = &mut self.metrics;
        if let (Some(swap), Some(backup)) = (c.swap.as_mut(), c.backup.as_mut()) {
            let counts = swap.end_step(c.device.hot_pools_mut())?;
            backup.join()?;
            m.swap += counts;
            let backed_up = self.ids.len() - self.kv_spans.len();
            m.bytes_d2h += (backed_up * layers * c.kv_row.row_bytes()) as u64;
        }
        // Rows read by position are hits: they are on the device.
        m.swap.hits += (self.kv_spans.iter().map(|s| s.len).sum::<usize>() * layers) as u64;
        if let Some(s) = c.backend.finish_step()? {
            m.stages.indexer = s.indexer;
            m.stages.top_k = s.top_k;
            m.stages.swap_in = s.swap_in;
            m.stages.attention = s.attention;
            m.stages.graph = s.graph;
            m.stages.model = s.model;
            m.stages.exchange = s.exchange;
        }
        for id in &self.ids {
            if let Some(r) = c.requests.get_mut(id) {
                r.seq_len += 1;
                r.steps += 1;
            }
        }
        self.ended = true;
        self.metrics.tokens = self.ids.len();
        Ok(std::mem::take(&mut self.metrics))
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
