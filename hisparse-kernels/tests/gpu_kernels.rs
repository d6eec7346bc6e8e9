//! The CUDA backend's kernels against their CPU twins on random data (the indexer's in
//! `gpu_indexer.rs`): top-k selections identical (ties, infinities, NaN, continuous scores, 2048 of 128k),
//! sparse attention within the bf16 tolerance for bf16 and fp8 rows at 16, 64 and 128 heads with
//! and without splits on both attention kernels (warpgroup MMA, the default, and mma.sync),
//! placement independence bit for bit, and out-of-range locations reported
//! as faults.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::random;
use hisparse_kernels::{AttentionBatch, CpuBackend, Span};
use hisparse_kernels::{Kernels, ModelKernels, StepControl};
use hisparse_memory::{DeviceMemory, IndexKeyLayout, KvRowFormat, KvRowLayout};
use rand::Rng;
use rand::seq::SliceRandom;

fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA GPU")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_top_k_selects_exactly_what_the_cpu_selects() {
    // Every form: one block per request, the chosen split (several for this small batch), and
    // a forced odd chunk count.
    for blocks in [1usize, 0, 7] {
        top_k_against_the_cpu(&gpu().with_top_k_blocks(blocks), blocks);
    }
}

fn top_k_against_the_cpu(gpu: &CudaBackend, blocks: usize) {
    let cpu = CpuBackend::new();
    let mem = gpu.memory().clone();
    let mut rng = random::rng(5);
    // Quantised scores make many ties; a few infinities and NaNs too.
    let lens = [131_072usize, 2048, 5000, 65_537, 2049];
    let total: usize = lens.iter().sum::<usize>() + 10;
    let mut scores: Vec<f32> = (0..total).map(|_| (rng.random::<f32>() * 300.0).round() / 8.0 - 10.0).collect();
    for _ in 0..50 {
        let i = rng.random_range(0..total);
        scores[i] = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0][rng.random_range(0..5)];
    }
    let mut spans = Vec::new();
    let mut at = 4;
    for &n in &lens {
        spans.push(Span::new(at, n));
        at += n + 1;
    }
    // The last request's scores all equal: one bin through every pass, the lowest positions win.
    let last = spans[spans.len() - 1];
    scores[last.offset..last.end()].fill(1.5);
    for k in [2048usize, 1, 777] {
        let mut want = vec![0i32; spans.len() * k];
        cpu.top_k(&scores, &spans, k, &mut want).unwrap();
        let sd = mem.upload(&scores).unwrap();
        let mut got = mem.upload(&vec![-1i32; spans.len() * k]).unwrap();
        gpu.top_k(&sd, &spans, k, &mut got).unwrap();
        gpu.finish_step().unwrap();
        assert_eq!(mem.download(&got).unwrap(), want, "k = {k}, blocks {blocks}");
    }
    // Continuous scores: the radix passes usually stop after two digits (whole bin taken).
    let smooth = random::normal(&mut rng, total, 3.0);
    let sd = mem.upload(&smooth).unwrap();
    for k in [2048usize, 3] {
        let mut want = vec![0i32; spans.len() * k];
        cpu.top_k(&smooth, &spans, k, &mut want).unwrap();
        let mut got = mem.upload(&vec![-1i32; spans.len() * k]).unwrap();
        gpu.top_k(&sd, &spans, k, &mut got).unwrap();
        gpu.finish_step().unwrap();
        assert_eq!(mem.download(&got).unwrap(), want, "continuous scores, k = {k}, blocks {blocks}");
    }
    let sd = mem.upload(&scores).unwrap();
    let mut out = mem.alloc_zeroed::<i32>(4096).unwrap();
    assert!(gpu.top_k(&sd, &[Span::new(0, 10)], 4096, &mut out).is_err(), "k above the length is refused");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_top_k_reads_every_score_again_where_candidates_do_not_fit() {
    // The one-block kernel keeps a bin's keys in shared memory only when it holds at most 8192
    // keys and the span at most 262144 positions; these spans take its other path: 20000 equal
    // scores straddling the k-th (the bin stays full through both passes), and a span longer
    // than the bitmaps.
    let cpu = CpuBackend::new();
    let gpu = gpu().with_top_k_blocks(1);
    let mem = gpu.memory().clone();
    let mut rng = random::rng(17);
    let crowded = 30_000usize;
    let long = 300_000usize;
    let mut scores: Vec<f32> = random::normal(&mut rng, crowded + long, 1.0);
    for (i, s) in scores[..crowded].iter_mut().enumerate() {
        // 1000 scores above 2.0, then 20000 at exactly 2.0 in random places among the rest.
        if i < 1000 {
            *s = 3.0 + i as f32 / 1000.0;
        } else if rng.random_range(0..29usize) < 20 {
            *s = 2.0;
        } else {
            *s = s.min(1.5);
        }
    }
    scores[..crowded].shuffle(&mut rng);
    let spans = [Span::new(0, crowded), Span::new(crowded, long)];
    let sd = mem.upload(&scores).unwrap();
    for k in [2048usize, 5000] {
        let mut want = vec![0i32; spans.len() * k];
        cpu.top_k(&scores, &spans, k, &mut want).unwrap();
        let mut got = mem.upload(&vec![-1i32; spans.len() * k]).unwrap();
        gpu.top_k(&sd, &spans, k, &mut got).unwrap();
        gpu.finish_step().unwrap();
        assert_eq!(mem.download(&got).unwrap(), want, "k = {k}");
    }
}

