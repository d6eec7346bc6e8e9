//! `hisparse kernel-bench --only oracle`: the oracle's scores for a dense grouped-query model
//! (the `llama-3.1-8b` geometry: 32 query heads over 8 KV heads of 128, fp8 index keys of
//! 1028 B, each query head non-zero only in its group's 128 dims, as the engine builds them)
//! at each context and batch, its key bytes per second against the HBM-copy ceiling of the same
//! run. Keys are random e4m3 codes (no NaN) with unit scales, in pages spread over the pool.

use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::{IndexScore, IndexerBatch, IndexerQueries, IndexerRequest, Kernels, OracleScore};
use hisparse_memory::{DeviceMemory, KvGeometry};
use rand::seq::SliceRandom;
use rand::{Rng, RngCore};

use super::gpu_bench::{Figure, time_ms};
use crate::error::{BenchError, Result};
use crate::guard;

/// The oracle's largest batch timed (a batch of 32k-position requests' keys: 34 MB each).
const ORACLE_MAX_BATCH: usize = 64;

/// The oracle's scores over every context and batch (at most [`ORACLE_MAX_BATCH`]), each the
/// median of `reps` timings.
pub(super) fn oracle(
    (contexts, batches, reps): (&[usize], &[usize], usize),
    gpu: &CudaBackend,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    rng: &mut rand::rngs::StdRng,
    hbm: f64,
    figs: &mut Vec<Figure>,
) -> Result<()> {
    let gpu_err = |e: hisparse_memory::MemoryError| BenchError::Gpu(e.to_string());
    let mem = gpu.memory().clone();
    let g = KvGeometry::preset("llama-3.1-8b")?;
    let key = g.index_key()?;
    let (heads, dim, kb) = (g.q_heads, key.dim(), key.row_bytes());
    // The preset is grouped-query: its KV heads are known (8 of 128 dims).
    let kv_heads = g.kv_heads().unwrap_or(1);
    let (group, hd) = (heads / kv_heads, dim / kv_heads);
    let p = 64;
    for &ctx in contexts {
        for &b in batches.iter().filter(|&&b| b <= ORACLE_MAX_BATCH) {
            let per = ctx.div_ceil(p);
            // The keys are made on the host first: refused, naming the flag, past its memory.
            let bytes = guard::product(&[b, per, p, kb])
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| BenchError::flag("contexts", ctx, "its keys overflow a byte count"))?;
            if let Some(have) = hisparse_memory::available_memory()
                && bytes as u64 > have
            {
                return Err(BenchError::flag(
                    "contexts",
                    ctx,
                    format!("{b} requests' keys need {bytes} B of host memory; the machine has {have} B"),
                ));
            }
            let mut host = vec![0u8; bytes];
            rng.fill_bytes(&mut host);
            for r in host.chunks_mut(kb) {
                // Bit 3 clear: no e4m3 NaN (0x7f, 0xff); a unit scale.
                r[..dim].iter_mut().for_each(|c| *c &= 0xf7);
                r[dim..].copy_from_slice(&1f32.to_le_bytes());
            }
            let keys = mem.upload(&host).map_err(gpu_err)?;
            drop(host);
            let mut ids: Vec<u32> = (0..(b * per) as u32).collect();
            ids.shuffle(rng);
            let table = mem.upload(&ids).map_err(gpu_err)?;
            let reqs: Vec<IndexerRequest> =
                (0..b).map(|i| IndexerRequest { first_page: i * per, seq_len: ctx, score_offset: i * ctx }).collect();
            // Each head's query in its group's dims only.
            let mut q = vec![half::bf16::ZERO; b * heads * dim];
            for (j, x) in q.iter_mut().enumerate() {
                let (h, e) = ((j / dim) % heads, j % dim);
                if e / hd == h / group {
                    *x = half::bf16::from_f32(rng.random::<f32>() - 0.5);
                }
            }
            let q = mem.upload(&q).map_err(gpu_err)?;
            let w = mem.upload(&hisparse_kernels::random::head_weights(rng, b * heads)).map_err(gpu_err)?;
            let mut scores = mem.alloc_zeroed::<f32>(b * ctx).map_err(gpu_err)?;
            let batch = IndexerBatch {
                heads,
                key_layout: key,
                queries: &q,
                weights: &w,
                keys: &keys,
                page_tokens: p,
                page_table: &table,
                requests: &reqs,
                pin_newest: true,
                queries_as: IndexerQueries::Exact,
                score: IndexScore::Oracle(OracleScore::default()),
            };
            let ms = time_ms(s, reps, || gpu.indexer_scores(&batch, &mut scores).map_err(BenchError::Kernel))?;
            // Keys read, the scores written.
            let bytes = (b * ctx) as f64 * (kb as f64 + 4.0);
            let bw = bytes / (ms * 1e-3);
            Figure::record(
                figs,
                format!("oracle {heads} heads over {kv_heads} KV heads, ctx {ctx}, batch {b}"),
                ms * 1e3,
                "us",
                format!("keys {:.0} GB/s = {:.0}% of HBM copy", bw / 1e9, 100.0 * bw / hbm),
            );
        }
    }
    Ok(())
}
