//! The CUDA backend's oracle scores (`kernels/oracle_index.cu`) against the CPU backend's on
//! random grouped-query batches, fp8 and top-channel (`channels:16:64`) keys: SmolLM2's geometry (9 query heads in 3 groups of 64) and
//! Llama-3.1-8B's (32 in 8 groups of 128), sum and max over heads, sinks, windows and the pinned
//! newest position, requests of 0 to 8192 positions over shuffled pages: the kept positions
//! exactly, every other score within 1e-4 of itself (expf and the sum's order); a page id
//! outside the pool reported as a fault; fp8 queries and int4 keys refused.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::random;
use hisparse_kernels::{
    CpuBackend, HeadCombine, IndexScore, IndexerBatch, IndexerQueries, IndexerRequest, Kernels, OracleScore,
    StepControl,
};
use hisparse_memory::{DeviceMemory, EmulatedDevice, IndexKeyFormat, IndexKeyLayout};
use rand::Rng;
use rand::seq::SliceRandom;

const PAGE: usize = 64;

/// A batch's host arrays: queries zero outside each head's group, keys, shuffled pages.
struct OracleCase {
    heads: usize,
    key: IndexKeyLayout,
    q: Vec<bf16>,
    w: Vec<f32>,
    keys: Vec<u8>,
    table: Vec<u32>,
    reqs: Vec<IndexerRequest>,
    positions: usize,
}

fn case(
    seed: u64,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    lens: &[usize],
    format: IndexKeyFormat,
) -> OracleCase {
    let mut rng = random::rng(seed);
    let key = IndexKeyLayout::with_format(kv_heads * head_dim, format).unwrap();
    let pages: usize = lens.iter().map(|l| l.div_ceil(PAGE)).sum::<usize>() + 3;
    let keys = random::index_key_pool(&mut rng, key, pages * PAGE).unwrap();
    let mut table: Vec<u32> = (0..pages as u32).collect();
    table.shuffle(&mut rng);
    let dim = key.dim();
    let mut q = vec![bf16::ZERO; lens.len() * heads * dim];
    for (x, head) in q.chunks_mut(dim).enumerate() {
        let g = (x % heads) / (heads / kv_heads);
        for v in &mut head[g * head_dim..(g + 1) * head_dim] {
            *v = bf16::from_f32(rng.random::<f32>() * 2.0 - 1.0);
        }
    }
    let w = vec![1.0 / (head_dim as f32).sqrt(); lens.len() * heads];
    let (mut reqs, mut first, mut at) = (Vec::new(), 0, 0);
    for &n in lens {
        reqs.push(IndexerRequest { first_page: first, seq_len: n, score_offset: at });
        first += n.div_ceil(PAGE);
        at += n;
    }
    OracleCase { heads, key, q, w, keys, table, reqs, positions: at }
}

/// A batch's buffers in memory `M`: queries, weights, keys, page table.
type Buffers<'a, M> = (
    &'a <M as DeviceMemory>::Buffer<bf16>,
    &'a <M as DeviceMemory>::Buffer<f32>,
    &'a <M as DeviceMemory>::Buffer<u8>,
    &'a <M as DeviceMemory>::Buffer<u32>,
);

fn batch<'a, M: DeviceMemory>(
    c: &'a OracleCase,
    bufs: Buffers<'a, M>,
    oracle: OracleScore,
    pin_newest: bool,
) -> IndexerBatch<'a, M> {
    IndexerBatch {
        heads: c.heads,
        key_layout: c.key,
        queries: bufs.0,
        weights: bufs.1,
        keys: bufs.2,
        page_tokens: PAGE,
        page_table: bufs.3,
        requests: &c.reqs,
        pin_newest,
        queries_as: IndexerQueries::Exact,
        score: IndexScore::Oracle(oracle),
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_oracle_scores_match_the_cpu_oracle() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let mem = gpu.memory();
    let lens = [2048usize, 100, 1, 0, 5000, 8192];
    let channels = IndexKeyFormat::Channels { keep: 16, group: 64 };
    for (seed, heads, kv_heads, head_dim, format) in [
        (1, 9, 3, 64, IndexKeyFormat::Fp8),
        (2, 32, 8, 128, IndexKeyFormat::Fp8),
        (4, 9, 3, 64, channels),
        (5, 32, 8, 128, channels),
    ] {
        let c = case(seed, heads, kv_heads, head_dim, &lens, format);
        let (qd, wd, kd, td) = (
            mem.upload(&c.q).unwrap(),
            mem.upload(&c.w).unwrap(),
            mem.upload(&c.keys).unwrap(),
            mem.upload(&c.table).unwrap(),
        );
        for (combine, sink, window, pin) in
            [(HeadCombine::Sum, 0, 0, false), (HeadCombine::Sum, 4, 16, true), (HeadCombine::Max, 1, 64, true)]
        {
            let oracle = OracleScore { combine, sink, window };
            let mut want = vec![f32::NAN; c.positions];
            let cpu_b = batch::<EmulatedDevice>(&c, (&c.q, &c.w, &c.keys, &c.table), oracle, pin);
            CpuBackend::new().indexer_scores(&cpu_b, &mut want).unwrap();
            let mut got_d = mem.upload(&vec![f32::NAN; c.positions]).unwrap();
            gpu.indexer_scores(&batch(&c, (&qd, &wd, &kd, &td), oracle, pin), &mut got_d).unwrap();
            gpu.finish_step().unwrap();
            let got = mem.download(&got_d).unwrap();
            let what = format!(
                "{format} keys, {heads} heads in {kv_heads} groups of {head_dim}, {combine:?} sink {sink} window {window}"
            );
            let finite = want.iter().filter(|x| x.is_finite()).count();
            assert!(finite > c.positions / 2 && want.iter().any(|x| *x > 0.0), "{what}: scores are not trivial");
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                let ok = if w.is_finite() { (g - w).abs() <= 1e-4 * w.abs() } else { g == w };
                assert!(ok, "{what} score[{t}]: {g} vs {w}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_oracle_reports_bad_pages_and_refuses_fp8_queries() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let mem = gpu.memory();
    let mut c = case(3, 9, 3, 64, &[300], IndexKeyFormat::Fp8);
    c.table[2] = 1 << 20;
    let (qd, wd, kd, td) = (
        mem.upload(&c.q).unwrap(),
        mem.upload(&c.w).unwrap(),
        mem.upload(&c.keys).unwrap(),
        mem.upload(&c.table).unwrap(),
    );
    let oracle = OracleScore::default();
    let mut out = mem.alloc_zeroed(c.positions).unwrap();
    gpu.indexer_scores(&batch(&c, (&qd, &wd, &kd, &td), oracle, false), &mut out).unwrap();
    let e = gpu.finish_step().unwrap_err();
    assert!(e.to_string().contains("page"), "{e}");
    gpu.finish_step().expect("the fault is reported once");
    let fp8 = IndexerBatch { queries_as: IndexerQueries::Fp8, ..batch(&c, (&qd, &wd, &kd, &td), oracle, false) };
    let e = gpu.indexer_scores(&fp8, &mut out).unwrap_err();
    assert!(e.to_string().contains("queries_as"), "{e}");
    // Keys of a format the CUDA oracle does not read are refused by name.
    let int4 = IndexKeyLayout::with_format(192, IndexKeyFormat::Int4 { group: 32 }).unwrap();
    let e = gpu
        .indexer_scores(&IndexerBatch { key_layout: int4, ..batch(&c, (&qd, &wd, &kd, &td), oracle, false) }, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("index_format") && e.to_string().contains("int4:32"), "{e}");
}
