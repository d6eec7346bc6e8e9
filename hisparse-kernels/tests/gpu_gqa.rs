//! The CUDA backend's grouped-query attention (`kernels/gqa_attention.cu`) against the CPU
//! backend's on random rows: bf16 and fp8 rows, head dims 64 and 128, groups of 3, 4 and 1 query
//! heads, selections of 0 to 8192 rows, within f32 rounding of the reductions' order; placement
//! independence bit for bit; out-of-range locations reported as faults.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::random;
use hisparse_kernels::{AttentionBatch, CpuBackend, Kernels, Span, StepControl};
use hisparse_memory::{DeviceMemory, KvRowFormat, KvRowLayout};
use rand::seq::SliceRandom;

/// Random queries, a pool of grouped-query rows and per-request selections of rows (repeats
/// allowed past the pool's size).
struct GqaCase {
    heads: usize,
    layout: KvRowLayout,
    q: Vec<bf16>,
    pool: Vec<u8>,
    locs: Vec<i32>,
    sels: Vec<Span>,
}

fn gqa_case(seed: u64, heads: usize, kv_heads: usize, head_dim: usize, format: KvRowFormat, lens: &[usize]) -> GqaCase {
    let mut rng = random::rng(seed);
    let layout = KvRowLayout::gqa(format, kv_heads, head_dim).unwrap();
    let rows = 3000;
    let (pool, _) = random::kv_pool(&mut rng, layout, rows).unwrap();
    let q = random::normal_bf16(&mut rng, lens.len() * heads * head_dim, 1.0);
    let (mut locs, mut sels) = (Vec::new(), Vec::new());
    let mut all: Vec<i32> = (0..rows as i32).collect();
    for &n in lens {
        sels.push(Span::new(locs.len(), n));
        let mut picked = Vec::with_capacity(n);
        while picked.len() < n {
            all.shuffle(&mut rng);
            let take = (n - picked.len()).min(rows);
            picked.extend_from_slice(&all[..take]);
        }
        locs.extend(picked);
    }
    GqaCase { heads, layout, q, pool, locs, sels }
}

fn batch<'a, M: DeviceMemory>(
    c: &GqaCase,
    q: &'a M::Buffer<bf16>,
    rows: &'a M::Buffer<u8>,
    locs: &'a M::Buffer<i32>,
    sels: &'a [Span],
) -> AttentionBatch<'a, M> {
    AttentionBatch {
        heads: c.heads,
        layout: c.layout,
        softmax_scale: 0.125,
        queries: q,
        rows,
        locations: locs,
        selections: sels,
    }
}

fn run_cpu(c: &GqaCase) -> (Vec<f32>, Vec<f32>) {
    let (n, d) = (c.sels.len(), c.layout.value_dim());
    let (mut out, mut lse) = (vec![0f32; n * c.heads * d], vec![0f32; n * c.heads]);
    let b = batch::<hisparse_memory::EmulatedDevice>(c, &c.q, &c.pool, &c.locs, &c.sels);
    CpuBackend::new().sparse_attention(&b, &mut out, &mut lse).unwrap();
    (out, lse)
}

fn run_gpu(gpu: &CudaBackend, c: &GqaCase, pool: &[u8], locs: &[i32]) -> (Vec<f32>, Vec<f32>) {
    let mem = gpu.memory();
    let (n, d) = (c.sels.len(), c.layout.value_dim());
    let (qd, pd, ld) = (mem.upload(&c.q).unwrap(), mem.upload(pool).unwrap(), mem.upload(locs).unwrap());
    let mut out = mem.upload(&vec![f32::NAN; n * c.heads * d]).unwrap();
    let mut lse = mem.upload(&vec![f32::NAN; n * c.heads]).unwrap();
    gpu.sparse_attention(&batch(c, &qd, &pd, &ld, &c.sels), &mut out, &mut lse).unwrap();
    gpu.finish_step().unwrap();
    (mem.download(&out).unwrap(), mem.download(&lse).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_gqa_attention_matches_the_cpu_attention() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let lens = [2048usize, 100, 1, 0, 2047, 33, 8192];
    for (seed, heads, kv_heads, head_dim, format) in [
        (1, 9, 3, 64, KvRowFormat::Bf16), // SmolLM2's geometry
        (2, 9, 3, 64, KvRowFormat::Fp8),
        (3, 32, 8, 128, KvRowFormat::Bf16), // Llama-3.1-8B's
        (4, 32, 8, 128, KvRowFormat::Fp8),
        (5, 8, 8, 128, KvRowFormat::Bf16), // one query head per group
    ] {
        let c = gqa_case(seed, heads, kv_heads, head_dim, format, &lens);
        let (want, want_lse) = run_cpu(&c);
        let (got, lse) = run_gpu(&gpu, &c, &c.pool, &c.locs);
        let max = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max > 0.01, "outputs are not trivial");
        let what = format!("{format} {heads} heads of {head_dim} in {kv_heads} groups");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // The same values in the same order per output; the softmax's max and sum are
            // reduced in another order, and expf is not the CPU's exp: f32 rounding only.
            assert!((g - w).abs() <= 2e-5 * max + 1e-6, "{what} out[{i}]: {g} vs {w}");
        }
        for (i, (g, w)) in lse.iter().zip(&want_lse).enumerate() {
            let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= 1e-5 * w.abs().max(1.0) };
            assert!(ok, "{what} lse[{i}]: {g} vs {w}");
        }
        // Placement does not matter: the same rows moved give the same bits.
        let rb = c.layout.row_bytes();
        let rows = c.pool.len() / rb;
        let moved: Vec<u8> = c.pool.chunks(rb).rev().flatten().copied().collect();
        let locs: Vec<i32> = c.locs.iter().map(|&l| rows as i32 - 1 - l).collect();
        let (b, lb) = run_gpu(&gpu, &c, &moved, &locs);
        assert!(got.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: outputs differ in bits");
        assert!(lse.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: LSEs differ in bits");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_gqa_attention_reports_out_of_range_locations_and_refuses_bad_shapes() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let mut c = gqa_case(6, 9, 3, 64, KvRowFormat::Bf16, &[64]);
    c.locs[10] = 1 << 30;
    let mem = gpu.memory();
    let (qd, pd, ld) = (mem.upload(&c.q).unwrap(), mem.upload(&c.pool).unwrap(), mem.upload(&c.locs).unwrap());
    let (mut out, mut lse) = (mem.alloc_zeroed(9 * 64).unwrap(), mem.alloc_zeroed(9).unwrap());
    gpu.sparse_attention(&batch(&c, &qd, &pd, &ld, &c.sels), &mut out, &mut lse).unwrap();
    let e = gpu.finish_step().unwrap_err();
    assert!(e.to_string().contains("locations"), "{e}");
    gpu.finish_step().expect("the fault is reported once");
    // Query heads that are no multiple of the groups are refused before any launch.
    let bad = GqaCase { heads: 8, ..gqa_case(7, 9, 3, 64, KvRowFormat::Bf16, &[64]) };
    let qb = mem.upload(&bad.q).unwrap();
    assert!(gpu.sparse_attention(&batch(&bad, &qb, &pd, &ld, &bad.sels), &mut out, &mut lse).is_err());
    gpu.finish_step().unwrap();
}