/// Random queries, a pool of rows and per-request selections of distinct rows.
struct AttnCase {
    heads: usize,
    layout: KvRowLayout,
    q: Vec<bf16>,
    pool: Vec<u8>,
    locs: Vec<i32>,
    sels: Vec<Span>,
}

fn attn_case(seed: u64, heads: usize, format: KvRowFormat, lens: &[usize]) -> AttnCase {
    let mut rng = random::rng(seed);
    let layout = KvRowLayout::new(format, 512, 64).unwrap();
    let rows = 3000;
    let (pool, _) = random::kv_pool(&mut rng, layout, rows).unwrap();
    let q = random::normal_bf16(&mut rng, lens.len() * heads * 576, 1.0);
    let (mut locs, mut sels) = (Vec::new(), Vec::new());
    let mut all: Vec<i32> = (0..rows as i32).collect();
    for &n in lens {
        all.shuffle(&mut rng);
        sels.push(Span::new(locs.len(), n));
        locs.extend_from_slice(&all[..n]);
    }
    AttnCase { heads, layout, q, pool, locs, sels }
}

fn run_cpu(c: &AttnCase) -> (Vec<f32>, Vec<f32>) {
    let n = c.sels.len();
    let (mut out, mut lse) = (vec![0f32; n * c.heads * 512], vec![0f32; n * c.heads]);
    let b = AttentionBatch {
        heads: c.heads,
        layout: c.layout,
        softmax_scale: 1.0 / 24.0,
        queries: &c.q,
        rows: &c.pool,
        locations: &c.locs,
        selections: &c.sels,
    };
    CpuBackend::new().sparse_attention(&b, &mut out, &mut lse).unwrap();
    (out, lse)
}

