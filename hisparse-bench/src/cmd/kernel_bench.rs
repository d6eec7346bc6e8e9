//! `hisparse kernel-bench` (feature `cuda`): the decode kernels of the CUDA backend against the
//! ceilings measured in the same run — a device-to-device copy (HBM bytes/s, read + write) and a
//! cuBLAS bf16 GEMM (FLOP/s). Indexer bytes/s at 32k and 128k context for 64 and 32 heads, top-k
//! latency for 2048 of 32k/128k, sparse attention FLOP/s for fp8 and bf16 rows at 64 and 128
//! heads over batch sizes; with `--only oracle`, a dense grouped-query model's oracle scores
//! (`kernel_bench_oracle.rs`). Inputs are random, in distinct memory per request (no cache reuse).
//! Medians of CUDA-event timings after warm-up.

use hisparse_kernels::{Kernels, StepControl};
use std::path::PathBuf;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas};
use half::bf16;
use hisparse_kernels::cuda::{CudaBackend, FixedHeadIndexer};
use hisparse_kernels::{AttentionBatch, IndexerBatch, IndexerQueries, IndexerRequest, Span};
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowFormat, KvRowLayout};
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};

use super::gpu_bench::{Figure, cuda, time_ms};
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::guard;

/// Options of `hisparse kernel-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelBenchArgs {
    /// Batch sizes, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128")]
    pub batches: Vec<usize>,
    /// Context lengths of the indexer and top-k, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "32768,131072")]
    pub contexts: Vec<usize>,
    /// Timed repetitions (medians are reported).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Sections to run, comma separated: indexer (with top-k), attention, graphs (launch gaps),
    /// oracle (a dense grouped-query model's selection; batches up to 64);
    /// the ceilings always run.
    #[arg(long, value_delimiter = ',', default_value = "indexer,attention,graphs")]
    pub only: Vec<String>,
    /// Fixed split counts of the warpgroup-MMA attention to time beside its own choice, comma
    /// separated (none by default).
    #[arg(long, value_delimiter = ',')]
    pub attention_splits: Vec<usize>,
    /// Output folder.
    #[arg(long, default_value = "results/kernel-bench")]
    pub out: PathBuf,
}

fn kerr(e: hisparse_kernels::KernelError) -> BenchError {
    BenchError::Kernel(e)
}

/// Random e4m3 codes (no NaN codes) with unit f32 scales: `rows` index keys of 132 B.
fn random_keys(rng: &mut rand::rngs::StdRng, rows: usize) -> Vec<u8> {
    let mut v = vec![0u8; rows * 132];
    rng.fill_bytes(&mut v);
    for r in v.chunks_mut(132) {
        r[..128].iter_mut().for_each(|c| *c &= 0xf7);
        r[128..].copy_from_slice(&1f32.to_le_bytes());
    }
    v
}

/// Random rows of `layout` with moderate values (bf16 in [2^-7, 2)) and unit fp8 scales.
fn random_rows(rng: &mut rand::rngs::StdRng, layout: KvRowLayout, rows: usize) -> Vec<u8> {
    let rb = layout.row_bytes();
    let mut v = vec![0u8; rows * rb];
    rng.fill_bytes(&mut v);
    for r in v.chunks_mut(rb) {
        let rope = layout.bf16_offset();
        if let Some(at) = layout.scales_offset() {
            r[..at].iter_mut().for_each(|c| *c &= 0xb7);
            for s in r[at..rope].chunks_mut(4) {
                s.copy_from_slice(&1f32.to_le_bytes());
            }
        }
        for x in r[rope..].chunks_mut(2) {
            x[1] = 0x3c | (x[1] & 0x80);
        }
    }
    v
}

