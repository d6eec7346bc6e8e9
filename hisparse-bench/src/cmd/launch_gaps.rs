//! The launch-gap measurement of `hisparse kernel-bench`: one decode step's per-layer kernel
//! sequence (indexer → top-k → rows by position → attention, deepseek-v3.2 shapes, resident
//! rows) launched layer by layer from the host, against the same sequence captured once into a
//! CUDA graph and replayed. The difference is what launching costs on top of the kernels.

use hisparse_kernels::{Kernels, StepControl};
use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::{AttentionBatch, IndexerBatch, IndexerRequest, Span};
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowFormat, KvRowLayout};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::gpu_bench::{Figure, cuda, time_ms};
use crate::error::{BenchError, Result};

fn e(x: impl std::fmt::Display) -> BenchError {
    BenchError::Gpu(x.to_string())
}

/// The median time of one call of `f` replayed from a CUDA graph that holds `calls` of them back
/// to back: `f` is captured (it must only launch kernels: every per-call array already on the
/// device, as after the warm-up of `time_ms`), then the graph is replayed as `time_ms` times.
pub fn replay_ms(s: &Arc<CudaStream>, reps: usize, calls: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    s.synchronize().map_err(cuda("sync"))?;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(cuda("begin capture"))?;
    let captured = (0..calls.max(1)).try_for_each(|_| f());
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).map_err(cuda("end capture"))?;
    captured?;
    let graph = graph.ok_or_else(|| BenchError::Gpu("the capture recorded no work".into()))?;
    graph.upload().map_err(cuda("graph upload"))?;
    Ok(time_ms(s, reps, || graph.launch().map_err(cuda("graph launch")))? / calls.max(1) as f64)
}

/// Measures `layers` layers at `batch` requests of `ctx` tokens, eagerly and as one graph.
pub fn measure(
    gpu: &CudaBackend,
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    (batch, ctx, layers, reps): (usize, usize, usize, usize),
    figs: &mut Vec<Figure>,
) -> Result<()> {
    let mem = gpu.memory().clone();
    let (p, k, heads, ih) = (64usize, 2048usize, 128usize, 64usize);
    let key = IndexKeyLayout::new(128).map_err(e)?;
    let layout = KvRowLayout::new(KvRowFormat::Fp8, 512, 64).map_err(e)?;
    let pages = batch * ctx.div_ceil(p);
    let keys = mem.upload(&hisparse_kernels::random::index_key_pool(rng, key, pages * p).map_err(e)?).map_err(e)?;
    let (rows, _) = hisparse_kernels::random::kv_pool(rng, layout, pages * p).map_err(e)?;
    let rows = mem.upload(&rows).map_err(e)?;
    let mut ids: Vec<u32> = (0..pages as u32).collect();
    ids.shuffle(rng);
    let table = mem.upload(&ids).map_err(e)?;
    let per = ctx.div_ceil(p);
    let reqs: Vec<IndexerRequest> =
        (0..batch).map(|i| IndexerRequest { first_page: i * per, seq_len: ctx, score_offset: i * ctx }).collect();
    let spans: Vec<Span> = (0..batch).map(|i| Span::new(i * ctx, ctx)).collect();
    let sel_spans: Vec<Span> = (0..batch).map(|i| Span::new(i * k, k)).collect();
    let first: Vec<usize> = (0..batch).map(|i| i * per).collect();
    let q = mem.upload(&hisparse_kernels::random::normal_bf16(rng, batch * ih * 128, 1.0)).map_err(e)?;
    let w = mem.upload(&hisparse_kernels::random::head_weights(rng, batch * ih)).map_err(e)?;
    let aq = mem.upload(&hisparse_kernels::random::normal_bf16(rng, batch * heads * 576, 1.0)).map_err(e)?;
    let mut scores = mem.alloc_zeroed::<f32>(batch * ctx).map_err(e)?;
    let mut top = mem.alloc_zeroed::<i32>(batch * k).map_err(e)?;
    let mut locs = mem.alloc_zeroed::<i32>(batch * k).map_err(e)?;
    let mut out = mem.alloc_zeroed::<f32>(batch * heads * 512).map_err(e)?;
    let mut lse = mem.alloc_zeroed::<f32>(batch * heads).map_err(e)?;
    let mut step = || -> Result<()> {
        for _ in 0..layers {
            let ib = IndexerBatch {
                heads: ih,
                key_layout: key,
                queries: &q,
                weights: &w,
                keys: &keys,
                page_tokens: p,
                page_table: &table,
                requests: &reqs,
                pin_newest: true,
                queries_as: hisparse_kernels::IndexerQueries::Exact,
                score: hisparse_kernels::IndexScore::Lightning,
            };
            gpu.indexer_scores(&ib, &mut scores).map_err(e)?;
            gpu.top_k(&scores, &spans, k, &mut top).map_err(e)?;
            gpu.locate_rows(&top, &sel_spans, &table, &first, p, &mut locs).map_err(e)?;
            let ab = AttentionBatch {
                heads,
                layout,
                softmax_scale: 1.0 / 24.0,
                queries: &aq,
                rows: &rows,
                locations: &locs,
                selections: &sel_spans,
            };
            gpu.sparse_attention(&ab, &mut out, &mut lse).map_err(e)?;
        }
        Ok(())
    };
    let eager = time_ms(s, reps, &mut step)?;
    let replay = replay_ms(s, reps, 1, &mut step)?;
    gpu.finish_step().map_err(e)?;
    let per_layer = |ms: f64| 1e3 * ms / layers as f64;
    let name = format!("{layers} layers, batch {batch}, ctx {ctx}: eager launches");
    Figure::record(figs, name, per_layer(eager), "us/layer", String::new());
    let name = format!("{layers} layers, batch {batch}, ctx {ctx}: one CUDA graph");
    let note = format!("{:.1}% less than eager", 100.0 * (1.0 - replay / eager));
    Figure::record(figs, name, per_layer(replay), "us/layer", note);
    Ok(())
}
