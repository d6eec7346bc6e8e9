//! Grouped-query rows and the oracle selection on the CPU: attention over GQA rows against an
//! f64 reference that reads each query head's group by hand; multi-head rows (KV heads equal to
//! query heads) against MLA-free arithmetic; the oracle's scores against f64 softmaxes, with
//! sum and max over heads, sink and window positions kept, over fp8 and 4-bit index keys; the
//! lightning indexer refuses 4-bit keys by name.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_kernels::random::{self, decode_kv_rows};
use hisparse_kernels::{
    AttentionBatch, CpuBackend, HeadCombine, IndexScore, IndexerBatch, IndexerQueries, IndexerRequest, Kernels,
    OracleScore, Span,
};
use hisparse_memory::{IndexKeyFormat, IndexKeyLayout, KvRowFormat, KvRowLayout};

/// f64 attention of one head: key at `k_at`, value at `v_at` of each decoded row.
fn head_f64(q: &[f32], rows: &[f32], stride: usize, k_at: usize, v_at: usize, scale: f64) -> (Vec<f64>, f64) {
    let d = q.len();
    let logits: Vec<f64> = rows
        .chunks(stride)
        .map(|r| scale * q.iter().zip(&r[k_at..k_at + d]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>())
        .collect();
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|l| (l - m).exp()).sum();
    let mut o = vec![0f64; d];
    for (r, l) in rows.chunks(stride).zip(&logits) {
        let p = (l - m).exp() / sum;
        for (acc, v) in o.iter_mut().zip(&r[v_at..v_at + d]) {
            *acc += p * f64::from(*v);
        }
    }
    (o, m + sum.ln())
}

#[test]
fn gqa_attention_reads_each_heads_group() {
    let mut rng = random::rng(11);
    for (format, q_heads, kv_heads, hd) in
        [(KvRowFormat::Bf16, 9, 3, 64), (KvRowFormat::Fp8, 9, 3, 64), (KvRowFormat::Bf16, 4, 4, 32)]
    {
        let layout = KvRowLayout::gqa(format, kv_heads, hd).unwrap();
        let lens = [1usize, 50, 333];
        let total: usize = lens.iter().sum();
        let (pool, _) = random::kv_pool(&mut rng, layout, total).unwrap();
        let decoded = decode_kv_rows(layout, &pool).unwrap();
        let q = random::normal_bf16(&mut rng, lens.len() * q_heads * hd, 1.0);
        // Each request attends its own rows in reverse order (placement and order are free).
        let (mut locations, mut selections, mut at) = (Vec::new(), Vec::new(), 0usize);
        for &n in &lens {
            selections.push(Span::new(locations.len(), n));
            locations.extend((at..at + n).rev().map(|r| r as i32));
            at += n;
        }
        let batch = AttentionBatch {
            heads: q_heads,
            layout,
            softmax_scale: 0.125,
            queries: &q,
            rows: &pool,
            locations: &locations,
            selections: &selections,
        };
        let mut out = vec![0f32; lens.len() * q_heads * hd];
        let mut lse = vec![0f32; lens.len() * q_heads];
        CpuBackend::new().sparse_attention(&batch, &mut out, &mut lse).unwrap();
        let stride = 2 * kv_heads * hd;
        let mut worst = 0f64;
        for (i, s) in selections.iter().enumerate() {
            let rows: Vec<f32> = locations[s.offset..s.end()]
                .iter()
                .flat_map(|&r| decoded[r as usize * stride..(r as usize + 1) * stride].iter().copied())
                .collect();
            for h in 0..q_heads {
                let g = h / (q_heads / kv_heads);
                let qh: Vec<f32> = q[(i * q_heads + h) * hd..][..hd].iter().map(|x| x.to_f32()).collect();
                let (o, e) = head_f64(&qh, &rows, stride, g * hd, (kv_heads + g) * hd, 0.125);
                let got = &out[(i * q_heads + h) * hd..][..hd];
                for (a, b) in got.iter().zip(&o) {
                    worst = worst.max((f64::from(*a) - b).abs());
                }
                worst = worst.max((f64::from(lse[i * q_heads + h]) - e).abs());
            }
        }
        assert!(worst < 2e-4, "{format} {q_heads}/{kv_heads}: worst {worst}");
        // Query heads that do not divide into the KV heads are refused by name.
        let bad = AttentionBatch { heads: q_heads + 1, ..batch };
        let mut o2 = vec![0f32; lens.len() * (q_heads + 1) * hd];
        let mut l2 = vec![0f32; lens.len() * (q_heads + 1)];
        let e = CpuBackend::new().sparse_attention(&bad, &mut o2, &mut l2).unwrap_err();
        if kv_heads > 1 {
            assert!(e.to_string().contains("q_heads"), "{e}");
        }
    }
}

#[test]
fn oracle_scores_are_the_heads_softmax_weights() {
    for format in [
        IndexKeyFormat::Fp8,
        IndexKeyFormat::Int4 { group: 16 },
        IndexKeyFormat::Int4 { group: 96 },
        IndexKeyFormat::Int2 { group: 16 },
        IndexKeyFormat::Int2 { group: 96 },
        IndexKeyFormat::Pages { tokens: 8 },
        IndexKeyFormat::Pages { tokens: 16 },
        IndexKeyFormat::Channels { keep: 8, group: 32 },
        IndexKeyFormat::Channels { keep: 40, group: 96 },
    ] {
        oracle_scores_of(format);
    }
}