fn run_gpu(gpu: &CudaBackend, c: &AttnCase, pool: &[u8], locs: &[i32]) -> (Vec<f32>, Vec<f32>) {
    let mem = gpu.memory();
    let n = c.sels.len();
    let (qd, pd, ld) = (mem.upload(&c.q).unwrap(), mem.upload(pool).unwrap(), mem.upload(locs).unwrap());
    let mut out = mem.upload(&vec![f32::NAN; n * c.heads * 512]).unwrap();
    let mut lse = mem.upload(&vec![f32::NAN; n * c.heads]).unwrap();
    let b = AttentionBatch {
        heads: c.heads,
        layout: c.layout,
        softmax_scale: 1.0 / 24.0,
        queries: &qd,
        rows: &pd,
        locations: &ld,
        selections: &c.sels,
    };
    gpu.sparse_attention(&b, &mut out, &mut lse).unwrap();
    gpu.finish_step().unwrap();
    (mem.download(&out).unwrap(), mem.download(&lse).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_attention_matches_the_cpu_attention_within_bf16_tolerance() {
    for (seed, heads, format) in [(1, 128, KvRowFormat::Fp8), (2, 64, KvRowFormat::Bf16), (3, 16, KvRowFormat::Fp8)] {
        let c = attn_case(seed, heads, format, &[2048, 100, 1, 0, 2047, 33]);
        let (want, want_lse) = run_cpu(&c);
        for splits in [1usize, 0, 7] {
            // The mma.sync kernel (the default, warpgroup MMA, is held below).
            let gpu = gpu().with_splits(splits).with_wgmma_attention(false);
            let (got, lse) = run_gpu(&gpu, &c, &c.pool, &c.locs);
            let max = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(max > 0.01, "outputs are not trivial");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // P is rounded to bf16 before P V: at most 2^-9 of the weights' mass.
                assert!(
                    (g - w).abs() <= 4e-3 * max + 1e-5,
                    "{format} heads {heads} splits {splits} out[{i}]: {g} vs {w}"
                );
            }
            for (i, (g, w)) in lse.iter().zip(&want_lse).enumerate() {
                let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= 1e-4 * w.abs().max(1.0) };
                assert!(ok, "{format} heads {heads} splits {splits} lse[{i}]: {g} vs {w}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_wgmma_attention_matches_the_cpu_attention_within_bf16_tolerance() {
    // The warpgroup-MMA forms (rows in the pool, bf16 and fp8): the same tolerance as the
    // mma.sync form, every split choice, 16 to 128 heads; placement-independent bit for bit; bad
    // locations still reported.
    for (seed, heads, format) in [
        (5, 64usize, KvRowFormat::Bf16),
        (6, 128, KvRowFormat::Fp8),
        (7, 16, KvRowFormat::Bf16),
        (8, 64, KvRowFormat::Fp8),
    ] {
        let c = attn_case(seed, heads, format, &[2048, 100, 1, 0, 2047, 33, 65]);
        let (want, want_lse) = run_cpu(&c);
        let max = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max > 0.01, "outputs are not trivial");
        for splits in [1usize, 0, 7] {
            let gpu = gpu().with_splits(splits).with_wgmma_attention(true);
            let (got, lse) = run_gpu(&gpu, &c, &c.pool, &c.locs);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 4e-3 * max + 1e-5,
                    "wgmma, heads {heads} splits {splits} out[{i}]: {g} vs {w}"
                );
            }
            for (i, (g, w)) in lse.iter().zip(&want_lse).enumerate() {
                let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= 1e-4 * w.abs().max(1.0) };
                assert!(ok, "wgmma {format}, heads {heads} splits {splits} lse[{i}]: {g} vs {w}");
            }
        }
    }
    let gpu = gpu().with_wgmma_attention(true);
    placement_does_not_matter(&gpu, &attn_case(9, 64, KvRowFormat::Fp8, &[2048, 700]));
    placement_does_not_matter(&gpu, &attn_case(10, 64, KvRowFormat::Bf16, &[2048, 700]));
    out_of_range_locations_are_reported(&gpu);
}

/// `gpu`'s outputs for `c`'s rows equal, bit for bit, those for the same rows moved (the pool
/// reversed, the locations mapped).
fn placement_does_not_matter(gpu: &CudaBackend, c: &AttnCase) {
    let (a, la) = run_gpu(gpu, c, &c.pool, &c.locs);
    let rb = c.layout.row_bytes();
    let rows = c.pool.len() / rb;
    let moved: Vec<u8> = c.pool.chunks(rb).rev().flatten().copied().collect();
    let locs: Vec<i32> = c.locs.iter().map(|&l| rows as i32 - 1 - l).collect();
    let (b, lb) = run_gpu(gpu, c, &moved, &locs);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{}: outputs differ in bits", c.layout.format());
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "{}: LSEs differ in bits", c.layout.format());
}

