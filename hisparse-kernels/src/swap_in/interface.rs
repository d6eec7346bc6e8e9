//! `DeviceSwapIn`: a swap-in that reads the step's selections where the backend computed them
//! (device buffers) and writes the hot buffers and row locations there, as one call per layer
//! for the batch — the interface every backend's swap-in has ([`crate::Backend::device_swap_in`]):
//! CUDA keeps slot tables and policy records on the GPU (`cuda::CudaSwapIn`), the CPU backend
//! wraps the CPU swap-in step ([`crate::cpu::CpuSwapIn`]). Both make exactly the decisions of
//! `hisparse_policy::SwapInState::step`.

use std::sync::Arc;

use half::bf16;
use hisparse_memory::{DeviceMemory, KvGeometry, KvRowLayout};
use hisparse_policy::{OnlinePolicy, Prefetcher, SwapCounts};

use crate::batch::Span;
use crate::error::{KernelError, Result};

/// How a device swap-in is sized.
#[derive(Clone, Debug)]
pub struct DeviceSwapInConfig {
    /// The model geometry (layers, top-k, which layers share an index).
    pub geometry: KvGeometry,
    /// The eviction policy (on CUDA it must have a GPU form).
    pub policy: OnlinePolicy,
    /// The prefetcher (`none` on a backend that cannot prefetch yet).
    pub prefetcher: Arc<dyn Prefetcher>,
    /// Rows one nomination may bring into one buffer (0: the prefetcher's own bound).
    pub prefetch_budget: usize,
    /// Hot-buffer seats (requests at once).
    pub seats: usize,
    /// Regular slots per hot buffer (the reserved newest slot comes on top).
    pub device_buffer_size: usize,
    /// Threads per request of the decision kernel (CUDA).
    pub block_size: usize,
    /// Longest request (positions), for policies that keep a word per token.
    pub max_tokens: usize,
    /// Prefetch on the backend's main stream, in order, instead of a transfer stream of its
    /// own (CUDA; the results are the same).
    pub serial_prefetch: bool,
    /// Test hook: delay every transfer of prefetched rows, and every deferred swap-in, by this
    /// much (CUDA).
    pub transfer_delay: Option<std::time::Duration>,
}

/// What [`DeviceSwapIn::attend`] attends with besides the hot rows: [`crate::AttentionBatch`]
/// without its `rows` (the swap-in's own, which it writes).
pub struct AttentionQuery<'a, M: DeviceMemory> {
    /// Query heads.
    pub heads: usize,
    /// Layout of the KV rows.
    pub layout: KvRowLayout,
    /// Multiplier of `q . k` before the softmax.
    pub softmax_scale: f32,
    /// Queries, `[batch, heads, d_qk]`.
    pub queries: &'a M::Buffer<bf16>,
    /// The locations the swap-in's launch of the layer wrote.
    pub locations: &'a M::Buffer<i32>,
    /// One span of `locations` per request (the swap-in's `sel_offset`, `sel_len`).
    pub selections: &'a [Span],
}

impl<'a, M: DeviceMemory> AttentionQuery<'a, M> {
    /// The batch that attends over `rows` (every selected row already there).
    pub fn with_rows(&self, rows: &'a M::Buffer<u8>) -> crate::AttentionBatch<'a, M> {
        crate::AttentionBatch {
            heads: self.heads,
            layout: self.layout,
            softmax_scale: self.softmax_scale,
            queries: self.queries,
            rows,
            locations: self.locations,
            selections: self.selections,
        }
    }
}

impl<'a, M: DeviceMemory> crate::AttentionBatch<'a, M> {
    /// What the batch attends with besides its rows.
    pub fn query(&self) -> AttentionQuery<'a, M> {
        AttentionQuery {
            heads: self.heads,
            layout: self.layout,
            softmax_scale: self.softmax_scale,
            queries: self.queries,
            locations: self.locations,
            selections: self.selections,
        }
    }
}

