//! [`Scratch`]: the buffers the backend's launches reuse across calls.

use cudarc::driver::CudaSlice;

use super::attention_launch::AttnScratch;
use super::facts::{GpuIndexerReq, GpuSpan, LocateReq};

/// Buffers reused across calls (small per-call arrays, split partials, the fault flag).
pub(crate) struct Scratch {
    pub(crate) fault: CudaSlice<u32>,
    pub(crate) reqs: CudaSlice<GpuIndexerReq>,
    pub(crate) spans: CudaSlice<GpuSpan>,
    pub(crate) attn: AttnScratch,
    pub(crate) rows_data: CudaSlice<u8>,
    pub(crate) locate: CudaSlice<LocateReq>,
    pub(crate) seeds: CudaSlice<u64>,
    /// The oracle's logits (a row of heads per scored position), its per-head statistics, its
    /// tiles' partial statistics, the list of key chunks each block of heads reads, the
    /// queries as the tensor cores take them (f16 pairs, scaled per head) and the scales' inverses.
    pub(crate) oracle_logits: CudaSlice<f32>,
    pub(crate) oracle_stats: CudaSlice<f32>,
    pub(crate) oracle_partials: CudaSlice<f32>,
    pub(crate) oracle_chunks: CudaSlice<u8>,
    pub(crate) oracle_queries: CudaSlice<u32>,
    pub(crate) oracle_scales: CudaSlice<f32>,
    /// What the per-call arrays above hold (they are the same for every layer of a step).
    pub(crate) reqs_c: Vec<GpuIndexerReq>,
    pub(crate) spans_c: Vec<GpuSpan>,
    pub(crate) locate_c: Vec<LocateReq>,
}