/// Runs every measurement; returns the figures.
pub fn run(a: &KernelBenchArgs) -> Result<Vec<Figure>> {
    guard::within("reps", a.reps, 1, 100_000)?;
    for &b in &a.batches {
        guard::within("batches", b, 1, 4096)?;
    }
    for &c in &a.contexts {
        guard::within("contexts", c, 2048, 1 << 24)?;
    }
    if let Some(o) = a.only.iter().find(|o| !["indexer", "attention", "graphs", "oracle"].contains(&o.as_str())) {
        return Err(BenchError::flag("only", o, "sections are indexer, attention, graphs and oracle"));
    }
    for &n in &a.attention_splits {
        guard::within("attention-splits", n, 1, 4096)?;
    }
    let out = OutputDir::prepare("out", &a.out)?;
    let gpu = CudaBackend::new(0).map_err(kerr)?;
    let mem = gpu.memory().clone();
    let s = gpu.device().stream().clone();
    let mut figs = Vec::new();
    let mut push =
        |name: String, value: f64, unit: &str, note: String| Figure::record(&mut figs, name, value, unit, note);
    crate::console::note(&format!("device: {}", gpu.device().name().map_err(kerr)?));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    // Ceilings: HBM copy and a cuBLAS bf16 GEMM.
    let n = 2usize << 30;
    let src = s.alloc_zeros::<u8>(n).map_err(cuda("alloc"))?;
    let mut dst = s.alloc_zeros::<u8>(n).map_err(cuda("alloc"))?;
    let ms = time_ms(&s, a.reps, || s.memcpy_dtod(&src, &mut dst).map_err(cuda("dtod")))?;
    let hbm = 2.0 * n as f64 / (ms * 1e-3);
    push("HBM device-to-device copy, 2 GiB (read + write)".into(), hbm / 1e9, "GB/s", "ceiling".into());
    drop((src, dst));
    if !hisparse_kernels::cuda::blas_available() {
        return Err(BenchError::Gpu("libcublas not found (set LD_LIBRARY_PATH to the CUDA lib64)".into()));
    }
    let blas_h = CudaBlas::new(s.clone()).map_err(|e| BenchError::Gpu(format!("cuBLAS: {e}")))?;
    let d = 8192usize;
    let am = mem
        .upload(&hisparse_kernels::random::normal_bf16(&mut rng, d * d, 0.1))
        .map_err(|e| BenchError::Gpu(e.to_string()))?;
    let bm = mem
        .upload(&hisparse_kernels::random::normal_bf16(&mut rng, d * d, 0.1))
        .map_err(|e| BenchError::Gpu(e.to_string()))?;
    let mut cm = mem.alloc_zeroed::<bf16>(d * d).map_err(|e| BenchError::Gpu(e.to_string()))?;
    let cfg = GemmConfig {
        transa: blas::cublasOperation_t::CUBLAS_OP_N,
        transb: blas::cublasOperation_t::CUBLAS_OP_N,
        m: d as i32,
        n: d as i32,
        k: d as i32,
        alpha: bf16::ONE,
        lda: d as i32,
        ldb: d as i32,
        beta: bf16::ZERO,
        ldc: d as i32,
    };
    let ms = time_ms(&s, a.reps.min(10), || {
        // SAFETY: all three matrices hold d x d elements.
        unsafe { blas_h.gemm(cfg, &am, &bm, &mut cm) }.map_err(|e| BenchError::Gpu(format!("cuBLAS gemm: {e}")))
    })?;
    let gemm = 2.0 * (d as f64).powi(3) / (ms * 1e-3);
    push(format!("cuBLAS bf16 GEMM {d}^3 (fp32 accumulate)"), gemm / 1e12, "TFLOP/s", "ceiling".into());
    drop((am, bm, cm));

    let want = |x: &str| a.only.iter().any(|o| o == x);
    if want("indexer") {
        indexer_and_top_k(a, &gpu, &s, &mut rng, hbm, &mut figs)?;
    }
    if want("attention") {
        attention(a, &gpu, &s, &mut rng, gemm, &mut figs)?;
    }
    if want("oracle") {
        super::kernel_bench_oracle::oracle((&a.contexts, &a.batches, a.reps), &gpu, &s, &mut rng, hbm, &mut figs)?;
    }
    if want("graphs") {
        for b in [1usize, 8, 64] {
            super::launch_gaps::measure(&gpu, &s, &mut rng, (b, 32768, 61, a.reps.min(10)), &mut figs)?;
        }
    }
    gpu.finish_step().map_err(kerr)?;
    out.write_json("kernel-bench.json", &figs)?;
    out.commit()?;
    Ok(figs)
}

