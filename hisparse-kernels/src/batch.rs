//! The argument types of the kernels ([`crate::Kernels`]): per-request spans of packed arrays,
//! the indexer's and the attention's batches, and the stages a backend times.

use half::bf16;
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowLayout};

use crate::error::Result;

/// One request's part of a packed per-request array: elements `offset..offset + len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// A span of `len` elements from `offset`.
    pub fn new(offset: usize, len: usize) -> Self {
        Self { offset, len }
    }

    /// One past the last element. A span whose end overflows ends at `usize::MAX`, past every
    /// buffer, so that every bounds check refuses it.
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.len)
    }
}

/// Checks a batched row write before anything is written: `data` holds `rows.len()` rows of
/// `row_bytes` (no overflow), and every row index lies inside a pool of `pool_len` bytes.
pub fn check_rows_fit(rows: &[u32], row_bytes: usize, data_len: usize, pool_len: usize) -> Result<()> {
    let want = rows
        .len()
        .checked_mul(row_bytes)
        .ok_or_else(|| crate::KernelError::invalid("rows", rows.len(), format!("rows of {row_bytes} B overflow")))?;
    crate::error::check_len("data", want, data_len)?;
    let pool_rows = pool_len / row_bytes.max(1);
    match rows.iter().find(|&&r| r as usize >= pool_rows) {
        Some(&bad) => Err(crate::KernelError::invalid("rows", bad, format!("the pool holds {pool_rows} rows"))),
        None => Ok(()),
    }
}

/// Where one request's index keys are and where its scores go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexerRequest {
    /// Index into the page table of the request's first page: the key of position `t` is row
    /// `page_table[first_page + t / page_tokens] * page_tokens + t % page_tokens` of the pool.
    pub first_page: usize,
    /// Number of positions to score.
    pub seq_len: usize,
    /// Index of the score of position 0 in the output buffer.
    pub score_offset: usize,
}

/// The lightning indexer over a batch of requests of different lengths:
/// `s_t = sum_h w_h * relu(q_h . k_t)`.
pub struct IndexerBatch<'a, M: DeviceMemory> {
    /// Indexer heads.
    pub heads: usize,
    /// Layout of one key (its `dim` is the head dim).
    pub key_layout: IndexKeyLayout,
    /// Queries, `[batch, heads, dim]`.
    pub queries: &'a M::Buffer<bf16>,
    /// Head weights, `[batch, heads]`.
    pub weights: &'a M::Buffer<f32>,
    /// The key pool: rows of `key_layout.row_bytes()` bytes, in pages of `page_tokens` rows.
    pub keys: &'a M::Buffer<u8>,
    /// Positions per page of the key pool.
    pub page_tokens: usize,
    /// Page ids of every request, concatenated (see [`IndexerRequest::first_page`]).
    pub page_table: &'a M::Buffer<u32>,
    /// One entry per request of the batch.
    pub requests: &'a [IndexerRequest],
    /// Score each request's last position `+inf` instead (the newest token is always selected).
    pub pin_newest: bool,
    /// The queries' precision: exact, or quantised per head to e4m3 (see [`IndexerQueries`](crate::IndexerQueries)).
    pub queries_as: crate::IndexerQueries,
    /// How a position's score is formed from the heads' products.
    pub score: IndexScore,
}

/// How the indexer forms a position's score from the heads' products `x_h(t) = q_h . k_t`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IndexScore {
    /// DSA's lightning indexer: `s_t = sum_h w_h * relu(x_h(t))`.
    #[default]
    Lightning,
    /// The selection of a model without an indexer, by its own attention: per head the softmax
    /// of `w_h * x_h(t)` over the request's positions (`w_h`: the softmax scale), combined over
    /// heads; the keys are the model's keys stored as index keys (exact queries on CUDA).
    Oracle(OracleScore),
}

/// The oracle's settings ([`IndexScore::Oracle`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct OracleScore {
    /// How the heads' attention weights are combined.
    pub combine: HeadCombine,
    /// The first `sink` positions are always selected (scored `+inf`).
    pub sink: usize,
    /// The last `window` positions are always selected (scored `+inf`).
    pub window: usize,
}

/// How the oracle combines the heads' attention weights of a position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadCombine {
    /// The sum over heads (the attention mass the position carries).
    #[default]
    Sum,
    /// The largest weight any head gives it.
    Max,
}

impl HeadCombine {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Max => "max",
        }
    }
}

/// Sparse MLA decode attention of one query token per request over a list of KV rows.
pub struct AttentionBatch<'a, M: DeviceMemory> {
    /// Query heads.
    pub heads: usize,
    /// Layout of the KV rows (and so `d_qk` and `d_v`).
    pub layout: KvRowLayout,
    /// Multiplier of `q . k` before the softmax.
    pub softmax_scale: f32,
    /// Queries, `[batch, heads, d_qk]`.
    pub queries: &'a M::Buffer<bf16>,
    /// The KV row pool: rows of `layout.row_bytes()` bytes.
    pub rows: &'a M::Buffer<u8>,
    /// Row indices into the pool; request `i` attends to `locations[selections[i]]`, in that order.
    pub locations: &'a M::Buffer<i32>,
    /// One span of `locations` per request of the batch.
    pub selections: &'a [Span],
}

/// A stage of the decode step that a backend can time on its own clock ([`crate::StepControl::mark_stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelStage {
    /// The indexer.
    Indexer,
    /// Top-k.
    TopK,
    /// The swap-in (decisions and miss copies).
    SwapIn,
    /// Sparse attention.
    Attention,
    /// Layers replayed as one captured launch sequence (every stage of them).
    Graph,
    /// The emulated model's non-attention GEMMs.
    Model,
    /// The collectives of a data-parallel deployment around them (the batch agreement, the
    /// all-gathers and reduce-scatters, the logits' gather).
    Exchange,
}

/// Seconds a backend measured per stage on its own clock (CUDA: events on its stream).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageSeconds {
    /// Indexer.
    pub indexer: f64,
    /// Top-k.
    pub top_k: f64,
    /// Swap-in.
    pub swap_in: f64,
    /// Attention.
    pub attention: f64,
    /// Replayed launch sequences ([`crate::StepControl::replay`]).
    pub graph: f64,
    /// The emulated model's GEMMs.
    pub model: f64,
    /// The ranks' collectives.
    pub exchange: f64,
}

impl StageSeconds {
    /// Adds `secs` to `stage`.
    pub fn add(&mut self, stage: KernelStage, secs: f64) {
        match stage {
            KernelStage::Indexer => self.indexer += secs,
            KernelStage::TopK => self.top_k += secs,
            KernelStage::SwapIn => self.swap_in += secs,
            KernelStage::Attention => self.attention += secs,
            KernelStage::Graph => self.graph += secs,
            KernelStage::Model => self.model += secs,
            KernelStage::Exchange => self.exchange += secs,
        }
    }
}