/// A location beyond the pool fails the step by name, once.
fn out_of_range_locations_are_reported(gpu: &CudaBackend) {
    let mut c = attn_case(4, 64, KvRowFormat::Fp8, &[64]);
    c.locs[10] = 1 << 30;
    let mem = gpu.memory();
    let (qd, pd, ld) = (mem.upload(&c.q).unwrap(), mem.upload(&c.pool).unwrap(), mem.upload(&c.locs).unwrap());
    let (mut out, mut lse) = (mem.alloc_zeroed(64 * 512).unwrap(), mem.alloc_zeroed(64).unwrap());
    let b = AttentionBatch {
        heads: 64,
        layout: c.layout,
        softmax_scale: 0.1,
        queries: &qd,
        rows: &pd,
        locations: &ld,
        selections: &c.sels,
    };
    gpu.sparse_attention(&b, &mut out, &mut lse).unwrap();
    let e = gpu.finish_step().unwrap_err();
    assert!(e.to_string().contains("locations"), "{e}");
    gpu.finish_step().expect("the fault is reported once");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_attention_does_not_depend_on_where_rows_live() {
    placement_does_not_matter(
        &gpu().with_wgmma_attention(false),
        &attn_case(9, 128, KvRowFormat::Fp8, &[2048, 700, 2048]),
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_attention_reports_out_of_range_locations() {
    out_of_range_locations_are_reported(&gpu().with_wgmma_attention(false));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_step_helpers_match_their_host_forms() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let mem = gpu.memory().clone();
    // The unit stream, bit for bit (odd lengths too).
    let seeds = [1u64, 0xdead_beef, u64::MAX, 77];
    for len in [576usize * 16, 129] {
        let mut want = vec![bf16::ZERO; seeds.len() * len];
        cpu.fill_unit_bf16(&seeds, len, &mut want).unwrap();
        let mut got = mem.alloc_zeroed::<bf16>(seeds.len() * len).unwrap();
        gpu.fill_unit_bf16(&seeds, len, &mut got).unwrap();
        let got = mem.download(&got).unwrap();
        assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "len {len}");
        assert!(want.iter().any(|x| x.to_f32().abs() > 1.0));
    }
    // Batched row writes (132 B keys and 656 B rows).
    let mut rng = random::rng(3);
    for row_bytes in [132usize, 656] {
        let mut pool_c = vec![0u8; 100 * row_bytes];
        rng.fill(&mut pool_c[..]);
        let mut pool_g = mem.upload(&pool_c).unwrap();
        let rows: Vec<u32> = vec![5, 99, 0, 42, 43];
        let mut data = vec![0u8; rows.len() * row_bytes];
        rng.fill(&mut data[..]);
        cpu.write_rows(&mut pool_c, row_bytes, &rows, &data).unwrap();
        gpu.write_rows(&mut pool_g, row_bytes, &rows, &data).unwrap();
        assert_eq!(mem.download(&pool_g).unwrap(), pool_c, "row bytes {row_bytes}");
    }
    // Rows by position through page tables.
    let sel: Vec<i32> = vec![0, 1, 63, 64, 200, 3, 17, 70];
    let spans = [Span::new(0, 5), Span::new(5, 3)];
    let table: Vec<u32> = vec![9, 2, 7, 4, 1, 8];
    let first = [0usize, 4];
    let mut want = vec![-1i32; 8];
    cpu.locate_rows(&sel, &spans, &table, &first, 64, &mut want).unwrap();
    assert_eq!(want, vec![576, 577, 639, 128, 264, 67, 81, 518]);
    let (sd, td) = (mem.upload(&sel).unwrap(), mem.upload(&table).unwrap());
    let mut got = mem.upload(&[-1i32; 8]).unwrap();
    gpu.locate_rows(&sd, &spans, &td, &first, 64, &mut got).unwrap();
    gpu.finish_step().unwrap();
    assert_eq!(mem.download(&got).unwrap(), want);
    // A position past a request's pages is a fault, not a read.
    let bad = mem.upload(&[0i32, 1, 63, 64, 200, 3, 17, 700]).unwrap();
    gpu.locate_rows(&bad, &spans, &td, &first, 64, &mut got).unwrap();
    assert!(gpu.finish_step().is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_new_rows_and_device_scatter_match_their_host_forms() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let mem = gpu.memory().clone();
    let mut rng = random::rng(11);
    // An emulated model's new rows, bit for bit: fp8 and bf16 rows, with and without keys,
    // several key mixes (the kernel rounds each product and the sum as the host does).
    // MLA rows with 128-dim keys, and grouped-query rows with every KV head's key (192 dims:
    // SmolLM2's; 1024: Llama-3.1-8B's, the longest the fill takes).
    let c = (1.0f32 - 0.1 * 0.1).sqrt();
    for (kv, key_dim, n, mix) in [
        (KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap(), 128, 37usize, (c, 0.1f32)),
        (KvRowLayout::new(KvRowFormat::Bf16, 512, 64).unwrap(), 128, 5, (0.6, 0.8)),
        (KvRowLayout::gqa(KvRowFormat::Bf16, 3, 64).unwrap(), 192, 9, (c, 0.1)),
        (KvRowLayout::gqa(KvRowFormat::Fp8, 8, 128).unwrap(), 1024, 7, (0.6, 0.8)),
    ] {
        let (format, key) = (kv.format(), IndexKeyLayout::new(key_dim).unwrap());
        let seeds: Vec<u64> = (0..n).map(|_| rng.random()).collect();
        let key_seeds: Vec<u64> = (0..2 * n).map(|_| rng.random()).collect();
        let (mut rows, mut keys) = (vec![0u8; n * kv.row_bytes()], vec![0u8; n * key.row_bytes()]);
        hisparse_kernels::fill_new_rows_host(kv, &seeds, key, Some(&key_seeds), mix, &mut rows, Some(&mut keys))
            .unwrap();
        let (sd, kd) = (mem.upload(&seeds).unwrap(), mem.upload(&key_seeds).unwrap());
        let mut rg = mem.alloc_zeroed::<u8>(n * kv.row_bytes()).unwrap();
        let mut kg = mem.alloc_zeroed::<u8>(n * key.row_bytes()).unwrap();
        let fill = hisparse_kernels::NewRows {
            kv_layout: kv,
            kv_seeds: &sd,
            key_layout: key,
            key_seeds: Some(&kd),
            key_mix: mix,
        };
        gpu.fill_new_rows(&fill, &mut rg, Some(&mut kg)).unwrap();
        assert_eq!(mem.download(&rg).unwrap(), rows, "{format:?} rows, keys of {key_dim}");
        assert_eq!(mem.download(&kg).unwrap(), keys, "{format:?} keys of {key_dim}");
        // Without keys: the rows alone, the same bytes.
        let mut rg2 = mem.alloc_zeroed::<u8>(n * kv.row_bytes()).unwrap();
        let fill = hisparse_kernels::NewRows { key_seeds: None, ..fill };
        gpu.fill_new_rows(&fill, &mut rg2, None).unwrap();
        assert_eq!(mem.download(&rg2).unwrap(), rows, "{format:?} rows without keys");
        // The CPU backend's form (the trait's default) gives the same bytes.
        let mut rc = vec![0u8; n * kv.row_bytes()];
        let (sc, kc) = (seeds.clone(), key_seeds.clone());
        let fill = hisparse_kernels::NewRows {
            kv_layout: kv,
            kv_seeds: &sc,
            key_layout: key,
            key_seeds: Some(&kc),
            key_mix: mix,
        };
        let mut kcpu = vec![0u8; n * key.row_bytes()];
        cpu.fill_new_rows(&fill, &mut rc, Some(&mut kcpu)).unwrap();
        assert_eq!((rc, kcpu), (rows, keys));
    }
    // Rows scattered from device buffers (the new token's rows into their slots).
    for row_bytes in [132usize, 656, 1152] {
        let mut pool_c = vec![0u8; 100 * row_bytes];
        rng.fill(&mut pool_c[..]);
        let mut pool_g = mem.upload(&pool_c).unwrap();
        let dest: Vec<u32> = vec![7, 99, 0, 41, 42, 13];
        let mut data = vec![0u8; dest.len() * row_bytes];
        rng.fill(&mut data[..]);
        cpu.scatter_rows(&mut pool_c, row_bytes, &dest, &data).unwrap();
        let (dd, da) = (mem.upload(&dest).unwrap(), mem.upload(&data).unwrap());
        gpu.scatter_rows(&mut pool_g, row_bytes, &dd, &da).unwrap();
        gpu.finish_step().unwrap();
        assert_eq!(mem.download(&pool_g).unwrap(), pool_c, "row bytes {row_bytes}");
        // A destination outside the pool is written nowhere and reported.
        let bad = mem.upload(&[7u32, 100, 0, 41, 42, 13]).unwrap();
        gpu.scatter_rows(&mut pool_g, row_bytes, &bad, &da).unwrap();
        assert!(gpu.finish_step().is_err(), "row bytes {row_bytes}: the fault is reported");
        assert_eq!(mem.download(&pool_g).unwrap(), pool_c, "row bytes {row_bytes}: nothing else changed");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_launch_prints_follow_every_argument() {
    // Launches record their own print (`cuda::printed_launch`): the same launches give the same
    // print; a different value, buffer or length gives a different one.
    let gpu = gpu();
    let mem = gpu.memory().clone();
    let (mut a, mut b) = (mem.alloc_zeroed::<bf16>(4 * 64).unwrap(), mem.alloc_zeroed::<bf16>(4 * 64).unwrap());
    let print = |f: &mut dyn FnMut(&CudaBackend)| {
        gpu.launch_print();
        f(&gpu);
        gpu.launch_print()
    };
    let base = print(&mut |g| g.fill_unit_bf16(&[1, 2, 3, 4], 64, &mut a).unwrap());
    assert_eq!(base, print(&mut |g| g.fill_unit_bf16(&[1, 2, 3, 4], 64, &mut a).unwrap()));
    // Seeds are data on the device (read when the launch runs), not arguments: same print.
    assert_eq!(base, print(&mut |g| g.fill_unit_bf16(&[5, 6, 7, 8], 64, &mut a).unwrap()));
    assert_ne!(base, print(&mut |g| g.fill_unit_bf16(&[1, 2, 3, 4], 64, &mut b).unwrap()), "output buffer");
    assert_ne!(base, print(&mut |g| g.fill_unit_bf16(&[1, 2], 128, &mut a).unwrap()), "segment length");
    assert_ne!(base, print(&mut |g| g.fill_unit_bf16(&[1, 2, 3, 4, 5, 6, 7, 8], 32, &mut a).unwrap()), "segments");
}