/// Indexer bytes/s and top-k latency over contexts and batches.
fn indexer_and_top_k(
    a: &KernelBenchArgs,
    gpu: &CudaBackend,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    rng: &mut rand::rngs::StdRng,
    hbm: f64,
    figs: &mut Vec<Figure>,
) -> Result<()> {
    let mem = gpu.memory().clone();
    let mut push = |name: String, value: f64, unit: &str, note: String| Figure::record(figs, name, value, unit, note);
    let key = IndexKeyLayout::new(128).map_err(|e| BenchError::Gpu(e.to_string()))?;
    let ctx_max = a.contexts.iter().copied().max().unwrap_or(0);
    let b_max = a.batches.iter().copied().filter(|&b| b <= 64).max().unwrap_or(1);
    let p = 64;
    let pages = b_max * ctx_max.div_ceil(p);
    let keys = mem.upload(&random_keys(rng, pages * p)).map_err(|e| BenchError::Gpu(e.to_string()))?;
    let mut ids: Vec<u32> = (0..pages as u32).collect();
    ids.shuffle(rng);
    let table = mem.upload(&ids).map_err(|e| BenchError::Gpu(e.to_string()))?;
    for &heads in &[64usize, 32] {
        for &ctx in &a.contexts {
            for &b in a.batches.iter().filter(|&&b| b <= 64) {
                let reqs: Vec<IndexerRequest> = (0..b)
                    .map(|i| IndexerRequest {
                        first_page: i * ctx_max.div_ceil(p),
                        seq_len: ctx,
                        score_offset: i * ctx,
                    })
                    .collect();
                let q = mem
                    .upload(&hisparse_kernels::random::normal_bf16(rng, b * heads * 128, 1.0))
                    .map_err(|e| BenchError::Gpu(e.to_string()))?;
                let w = mem
                    .upload(&hisparse_kernels::random::head_weights(rng, b * heads))
                    .map_err(|e| BenchError::Gpu(e.to_string()))?;
                let mut scores = mem.alloc_zeroed::<f32>(b * ctx).map_err(|e| BenchError::Gpu(e.to_string()))?;
                // On mma.sync: exact queries, fp8 ones with the kernel for any head count, and with
                // the one compiled for the head count; then the warpgroup-MMA kernels (the
                // default), exact and fp8 queries.
                for (queries_as, fixed, wgmma) in [
                    (IndexerQueries::Exact, FixedHeadIndexer::Never, false),
                    (IndexerQueries::Fp8, FixedHeadIndexer::Never, false),
                    (IndexerQueries::Fp8, FixedHeadIndexer::Always, false),
                    (IndexerQueries::Exact, FixedHeadIndexer::Auto, true),
                    (IndexerQueries::Fp8, FixedHeadIndexer::Auto, true),
                ] {
                    gpu.set_indexer_fixed_heads(fixed);
                    gpu.set_wgmma_indexer(wgmma);
                    let batch = IndexerBatch {
                        heads,
                        key_layout: key,
                        queries: &q,
                        weights: &w,
                        keys: &keys,
                        page_tokens: p,
                        page_table: &table,
                        requests: &reqs,
                        pin_newest: false,
                        queries_as,
                        score: hisparse_kernels::IndexScore::Lightning,
                    };
                    let ms = time_ms(s, a.reps, || gpu.indexer_scores(&batch, &mut scores).map_err(kerr));
                    gpu.set_indexer_fixed_heads(FixedHeadIndexer::Auto);
                    gpu.set_wgmma_indexer(true);
                    let ms = ms?;
                    let bytes = (b * ctx) as f64 * (132.0 + 4.0 + 4.0 / p as f64);
                    let bw = bytes / (ms * 1e-3);
                    let flops = (b * ctx * heads * 128 * 2) as f64 / (ms * 1e-3);
                    let form = match (queries_as, fixed, wgmma) {
                        (IndexerQueries::Exact, _, true) => " (warpgroup MMA)",
                        (IndexerQueries::Fp8, _, true) => " (fp8 queries, warpgroup MMA)",
                        (IndexerQueries::Exact, _, false) => "",
                        (IndexerQueries::Fp8, FixedHeadIndexer::Always, false) => " (fp8 queries, fixed-head kernel)",
                        (IndexerQueries::Fp8, _, false) => " (fp8 queries, e4m3 MMA)",
                    };
                    push(
                        format!("indexer{form} {heads} heads, ctx {ctx}, batch {b}"),
                        ms * 1e3,
                        "us",
                        format!(
                            "{:.0} GB/s = {:.0}% of HBM copy; {:.0} TFLOP/s",
                            bw / 1e9,
                            100.0 * bw / hbm,
                            flops / 1e12
                        ),
                    );
                }
                if heads == 64 {
                    let spans: Vec<Span> = (0..b).map(|i| Span::new(i * ctx, ctx)).collect();
                    let mut top = mem.alloc_zeroed::<i32>(b * 2048).map_err(|e| BenchError::Gpu(e.to_string()))?;
                    // The one-block form beside the chosen one (several blocks per
                    // request for long requests at small batches), and a split filling one wave
                    // of blocks whatever the batch (what the choice rule weighs).
                    let mut time_with = |blocks: usize| {
                        gpu.set_top_k_blocks(blocks);
                        time_ms(s, a.reps, || gpu.top_k(&scores, &spans, 2048, &mut top).map_err(kerr))
                    };
                    let one = time_with(1)?;
                    let wave = (gpu.sm_count() / b).max(2);
                    let waved = time_with(wave)?;
                    let ms = time_with(0)?;
                    push(
                        format!("top-k 2048 of {ctx}, batch {b}"),
                        ms * 1e3,
                        "us",
                        format!(
                            "one block per request: {:.1} us; {wave} blocks per request: {:.1} us; \
                             torch.topk 128k: 255-300 us b1, 192 us b64",
                            one * 1e3,
                            waved * 1e3
                        ),
                    );
                }
            }
        }
    }
    // The same largest indexer call over pages in pool order (no TLB spread): what page
    // scatter costs.
    if let (Some(&ctx), true) = (a.contexts.iter().max(), b_max == 64) {
        let seq: Vec<u32> = (0..pages as u32).collect();
        let table_seq = mem.upload(&seq).map_err(|e| BenchError::Gpu(e.to_string()))?;
        let reqs: Vec<IndexerRequest> = (0..64)
            .map(|i| IndexerRequest { first_page: i * ctx_max.div_ceil(p), seq_len: ctx, score_offset: i * ctx })
            .collect();
        let q = mem
            .upload(&hisparse_kernels::random::normal_bf16(rng, 64 * 64 * 128, 1.0))
            .map_err(|e| BenchError::Gpu(e.to_string()))?;
        let w = mem
            .upload(&hisparse_kernels::random::head_weights(rng, 64 * 64))
            .map_err(|e| BenchError::Gpu(e.to_string()))?;
        let mut scores = mem.alloc_zeroed::<f32>(64 * ctx).map_err(|e| BenchError::Gpu(e.to_string()))?;
        let batch = IndexerBatch {
            heads: 64,
            key_layout: key,
            queries: &q,
            weights: &w,
            keys: &keys,
            page_tokens: p,
            page_table: &table_seq,
            requests: &reqs,
            pin_newest: false,
            queries_as: IndexerQueries::Exact,
            score: hisparse_kernels::IndexScore::Lightning,
        };
        let ms = time_ms(s, a.reps, || gpu.indexer_scores(&batch, &mut scores).map_err(kerr))?;
        let bw = (64 * ctx) as f64 * (132.0 + 4.0 + 4.0 / p as f64) / (ms * 1e-3);
        push(
            format!("indexer 64 heads, ctx {ctx}, batch 64, pages in order"),
            ms * 1e3,
            "us",
            format!("{:.0} GB/s = {:.0}% of HBM copy", bw / 1e9, 100.0 * bw / hbm),
        );
    }
    gpu.finish_step().map_err(kerr)?;
    Ok(())
}