hisparse_memory::c_struct! {
    /// One request of a step, for every layer of it (`#[repr(C)]`: the CUDA swap-in kernel reads
    /// it as is).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct DeviceSwapReq as SwapReq {
        /// Hot-buffer seat.
        pub seat: u32,
        /// Tokens in the sequence (the newest, `seq_len - 1`, included).
        pub seq_len: u32,
        /// The request's decode step (from 1).
        pub step: u32,
        /// First selected position in the selection buffer (also where its locations go).
        pub sel_offset: u32,
        /// Selected positions (strictly ascending).
        pub sel_len: u32,
        /// First of its host pages in the step's host-page list.
        pub page_offset: u32,
        /// First of its scores (by position) in the step's score buffer, for policies that read
        /// scores.
        pub score_offset: u32,
        /// Prefetch launches only: most rows the nomination brings into this buffer (0: none).
        pub prefetch_budget: u32,
        /// Request id.
        pub request: u64,
    }
}

/// Words a swap-in launch counts per request: hits, misses, evictions, useful prefetches (hits
/// on prefetched slots), wasted prefetches (prefetched slots evicted unused).
pub const SWAP_COUNTS: usize = 5;

/// A device swap-in over memory `M`. Calls of one step: [`DeviceSwapIn::begin_step`], then
/// [`DeviceSwapIn::launch`] per layer in order, then [`DeviceSwapIn::end_step`].
pub trait DeviceSwapIn<M: DeviceMemory>: Send {
    /// Empties `seat` in every layer for a new request; tokens `0..preload` are already in
    /// slots `0..preload` (a prompt that fits the buffer).
    fn reset_seat(&mut self, seat: usize, preload: usize) -> Result<()>;

    /// Switches the policy; every buffer's records are rebuilt from the slots' contents.
    fn set_policy(&mut self, policy: OnlinePolicy) -> Result<()>;

    /// The step's requests and their host pages (concatenated; see `page_offset`).
    fn begin_step(&mut self, reqs: &[DeviceSwapReq], host_pages: &[u32]) -> Result<()>;

    /// The swap-in of `layer`: selections (positions, per request from its `sel_offset`) →
    /// `locations` (the hot-buffer row of each selected token, same indexing); missed rows are
    /// copied from the host tier into `hot[layer]` (`hot`: every layer's hot-buffer pool, which
    /// the prefetches of later layers fill). `scores` (by position, per request from its
    /// `score_offset`) for policies and prefetchers that read them.
    fn launch(
        &mut self,
        layer: usize,
        selections: &M::Buffer<i32>,
        scores: Option<&M::Buffer<f32>>,
        hot: &mut [M::Buffer<u8>],
        locations: &mut M::Buffer<i32>,
    ) -> Result<()>;

    /// Orders everything the swap-in queued on streams of its own (prefetches) before the
    /// backend's later work; the default has none.
    fn settle(&mut self) -> Result<()> {
        Ok(())
    }

    /// Whether [`DeviceSwapIn::launch`] leaves the missed rows for [`DeviceSwapIn::attend`]
    /// (then the engine attends through the swap-in); the default copies them itself.
    fn fills_in_attention(&self) -> bool {
        false
    }

    /// Sparse attention of `layer` (as [`crate::Kernels::sparse_attention`]) over `hot[layer]`,
    /// bringing in on the way the misses that the layer's last [`DeviceSwapIn::launch`] left
    /// (and writing them into `hot[layer]`), for a swap-in that
    /// [`DeviceSwapIn::fills_in_attention`]; the outputs are bit-identical to copying first.
    fn attend(
        &mut self,
        layer: usize,
        query: &AttentionQuery<'_, M>,
        hot: &mut [M::Buffer<u8>],
        out: &mut M::Buffer<f32>,
        lse: &mut M::Buffer<f32>,
    ) -> Result<()> {
        let _ = (query, hot, out, lse);
        Err(KernelError::invalid(
            "miss_fill",
            layer,
            "this swap-in copies its misses itself; attend with the backend's sparse_attention",
        ))
    }

    /// Records that the launches of layers `0..layers` ran as a replayed capture of earlier
    /// launches (their counts are then read by [`DeviceSwapIn::end_step`] as if launched).
    fn note_replayed(&mut self, layers: usize);

    /// After the last layer: applies the prefetches due at the step's end into `hot` (every
    /// layer's hot-buffer pool), waits for the step's launches and returns what they counted.
    fn end_step(&mut self, hot: &mut [M::Buffer<u8>]) -> Result<SwapCounts>;
}
