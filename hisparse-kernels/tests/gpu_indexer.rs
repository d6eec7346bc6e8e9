//! The CUDA indexer against its CPU twin on random data, for exact and fp8 queries: scores within
//! fp32 rounding (exact queries) or the fp8 MMA's accumulation (fp8 queries), and the fp8 form's
//! 2048-of-128k selection equal to the CPU's but for near-ties.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::cuda::{CudaBackend, FixedHeadIndexer};
use hisparse_kernels::index_queries::{pow2, quantize_head};
use hisparse_kernels::random;
use hisparse_kernels::{Backend, Buf, CpuBackend, IndexerBatch, IndexerQueries, IndexerRequest, Span};
use hisparse_kernels::{Kernels, StepControl};
use hisparse_memory::fp8::decode_e4m3;
use hisparse_memory::{DeviceMemory, IndexKeyLayout};
use rand::seq::SliceRandom;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA GPU")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_indexer_matches_the_cpu_indexer() {
    // Query scales far from 1 too: the kernel moves queries into f16 range by a power of two.
    let cases = [
        (64usize, vec![1usize, 31, 4097, 20_000], 1.0f32),
        (32, vec![70_000, 5], 1.0),
        (8, vec![300], 3e-7),
        (16, vec![999, 64], 2e4),
    ];
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    for (heads, lens, q_std) in cases {
        // The mma.sync kernels (the fp8 form twice: the kernel for any head count, and the ones
        // compiled for 32 and 64 heads; the others fall back to the first), then the
        // warpgroup-MMA ones for 32 and 64 heads (the others fall back to mma.sync).
        for (queries_as, fixed, wgmma) in [
            (IndexerQueries::Exact, FixedHeadIndexer::Never, false),
            (IndexerQueries::Fp8, FixedHeadIndexer::Never, false),
            (IndexerQueries::Fp8, FixedHeadIndexer::Always, false),
            (IndexerQueries::Exact, FixedHeadIndexer::Never, true),
            (IndexerQueries::Fp8, FixedHeadIndexer::Never, true),
        ] {
            gpu.set_indexer_fixed_heads(fixed);
            gpu.set_wgmma_indexer(wgmma);
            let case = IndexerCase::new(heads, &lens, q_std, queries_as);
            let (want, got) = (case.scores(&cpu), case.scores(&gpu));
            let max = want.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
            assert!(max > q_std, "scores are not trivial");
            assert_eq!(want.iter().filter(|x| x.is_infinite()).count(), if heads == 32 { 2 } else { 0 });
            let tol = case.tolerances(max);
            let mut worst = 0f32;
            for (i, ((g, c), t)) in got.iter().zip(&want).zip(&tol).enumerate() {
                assert!(g == c || (g - c).abs() <= *t, "{queries_as:?}, heads {heads}, score {i}: gpu {g} vs cpu {c}");
                if c.is_finite() {
                    worst = worst.max((g - c).abs() / max);
                }
            }
            let form = match (wgmma && (heads == 32 || heads == 64), fixed) {
                (true, _) => " (warpgroup MMA)",
                (false, FixedHeadIndexer::Always) => " (fixed-head kernel)",
                (false, _) => "",
            };
            println!(
                "{queries_as:?} queries{form}, {heads} heads: largest difference {worst:.2e} of the largest score"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_fp8_indexer_selects_what_the_cpu_twin_selects() {
    // The selection of 2048 from each request's fp8-query scores, GPU (indexer and top-k)
    // against CPU: equal but for positions whose scores lie within the scores' tolerance of
    // the k-th largest (where the two sum orders may swap neighbours).
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let lens = [131_072usize, 9000, 2500];
    let case = IndexerCase::new(64, &lens, 1.0, IndexerQueries::Fp8);
    let want = case.scores(&cpu);
    let max = want.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
    let tol = case.tolerances(max);
    let spans: Vec<Span> = case.requests.iter().map(|r| Span::new(r.score_offset, r.seq_len)).collect();
    let k = 2048;
    let mut cpu_sel = vec![0i32; spans.len() * k];
    cpu.top_k(&want, &spans, k, &mut cpu_sel).unwrap();
    let mem = gpu.memory().clone();
    for (fixed, wgmma) in
        [(FixedHeadIndexer::Never, false), (FixedHeadIndexer::Always, false), (FixedHeadIndexer::Never, true)]
    {
        gpu.set_indexer_fixed_heads(fixed);
        gpu.set_wgmma_indexer(wgmma);
        let scores_d = case.scores_on_device(&gpu);
        let mut sel_d = mem.upload(&vec![-1i32; spans.len() * k]).unwrap();
        gpu.top_k(&scores_d, &spans, k, &mut sel_d).unwrap();
        gpu.finish_step().unwrap();
        let gpu_sel = mem.download(&sel_d).unwrap();
        selections_agree(
            &want,
            &tol,
            &spans,
            &cpu_sel,
            &gpu_sel,
            k,
            &if wgmma { "warpgroup MMA".to_owned() } else { format!("fixed heads {fixed:?}") },
        );
    }
}

/// `gpu_sel` equals `cpu_sel` but for positions within twice their tolerance of the k-th score.
#[allow(clippy::print_stdout)] // the count of differences is printed for the record
fn selections_agree(want: &[f32], tol: &[f32], spans: &[Span], cpu_sel: &[i32], gpu_sel: &[i32], k: usize, form: &str) {
    let mut differ = 0;
    for (i, sp) in spans.iter().enumerate() {
        let c: std::collections::BTreeSet<i32> = cpu_sel[i * k..(i + 1) * k].iter().copied().collect();
        let g: std::collections::BTreeSet<i32> = gpu_sel[i * k..(i + 1) * k].iter().copied().collect();
        assert_eq!(g.len(), k, "request {i}: {k} distinct positions");
        let score = |p: i32| want[sp.offset + p as usize];
        let kth = c.iter().map(|&p| score(p)).fold(f32::INFINITY, f32::min);
        let t = (0..sp.len).map(|p| tol[sp.offset + p]).fold(0f32, f32::max);
        for &p in g.difference(&c) {
            assert!(score(p) >= kth - 2.0 * t, "request {i}: gpu picked {p} ({} against the k-th {kth})", score(p));
        }
        for &p in c.difference(&g) {
            assert!(score(p) <= kth + 2.0 * t, "request {i}: gpu left {p} ({} against the k-th {kth})", score(p));
        }
        differ += g.difference(&c).count();
    }
    println!("fp8 queries ({form}): {differ} of {} selected positions differ from the CPU's", spans.len() * k);
    assert!(differ * 100 <= spans.len() * k, "{differ} positions differ: more than 1%");
}

/// One indexer call's inputs on the host: random keys in shuffled pages, queries, weights.
struct IndexerCase {
    heads: usize,
    key: IndexKeyLayout,
    pool: Vec<u8>,
    table: Vec<u32>,
    q: Vec<bf16>,
    w: Vec<f32>,
    requests: Vec<IndexerRequest>,
    out_len: usize,
    queries_as: IndexerQueries,
}

const PAGE: usize = 64;

impl IndexerCase {
    fn new(heads: usize, lens: &[usize], q_std: f32, queries_as: IndexerQueries) -> Self {
        let key = IndexKeyLayout::new(128).unwrap();
        let mut rng = random::rng(heads as u64);
        let pages: usize = lens.iter().map(|n| n.div_ceil(PAGE)).sum::<usize>() + 7;
        let pool = random::index_key_pool(&mut rng, key, pages * PAGE).unwrap();
        let mut ids: Vec<u32> = (0..pages as u32).collect();
        ids.shuffle(&mut rng);
        let q = random::normal_bf16(&mut rng, lens.len() * heads * 128, q_std);
        let w = random::head_weights(&mut rng, lens.len() * heads);
        let (mut requests, mut table, mut offset) = (Vec::new(), Vec::new(), 3);
        for &n in lens {
            requests.push(IndexerRequest { first_page: table.len(), seq_len: n, score_offset: offset });
            table.extend(ids.drain(..n.div_ceil(PAGE)));
            offset += n + 5;
        }
        Self { heads, key, pool, table, q, w, requests, out_len: offset, queries_as }
    }

    fn batch<'a, M: DeviceMemory>(
        &'a self,
        q: &'a M::Buffer<bf16>,
        w: &'a M::Buffer<f32>,
        keys: &'a M::Buffer<u8>,
        table: &'a M::Buffer<u32>,
    ) -> IndexerBatch<'a, M> {
        IndexerBatch {
            heads: self.heads,
            key_layout: self.key,
            queries: q,
            weights: w,
            keys,
            page_tokens: PAGE,
            page_table: table,
            requests: &self.requests,
            pin_newest: self.heads == 32,
            queries_as: self.queries_as,
            score: hisparse_kernels::IndexScore::Lightning,
        }
    }

    /// The scores on `backend`, downloaded (gaps hold -7).
    fn scores<B: Backend>(&self, backend: &B) -> Vec<f32> {
        let out = self.scores_on_device(backend);
        backend.finish_step().unwrap();
        backend.memory().download(&out).unwrap()
    }

    /// The scores left in `backend`'s memory (the step not yet finished).
    fn scores_on_device<B: Backend>(&self, backend: &B) -> Buf<B, f32> {
        let mem = backend.memory();
        let (qd, wd, kd, td) = (
            mem.upload(&self.q).unwrap(),
            mem.upload(&self.w).unwrap(),
            mem.upload(&self.pool).unwrap(),
            mem.upload(&self.table).unwrap(),
        );
        let mut out = mem.upload(&vec![-7f32; self.out_len]).unwrap();
        backend.indexer_scores(&self.batch::<B::Memory>(&qd, &wd, &kd, &td), &mut out).unwrap();
        out
    }

    /// Per score, how far GPU and CPU may differ. Exact queries: fp32 rounding, 2e-5 of the
    /// largest score. Fp8 queries: the e4m3 products are exact, but the fp8 MMA's internal
    /// sums keep fewer bits than fp32 (about 14, DeepSeek-V3's report), so 2^-10 of the sum of
    /// the terms' magnitudes, `scale_t * sum_h w_h 2^e_h sum_d |q8 k8|`, on top.
    fn tolerances(&self, max: f32) -> Vec<f32> {
        let mut tol = vec![2e-5 * max; self.out_len];
        if self.queries_as == IndexerQueries::Exact {
            return tol;
        }
        let (dim, kb) = (128, self.key.row_bytes());
        let mut codes = vec![0u8; dim];
        for (i, r) in self.requests.iter().enumerate() {
            let mut qs = Vec::new();
            let mut ws = Vec::new();
            for h in 0..self.heads {
                let at = (i * self.heads + h) * dim;
                let e = quantize_head(&self.q[at..at + dim], &mut codes);
                qs.push(codes.iter().map(|&c| decode_e4m3(c).abs()).collect::<Vec<f32>>());
                ws.push(self.w[i * self.heads + h] * pow2(e));
            }
            for t in 0..r.seq_len {
                let row = (self.table[r.first_page + t / PAGE] as usize * PAGE + t % PAGE) * kb;
                let bytes = &self.pool[row..row + kb];
                let scale = f32::from_le_bytes([bytes[dim], bytes[dim + 1], bytes[dim + 2], bytes[dim + 3]]);
                let mut mag = 0f32;
                for (qh, wh) in qs.iter().zip(&ws) {
                    mag += wh * qh.iter().zip(&bytes[..dim]).map(|(a, &b)| a * decode_e4m3(b).abs()).sum::<f32>();
                }
                tol[r.score_offset + t] += scale * mag / 1024.0;
            }
        }
        tol
    }
}
