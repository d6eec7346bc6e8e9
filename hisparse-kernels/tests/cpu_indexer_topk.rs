//! CPU lightning indexer against an f64 oracle, and CPU top-k against a sort-based oracle
//! (ties to the lower position), up to 2048 of 128k.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_kernels::Kernels;
use hisparse_kernels::random;
use hisparse_kernels::{CpuBackend, IndexerBatch, IndexerRequest, Span};
use hisparse_memory::IndexKeyLayout;
use rand::Rng;
use rand::seq::SliceRandom;

#[test]
fn indexer_matches_the_f64_oracle_for_requests_of_different_lengths() {
    let mut rng = random::rng(11);
    let (heads, dim) = (8, 128);
    let key = IndexKeyLayout::new(dim).unwrap();
    let lens = [1usize, 300, 1111];
    // Keys live in pages of 64 scattered over one pool (shuffled page ids); scores are packed
    // with gaps.
    let p = 64;
    let pool = random::index_key_pool(&mut rng, key, 50 * p).unwrap();
    let mut ids: Vec<u32> = (0..50).collect();
    ids.shuffle(&mut rng);
    let q = random::normal_bf16(&mut rng, lens.len() * heads * dim, 1.0);
    let w = random::head_weights(&mut rng, lens.len() * heads);
    let mut requests = Vec::new();
    let mut page_table = Vec::new();
    let mut offset = 5;
    for &n in &lens {
        requests.push(IndexerRequest { first_page: page_table.len(), seq_len: n, score_offset: offset });
        page_table.extend(ids.drain(..n.div_ceil(p)));
        offset += n + 3;
    }
    let mut scores = vec![f32::NAN; offset];
    let batch = IndexerBatch {
        heads,
        key_layout: key,
        queries: &q,
        weights: &w,
        keys: &pool,
        page_tokens: p,
        page_table: &page_table,
        requests: &requests,
        pin_newest: false,
        queries_as: hisparse_kernels::IndexerQueries::Exact,
        score: hisparse_kernels::IndexScore::Lightning,
    };
    CpuBackend::new().indexer_scores(&batch, &mut scores).unwrap();
    let mut decoded = vec![0f32; dim];
    let mut positive = 0;
    for (i, r) in requests.iter().enumerate() {
        for t in 0..r.seq_len {
            let row = (page_table[r.first_page + t / p] as usize * p + t % p) * 132;
            key.decode(&pool[row..row + 132], &mut decoded).unwrap();
            let (mut s, mut mag) = (0f64, 0f64);
            for h in 0..heads {
                let qh = &q[(i * heads + h) * dim..(i * heads + h + 1) * dim];
                let d: f64 = qh.iter().zip(&decoded).map(|(a, b)| f64::from(a.to_f32()) * f64::from(*b)).sum();
                let m: f64 = qh.iter().zip(&decoded).map(|(a, b)| (f64::from(a.to_f32()) * f64::from(*b)).abs()).sum();
                s += f64::from(w[i * heads + h]) * d.max(0.0);
                mag += f64::from(w[i * heads + h]) * m;
            }
            let got = f64::from(scores[r.score_offset + t]);
            assert!((got - s).abs() <= 1e-5 * mag + 1e-6, "request {i} position {t}: {got} vs {s}");
            positive += usize::from(s > 0.0);
        }
    }
    // Untouched gaps stay untouched.
    assert!(scores[..5].iter().all(|x| x.is_nan()));
    assert!(positive > 1000, "scores are not trivially zero ({positive} positive)");
}

/// Sort-based oracle: sort all positions by (score desc, position asc), take k, sort positions.
fn oracle(scores: &[f32], k: usize) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut top: Vec<i32> = idx[..k].iter().map(|&i| i as i32).collect();
    top.sort_unstable();
    top
}

#[test]
fn top_k_matches_the_oracle_with_many_ties() {
    let mut rng = random::rng(12);
    let lens = [5usize, 64, 1000, 4097];
    let ks = [5usize, 1, 17, 2048];
    for (&n, &k) in lens.iter().zip(&ks) {
        // Only 8 distinct values: most of the selection is decided by the tie rule.
        let scores: Vec<f32> = (0..n).map(|_| f32::from(rng.random_range(0u8..8)) - 3.0).collect();
        let mut out = vec![0i32; k];
        CpuBackend::new().top_k(&scores, &[Span::new(0, n)], k, &mut out).unwrap();
        assert_eq!(out, oracle(&scores, k), "n = {n}, k = {k}");
    }
}

