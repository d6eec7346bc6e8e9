//! Criterion benches of the CPU kernels, each at two sizes (the oracle at a real model's one, per
//! index format), with throughput in bytes (indexer, oracle, attention: bytes of keys or rows
//! read) or elements (top-k: scores scanned).
#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hisparse_kernels::Kernels;
use hisparse_kernels::random;
use hisparse_kernels::{AttentionBatch, CpuBackend, IndexScore, IndexerBatch, IndexerRequest, Span};
use hisparse_memory::{IndexKeyLayout, KvRowFormat, KvRowLayout};

/// An indexer call's inputs over a key pool in pages of 64 positions.
struct Pool<'a> {
    heads: usize,
    key: IndexKeyLayout,
    q: &'a Vec<half::bf16>,
    w: &'a Vec<f32>,
    keys: &'a Vec<u8>,
    page_table: &'a Vec<u32>,
    requests: &'a [IndexerRequest],
}

impl Pool<'_> {
    fn batch(&self, pin_newest: bool, score: IndexScore) -> IndexerBatch<'_, hisparse_memory::EmulatedDevice> {
        IndexerBatch {
            heads: self.heads,
            key_layout: self.key,
            queries: self.q,
            weights: self.w,
            keys: self.keys,
            page_tokens: 64,
            page_table: self.page_table,
            requests: self.requests,
            pin_newest,
            queries_as: hisparse_kernels::IndexerQueries::Exact,
            score,
        }
    }
}

fn indexer(c: &mut Criterion) {
    let mut g = c.benchmark_group("indexer");
    g.sample_size(10);
    let key = IndexKeyLayout::new(128).unwrap();
    let cpu = CpuBackend::new();
    // (batch, context, heads): a GLM-5.1-sized and a DeepSeek-V3.2-sized call.
    for (batch, len, heads) in [(1usize, 8192usize, 32usize), (4, 32768, 64)] {
        let mut rng = random::rng(1);
        let keys = random::index_key_pool(&mut rng, key, batch * len).unwrap();
        let q = random::normal_bf16(&mut rng, batch * heads * 128, 1.0);
        let w = random::head_weights(&mut rng, batch * heads);
        let page_table: Vec<u32> = (0..(batch * len / 64) as u32).collect();
        let requests: Vec<_> = (0..batch)
            .map(|i| IndexerRequest { first_page: i * len / 64, seq_len: len, score_offset: i * len })
            .collect();
        let mut scores = vec![0f32; batch * len];
        g.throughput(Throughput::Bytes((batch * len * key.row_bytes()) as u64));
        g.bench_function(BenchmarkId::from_parameter(format!("b{batch}xL{len}xH{heads}")), |bch| {
            let pool = Pool { heads, key, q: &q, w: &w, keys: &keys, page_table: &page_table, requests: &requests };
            bch.iter(|| cpu.indexer_scores(&pool.batch(false, IndexScore::Lightning), &mut scores).unwrap())
        });
    }
    g.finish();
}

