//! What a step reports ([`StepReport`]: metrics, dumps, digests, latencies) and a layer's dump
//! ([`LayerDump`], for `hisparse dump-step`).

use half::bf16;
use hisparse_memory::RequestId;

use crate::latency::TokenLatency;
use crate::metrics::StepMetrics;

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
    /// After [`super::Engine::capture_next_step`]: every layer's inputs and outputs.
    pub dump: Vec<LayerDump>,
    /// With `capture_digests`: a 64-bit digest of the attention output and LSE bits of each
    /// (request, token index, layer), token index counting the request's generated tokens from 0.
    pub digests: Vec<(RequestId, u32, u32, u64)>,
    /// The latency of every token this step decoded (its request's first: since arrival).
    pub latencies: Vec<TokenLatency>,
}