#[test]
fn top_k_2048_of_128k_for_a_batch() {
    let mut rng = random::rng(13);
    let n = 128 * 1024;
    let lens = [n, 3000, 2048];
    let total: usize = lens.iter().sum();
    let scores = random::normal(&mut rng, total, 1.0);
    let mut spans = Vec::new();
    let mut at = 0;
    for &l in &lens {
        spans.push(Span::new(at, l));
        at += l;
    }
    let k = 2048;
    let mut out = vec![0i32; lens.len() * k];
    CpuBackend::new().top_k(&scores, &spans, k, &mut out).unwrap();
    for (i, s) in spans.iter().enumerate() {
        assert_eq!(&out[i * k..(i + 1) * k], oracle(&scores[s.offset..s.end()], k).as_slice(), "request {i}");
    }
    // Selecting all of a span returns every position.
    assert_eq!(&out[2 * k..], (0..2048).collect::<Vec<i32>>().as_slice());
}

#[test]
fn top_k_orders_special_values_totally() {
    let scores = vec![0.0f32, -0.0, f32::NAN, f32::INFINITY, -1.0, 0.0];
    let mut out = vec![0i32; 3];
    CpuBackend::new().top_k(&scores, &[Span::new(0, 6)], 3, &mut out).unwrap();
    // NaN > +inf > +0 (first +0 at position 0 beats the one at 5) > -0.
    assert_eq!(out, vec![0, 2, 3]);
}

#[test]
fn fp8_queries_score_their_quantised_values() {
    use hisparse_kernels::IndexerQueries;
    use hisparse_kernels::index_queries::{pow2, quantize_head};
    let mut rng = random::rng(12);
    let (heads, dim, p) = (16, 128, 64);
    let key = IndexKeyLayout::new(dim).unwrap();
    let pool = random::index_key_pool(&mut rng, key, 20 * p).unwrap();
    let page_table: Vec<u32> = (0..20).rev().collect();
    // Two requests with query scales 2^40 apart: each head gets its own power-of-two scale.
    let mut q = random::normal_bf16(&mut rng, heads * dim, 3e-6);
    q.extend(random::normal_bf16(&mut rng, heads * dim, 4e6));
    let w = random::head_weights(&mut rng, 2 * heads);
    let requests = [
        IndexerRequest { first_page: 0, seq_len: 700, score_offset: 0 },
        IndexerRequest { first_page: 11, seq_len: 555, score_offset: 700 },
    ];
    let run = |queries_as| {
        let batch = IndexerBatch {
            heads,
            key_layout: key,
            queries: &q,
            weights: &w,
            keys: &pool,
            page_tokens: p,
            page_table: &page_table,
            requests: &requests,
            pin_newest: false,
            queries_as,
            score: hisparse_kernels::IndexScore::Lightning,
        };
        let mut s = vec![f32::NAN; 1255];
        CpuBackend::new().indexer_scores(&batch, &mut s).unwrap();
        s
    };
    let (exact, fp8) = (run(IndexerQueries::Exact), run(IndexerQueries::Fp8));
    let mut decoded = vec![0f32; dim];
    let mut codes = vec![0u8; dim];
    let (mut differ, mut positive) = (0, 0);
    for (i, r) in requests.iter().enumerate() {
        // The oracle: the quantised queries decoded and scaled back, in f64.
        let qs: Vec<Vec<f64>> = (0..heads)
            .map(|h| {
                let at = (i * heads + h) * dim;
                let e = quantize_head(&q[at..at + dim], &mut codes);
                codes.iter().map(|&c| f64::from(hisparse_memory::fp8::decode_e4m3(c)) * f64::from(pow2(e))).collect()
            })
            .collect();
        for t in 0..r.seq_len {
            let row = (page_table[r.first_page + t / p] as usize * p + t % p) * 132;
            key.decode(&pool[row..row + 132], &mut decoded).unwrap();
            let (mut s, mut mag) = (0f64, 0f64);
            for (h, qh) in qs.iter().enumerate() {
                let d: f64 = qh.iter().zip(&decoded).map(|(a, b)| a * f64::from(*b)).sum();
                let m: f64 = qh.iter().zip(&decoded).map(|(a, b)| (a * f64::from(*b)).abs()).sum();
                s += f64::from(w[i * heads + h]) * d.max(0.0);
                mag += f64::from(w[i * heads + h]) * m;
            }
            let got = f64::from(fp8[r.score_offset + t]);
            assert!((got - s).abs() <= 1e-5 * mag + 1e-30, "request {i} position {t}: {got} vs {s}");
            differ += usize::from(fp8[r.score_offset + t] != exact[r.score_offset + t]);
            positive += usize::from(s > 0.0);
        }
    }
    assert!(positive > 1000, "scores are not trivially zero ({positive} positive)");
    assert!(differ > 1000, "quantised queries score differently from exact ones ({differ} differ)");
}