/// The oracle selection of a dense GQA model: SmolLM2-135M's layer (9 query heads in 3 groups of
/// 64 dims over 192-dim keys), one request of 8,000 positions, each index format.
fn oracle(c: &mut Criterion) {
    let mut g = c.benchmark_group("oracle");
    g.sample_size(20);
    let (len, heads, dim) = (8000usize, 9usize, 192usize);
    let cpu = CpuBackend::new();
    for format in ["fp8", "int4:32", "channels:16:64"] {
        let key = IndexKeyLayout::with_format(dim, format.parse().unwrap()).unwrap();
        let mut rng = random::rng(2);
        let keys = random::index_key_pool(&mut rng, key, len.next_multiple_of(64)).unwrap();
        let mut q = random::normal_bf16(&mut rng, heads * dim, 1.0);
        // A GQA head's query fills its group's 64 dims of the key.
        for (j, x) in q.iter_mut().enumerate() {
            if (j % dim) / 64 != (j / dim) / 3 {
                *x = half::bf16::ZERO;
            }
        }
        let w = vec![0.125f32; heads];
        let page_table: Vec<u32> = (0..len.div_ceil(64) as u32).collect();
        let requests = [IndexerRequest { first_page: 0, seq_len: len, score_offset: 0 }];
        let mut scores = vec![0f32; len];
        g.throughput(Throughput::Bytes((len * key.row_bytes()) as u64));
        g.bench_function(BenchmarkId::from_parameter(format!("{format}_L{len}xH{heads}")), |bch| {
            let pool = Pool { heads, key, q: &q, w: &w, keys: &keys, page_table: &page_table, requests: &requests };
            bch.iter(|| {
                cpu.indexer_scores(&pool.batch(true, IndexScore::Oracle(Default::default())), &mut scores).unwrap()
            })
        });
    }
    g.finish();
}

fn top_k(c: &mut Criterion) {
    let mut g = c.benchmark_group("top_k");
    let cpu = CpuBackend::new();
    for (batch, len) in [(1usize, 32768usize), (8, 131072)] {
        let mut rng = random::rng(2);
        let scores = random::normal(&mut rng, batch * len, 1.0);
        let spans: Vec<Span> = (0..batch).map(|i| Span::new(i * len, len)).collect();
        let mut out = vec![0i32; batch * 2048];
        g.throughput(Throughput::Elements((batch * len) as u64));
        g.bench_function(BenchmarkId::from_parameter(format!("2048_of_{len}_b{batch}")), |b| {
            b.iter(|| cpu.top_k(&scores, &spans, 2048, &mut out).unwrap())
        });
    }
    g.finish();
}

fn sparse_attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("sparse_attention");
    g.sample_size(10);
    let cpu = CpuBackend::new();
    // MLA rows (GLM's geometry), then SmolLM2-135M's dense GQA rows (9 query heads over 3 KV
    // heads of 64): one request's whole 2k context in order, as the real model's dense decode
    // reads it.
    let mla = |f| KvRowLayout::new(f, 512, 64).unwrap();
    let gqa = KvRowLayout::gqa(KvRowFormat::Bf16, 3, 64).unwrap();
    for (layout, heads, batch) in
        [(mla(KvRowFormat::Fp8), 64usize, 1usize), (mla(KvRowFormat::Bf16), 128, 4), (gqa, 9, 1)]
    {
        let format = if layout.mla_dims().is_some() { layout.format().to_string() } else { "gqa_bf16".into() };
        let mut rng = random::rng(3);
        let (pool, _) = random::kv_pool(&mut rng, layout, 8192).unwrap();
        let q = random::normal_bf16(&mut rng, batch * heads * layout.query_dim(), 1.0);
        // Scattered rows for MLA; the dense decode's rows in order for GQA.
        let step = if layout.mla_dims().is_some() { 7919 } else { 1 };
        let locations: Vec<i32> = (0..batch * 2048).map(|i| ((i * step) % 8192) as i32).collect();
        let sel: Vec<Span> = (0..batch).map(|i| Span::new(i * 2048, 2048)).collect();
        let mut out = vec![0f32; batch * heads * layout.value_dim()];
        let mut lse = vec![0f32; batch * heads];
        g.throughput(Throughput::Bytes((batch * 2048 * layout.row_bytes()) as u64));
        g.bench_function(BenchmarkId::from_parameter(format!("{format}_h{heads}_b{batch}_k2048")), |b| {
            b.iter(|| {
                let a = AttentionBatch {
                    heads,
                    layout,
                    softmax_scale: 0.04,
                    queries: &q,
                    rows: &pool,
                    locations: &locations,
                    selections: &sel,
                };
                cpu.sparse_attention(&a, &mut out, &mut lse).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, indexer, oracle, top_k, sparse_attention);
criterion_main!(benches);
