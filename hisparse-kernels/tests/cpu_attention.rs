//! CPU sparse attention against the dense f64 oracle: full selections, order and placement
//! independence, fp8 against bf16 rows, and LSE merging of disjoint selections.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::random::{self, decode_kv_rows, encode_kv_rows};
use hisparse_kernels::{AttentionBatch, Backend, CpuBackend, Span, dense_attention, merge_partial};
use hisparse_memory::{KvRowFormat, KvRowLayout};
use rand::seq::SliceRandom;

const HEADS: usize = 16;

fn layout(format: KvRowFormat) -> KvRowLayout {
    KvRowLayout::new(format, 512, 64).unwrap()
}

/// Runs the CPU kernel for one batch; returns (out, lse).
fn run(
    layout: KvRowLayout,
    q: &[bf16],
    pool: &[u8],
    locations: &[i32],
    selections: &[Span],
    scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let cpu = CpuBackend::new();
    let (q, rows, locs) = (q.to_vec(), pool.to_vec(), locations.to_vec());
    let batch = AttentionBatch {
        heads: HEADS,
        layout,
        softmax_scale: scale,
        queries: &q,
        rows: &rows,
        locations: &locs,
        selections,
    };
    let mut out = vec![0f32; selections.len() * HEADS * 512];
    let mut lse = vec![0f32; selections.len() * HEADS];
    cpu.sparse_attention(&batch, &mut out, &mut lse).unwrap();
    (out, lse)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn full_selection_equals_dense_attention() {
    let mut rng = random::rng(1);
    for format in [KvRowFormat::Bf16, KvRowFormat::Fp8] {
        let l = layout(format);
        // Three requests of different lengths, rows of each contiguous in one pool.
        let lens = [1usize, 77, 600];
        let total: usize = lens.iter().sum();
        let (pool, _) = random::kv_pool(&mut rng, l, total).unwrap();
        let decoded = decode_kv_rows(l, &pool).unwrap();
        let q = random::normal_bf16(&mut rng, lens.len() * HEADS * 576, 1.0);
        let mut locations = Vec::new();
        let mut selections = Vec::new();
        let mut start = 0;
        for &n in &lens {
            selections.push(Span::new(locations.len(), n));
            locations.extend((start..start + n).map(|p| p as i32));
            start += n;
        }
        let scale = 1.0 / 576f32.sqrt();
        let (out, lse) = run(l, &q, &pool, &locations, &selections, scale);
        let mut start = 0;
        for (i, &n) in lens.iter().enumerate() {
            let qf: Vec<f32> = q[i * HEADS * 576..(i + 1) * HEADS * 576].iter().map(|x| x.to_f32()).collect();
            let (o, l) = dense_attention(&qf, &decoded[start * 576..(start + n) * 576], HEADS, 576, 512, scale);
            let got = &out[i * HEADS * 512..(i + 1) * HEADS * 512];
            assert!(max_abs_diff(got, &o) < 2e-5, "{format:?} request {i}: {}", max_abs_diff(got, &o));
            assert!(max_abs_diff(&lse[i * HEADS..(i + 1) * HEADS], &l) < 2e-5, "{format:?} lse {i}");
            start += n;
        }
    }
}

#[test]
fn output_does_not_depend_on_selection_order_beyond_rounding() {
    let mut rng = random::rng(2);
    let l = layout(KvRowFormat::Fp8);
    let (pool, _) = random::kv_pool(&mut rng, l, 3000).unwrap();
    let q = random::normal_bf16(&mut rng, HEADS * 576, 1.0);
    let mut sel: Vec<i32> = (0..3000).step_by(3).collect();
    let (a, la) = run(l, &q, &pool, &sel, &[Span::new(0, sel.len())], 0.05);
    sel.shuffle(&mut rng);
    let (b, lb) = run(l, &q, &pool, &sel, &[Span::new(0, sel.len())], 0.05);
    assert!(max_abs_diff(&a, &b) < 1e-5, "{}", max_abs_diff(&a, &b));
    assert!(max_abs_diff(&la, &lb) < 1e-5);
    assert!(a.iter().any(|x| x.abs() > 1e-3), "outputs are not trivially zero");
}

#[test]
fn output_does_not_depend_on_where_rows_live() {
    // The same rows at other pool locations give bit-identical results: the basis of the
    // lossless hierarchy (resident reads by position, hisparse through slots).
    let mut rng = random::rng(3);
    let l = layout(KvRowFormat::Fp8);
    let (pool, values) = random::kv_pool(&mut rng, l, 500).unwrap();
    let q = random::normal_bf16(&mut rng, 2 * HEADS * 576, 1.0);
    let sel: Vec<i32> = vec![4, 9, 17, 100, 101, 250, 499, 0];
    let spans = [Span::new(0, 5), Span::new(5, 3)];
    let (a, la) = run(l, &q, &pool, &sel, &spans, 0.04);
    // Move every row r to slot 499 - r.
    let mut moved = values.clone();
    for r in 0..500 {
        moved[(499 - r) * 576..(500 - r) * 576].copy_from_slice(&values[r * 576..(r + 1) * 576]);
    }
    let pool2 = encode_kv_rows(l, &moved).unwrap();
    let sel2: Vec<i32> = sel.iter().map(|&r| 499 - r).collect();
    let (b, lb) = run(l, &q, &pool2, &sel2, &spans, 0.04);
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(la, lb);
}

/// Documented tolerance (see the crate README): with unit-normal latents, fp8 rows change the
/// output by at most 0.05 and the LSE by at most 0.05 against bf16 rows of the same values.
#[test]
fn fp8_rows_agree_with_bf16_rows_within_tolerance() {
    let mut rng = random::rng(4);
    let values = random::normal(&mut rng, 2048 * 576, 1.0);
    let p8 = encode_kv_rows(layout(KvRowFormat::Fp8), &values).unwrap();
    let p16 = encode_kv_rows(layout(KvRowFormat::Bf16), &values).unwrap();
    let q = random::normal_bf16(&mut rng, HEADS * 576, 1.0);
    let sel: Vec<i32> = (0..2048).collect();
    let spans = [Span::new(0, 2048)];
    let scale = 1.0 / 576f32.sqrt();
    let (a, la) = run(layout(KvRowFormat::Fp8), &q, &p8, &sel, &spans, scale);
    let (b, lb) = run(layout(KvRowFormat::Bf16), &q, &p16, &sel, &spans, scale);
    let (d, dl) = (max_abs_diff(&a, &b), max_abs_diff(&la, &lb));
    assert!(d < 0.05 && dl < 0.05, "out diff {d}, lse diff {dl}");
    assert!(d > 0.0, "fp8 rows must differ from bf16 rows somewhere");
}

#[test]
fn lse_merge_of_disjoint_parts_equals_the_union() {
    let mut rng = random::rng(5);
    let l = layout(KvRowFormat::Bf16);
    let (pool, _) = random::kv_pool(&mut rng, l, 1000).unwrap();
    let q = random::normal_bf16(&mut rng, HEADS * 576, 1.0);
    let mut all: Vec<i32> = (0..1000).filter(|r| r % 7 != 3).collect();
    all.shuffle(&mut rng);
    let (hits, misses) = all.split_at(600);
    let (u, lu) = run(l, &q, &pool, &all, &[Span::new(0, all.len())], 0.06);
    let (mut a, mut la) = run(l, &q, &pool, hits, &[Span::new(0, hits.len())], 0.06);
    let (b, lb) = run(l, &q, &pool, misses, &[Span::new(0, misses.len())], 0.06);
    merge_partial(&mut a, &mut la, &b, &lb, 512).unwrap();
    assert!(max_abs_diff(&a, &u) < 1e-5, "{}", max_abs_diff(&a, &u));
    assert!(max_abs_diff(&la, &lu) < 1e-5);
    // Merging an empty part changes nothing.
    let (e, le) = run(l, &q, &pool, &[], &[Span::new(0, 0)], 0.06);
    assert!(le.iter().all(|x| *x == f32::NEG_INFINITY) && e.iter().all(|x| *x == 0.0));
    let before = a.clone();
    merge_partial(&mut a, &mut la, &e, &le, 512).unwrap();
    assert_eq!(a, before);
}