/// The oracle over keys stored as `format` against f64 softmaxes of the decoded keys (of a page
/// summary's position: the largest product over its page's box, the box's corner on the side
/// of each query value's sign).
fn oracle_scores_of(format: IndexKeyFormat) {
    let mut rng = random::rng(12);
    let (heads, dim, page) = (6usize, 96usize, 16usize);
    let key = IndexKeyLayout::with_format(dim, format).unwrap();
    let lens = [5usize, 200, 61];
    let pages: Vec<usize> = lens.iter().map(|n| n.div_ceil(page)).collect();
    let pool_pages: usize = pages.iter().sum();
    let keys = random::index_key_pool(&mut rng, key, pool_pages * page).unwrap();
    // Pages in reverse pool order, so the table matters.
    let table: Vec<u32> = (0..pool_pages as u32).rev().collect();
    let (mut reqs, mut first, mut off) = (Vec::new(), 0usize, 0usize);
    for (&n, &p) in lens.iter().zip(&pages) {
        reqs.push(IndexerRequest { first_page: first, seq_len: n, score_offset: off });
        first += p;
        off += n;
    }
    let mut q = random::normal_bf16(&mut rng, lens.len() * heads * dim, 1.0);
    let w: Vec<f32> = (0..lens.len() * heads).map(|h| 0.1 + 0.01 * h as f32).collect();
    for (combine, sink, window) in [(HeadCombine::Sum, 0, 0), (HeadCombine::Max, 0, 0), (HeadCombine::Sum, 4, 8)] {
        if sink > 0 {
            // Queries that fill only a part of the key (as a GQA head's fills its group's):
            // the product over their non-zero span is the whole product.
            for (j, x) in q.iter_mut().enumerate() {
                if j % dim < dim / 3 || j % dim >= 2 * dim / 3 + (j / dim) % 3 {
                    *x = half::bf16::ZERO;
                }
            }
        }
        let score = IndexScore::Oracle(OracleScore { combine, sink, window });
        let batch = IndexerBatch {
            heads,
            key_layout: key,
            queries: &q,
            weights: &w,
            keys: &keys,
            page_tokens: page,
            page_table: &table,
            requests: &reqs,
            pin_newest: false,
            queries_as: IndexerQueries::Exact,
            score,
        };
        let mut got = vec![0f32; off];
        CpuBackend::new().indexer_scores(&batch, &mut got).unwrap();
        let mut kv = vec![0f32; dim];
        for (i, r) in reqs.iter().enumerate() {
            let mut logits = vec![vec![0f64; r.seq_len]; heads];
            for t in 0..r.seq_len {
                let q_rows = key.positions_per_row();
                let row = (table[r.first_page + t / page] as usize * page + t % page) / q_rows;
                let bytes = &keys[row * key.row_bytes()..(row + 1) * key.row_bytes()];
                let mut hi = vec![0f32; dim];
                if q_rows == 1 {
                    key.decode(bytes, &mut kv).unwrap();
                } else {
                    key.bounds(bytes, &mut kv, &mut hi).unwrap();
                }
                for (h, lh) in logits.iter_mut().enumerate() {
                    let qh = &q[(i * heads + h) * dim..][..dim];
                    let x: f64 = (0..dim)
                        .map(|j| {
                            let a = f64::from(qh[j].to_f32());
                            let k = if q_rows > 1 && a > 0.0 { hi[j] } else { kv[j] };
                            a * f64::from(k)
                        })
                        .sum();
                    lh[t] = f64::from(w[i * heads + h]) * x;
                }
            }
            let probs: Vec<Vec<f64>> = logits
                .iter()
                .map(|l| {
                    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = l.iter().map(|x| (x - m).exp()).sum();
                    l.iter().map(|x| (x - m).exp() / s).collect()
                })
                .collect();
            for t in 0..r.seq_len {
                let g = got[r.score_offset + t];
                if t < sink || t + window >= r.seq_len {
                    assert_eq!(g, f32::INFINITY, "request {i} position {t} is always kept");
                    continue;
                }
                let want = match combine {
                    HeadCombine::Sum => probs.iter().map(|p| p[t]).sum::<f64>(),
                    HeadCombine::Max => probs.iter().map(|p| p[t]).fold(0.0, f64::max),
                };
                assert!(
                    (f64::from(g) - want).abs() <= 1e-5 * want.max(1e-3),
                    "{format} {combine:?} {i}/{t}: {g} vs {want}"
                );
            }
        }
        // Sum of the heads' weights over a request's positions is the number of heads.
        if (combine, sink) == (HeadCombine::Sum, 0) {
            let total: f32 = got[reqs[1].score_offset..][..lens[1]].iter().sum();
            assert!((total - heads as f32).abs() < 1e-3, "{total}");
        }
    }
}

#[test]
fn the_lightning_indexer_refuses_four_bit_keys() {
    let mut rng = random::rng(5);
    let key = IndexKeyLayout::with_format(128, IndexKeyFormat::Int4 { group: 32 }).unwrap();
    let keys = random::index_key_pool(&mut rng, key, 64).unwrap();
    let q = random::normal_bf16(&mut rng, 8 * 128, 1.0);
    let w = vec![0.5f32; 8];
    let table = vec![0u32];
    let reqs = [IndexerRequest { first_page: 0, seq_len: 40, score_offset: 0 }];
    let batch = IndexerBatch {
        heads: 8,
        key_layout: key,
        queries: &q,
        weights: &w,
        keys: &keys,
        page_tokens: 64,
        page_table: &table,
        requests: &reqs,
        pin_newest: false,
        queries_as: IndexerQueries::Exact,
        score: IndexScore::Lightning,
    };
    let mut got = vec![7f32; 40];
    let e = CpuBackend::new().indexer_scores(&batch, &mut got).unwrap_err();
    assert!(e.to_string().contains("index_format") && e.to_string().contains("int4:32"), "{e}");
    assert!(got.iter().all(|&x| x == 7.0), "nothing written");
}
