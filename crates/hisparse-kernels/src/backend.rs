//! The `Backend` trait: the kernels of one decode step (indexer, top-k, sparse attention) over a
//! backend's own device memory, and the argument types they share.

use half::bf16;
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowLayout};

use crate::error::Result;

/// A buffer of `T` in backend `B`'s device memory.
pub type Buf<B, T> = <<B as Backend>::Memory as DeviceMemory>::Buffer<T>;

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

    /// One past the last element.
    pub fn end(&self) -> usize {
        self.offset + self.len
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

/// The kernels of one decode step, implemented once per device (CPU, CUDA).
///
/// Every method checks its arguments and returns a typed error naming the field at fault before
/// it writes anything.
pub trait Backend: Send + Sync {
    /// The memory this backend's kernels read and write.
    type Memory: DeviceMemory;

    /// A short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// The backend's device memory, to allocate buffers and copy data in and out.
    fn memory(&self) -> &Self::Memory;

    /// Indexer scores for every position of every request of `batch`, written to
    /// `scores[r.score_offset..r.score_offset + r.seq_len]` for each request `r`. The spans must
    /// not overlap.
    fn indexer_scores(&self, batch: &IndexerBatch<'_, Self::Memory>, scores: &mut Buf<Self, f32>) -> Result<()>;

    /// The `k` highest scores of each request's span of `scores`, ties going to the lower
    /// position, as positions in ascending order: request `i` writes `out[i * k..(i + 1) * k]`.
    /// Fails with [`crate::KernelError::TopKExceedsLength`] when a span is shorter than `k`.
    fn top_k(&self, scores: &Buf<Self, f32>, spans: &[Span], k: usize, out: &mut Buf<Self, i32>) -> Result<()>;

    /// Sparse attention of each request over its selected rows: `out` is `[batch, heads, d_v]`,
    /// `lse` is `[batch, heads]` (natural log of the softmax denominator, `-inf` for an empty
    /// selection, whose output is zero).
    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, Self::Memory>,
        out: &mut Buf<Self, f32>,
        lse: &mut Buf<Self, f32>,
    ) -> Result<()>;
}