/// Sparse attention FLOP/s over formats, heads and batches.
fn attention(
    a: &KernelBenchArgs,
    gpu: &CudaBackend,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    rng: &mut rand::rngs::StdRng,
    gemm: f64,
    figs: &mut Vec<Figure>,
) -> Result<()> {
    let mem = gpu.memory().clone();
    let mut push = |name: String, value: f64, unit: &str, note: String| Figure::record(figs, name, value, unit, note);
    // The same device and stream with the mma.sync attention (the default is warpgroup MMA).
    let mma = CudaBackend::on(gpu.device().clone()).map_err(kerr)?.with_wgmma_attention(false);
    let mut fixed = Vec::new();
    for &n in &a.attention_splits {
        // Checked at the start (run): at least 1.
        fixed.push((
            CudaBackend::on(gpu.device().clone()).map_err(kerr)?.with_splits(n),
            format!(" (wgmma, {n} splits)"),
        ));
    }
    for format in [KvRowFormat::Fp8, KvRowFormat::Bf16] {
        let layout = KvRowLayout::new(format, 512, 64).map_err(|e| BenchError::Gpu(e.to_string()))?;
        let b_max = a.batches.iter().copied().max().unwrap_or(1);
        let region = 4096;
        let pool = mem.upload(&random_rows(rng, layout, b_max * region)).map_err(|e| BenchError::Gpu(e.to_string()))?;
        for &heads in &[128usize, 64] {
            for &b in &a.batches {
                let mut locs = Vec::with_capacity(b * 2048);
                for i in 0..b {
                    let mut r: Vec<i32> = (0..region as i32).collect();
                    r.shuffle(rng);
                    let mut sel: Vec<i32> = r[..2048].iter().map(|&x| (i * region) as i32 + x).collect();
                    sel.sort_unstable();
                    locs.extend(sel);
                }
                let spans: Vec<Span> = (0..b).map(|i| Span::new(i * 2048, 2048)).collect();
                let ld = mem.upload(&locs).map_err(|e| BenchError::Gpu(e.to_string()))?;
                let q = mem
                    .upload(&hisparse_kernels::random::normal_bf16(rng, b * heads * 576, 1.0))
                    .map_err(|e| BenchError::Gpu(e.to_string()))?;
                let mut out = mem.alloc_zeroed::<f32>(b * heads * 512).map_err(|e| BenchError::Gpu(e.to_string()))?;
                let mut lse = mem.alloc_zeroed::<f32>(b * heads).map_err(|e| BenchError::Gpu(e.to_string()))?;
                let batch = AttentionBatch {
                    heads,
                    layout,
                    softmax_scale: 1.0 / 24.0,
                    queries: &q,
                    rows: &pool,
                    locations: &ld,
                    selections: &spans,
                };
                // The mma.sync form and the default, beside.
                let forms = [(&mma, ""), (gpu, " (wgmma)")];
                for (backend, form) in forms.into_iter().chain(fixed.iter().map(|(b, f)| (b, f.as_str()))) {
                    let ms = time_ms(s, a.reps, || backend.sparse_attention(&batch, &mut out, &mut lse).map_err(kerr))?;
                    // The same call as a decode step's graph runs it: 8 back to back, replayed.
                    let replayed = super::launch_gaps::replay_ms(s, a.reps, 8, || {
                        backend.sparse_attention(&batch, &mut out, &mut lse).map_err(kerr)
                    })?;
                    push(
                        format!("attention{form} {format} {heads} heads, top-k 2048, batch {b}, graph replay"),
                        replayed * 1e3,
                        "us",
                        format!("per call, 8 calls a graph; eager {:.2} us", ms * 1e3),
                    );
                    let flops = (b * heads * 2048 * (576 + 512) * 2) as f64 / (ms * 1e-3);
                    let bytes = (b * 2048 * layout.row_bytes()) as f64 / (ms * 1e-3);
                    push(
                        format!("attention{form} {format} {heads} heads, top-k 2048, batch {b}"),
                        ms * 1e3,
                        "us",
                        format!(
                            "{:.1} TFLOP/s = {:.0}% of cuBLAS; rows {:.0} GB/s",
                            flops / 1e12,
                            100.0 * flops / gemm,
                            bytes / 1e9
                        ),
                    );
                }
            }
        }
    }
    gpu.finish_step().map_err(kerr)?;
    Ok(())
}
