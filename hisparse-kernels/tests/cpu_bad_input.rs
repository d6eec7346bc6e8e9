//! Bad input to the CPU kernels: every case is a typed error naming the field and the value,
//! and nothing is written.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_kernels::Kernels;
use hisparse_kernels::random;
use hisparse_kernels::{AttentionBatch, CpuBackend, IndexerBatch, IndexerRequest, KernelError, Span};
use hisparse_memory::{IndexKeyLayout, KvRowFormat, KvRowLayout, MemoryError};

fn fp8() -> KvRowLayout {
    KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap()
}

struct Attn {
    q: Vec<half::bf16>,
    pool: Vec<u8>,
    locs: Vec<i32>,
}

fn attn() -> Attn {
    let mut rng = random::rng(21);
    let (pool, _) = random::kv_pool(&mut rng, fp8(), 10).unwrap();
    Attn { q: random::normal_bf16(&mut rng, 4 * 576, 1.0), pool, locs: vec![0, 3, 9] }
}

fn attend(a: &Attn, heads: usize, layout: KvRowLayout, scale: f32, out_len: usize) -> Result<Vec<f32>, KernelError> {
    let sel = [Span::new(0, a.locs.len())];
    let batch = AttentionBatch {
        heads,
        layout,
        softmax_scale: scale,
        queries: &a.q,
        rows: &a.pool,
        locations: &a.locs,
        selections: &sel,
    };
    let mut out = vec![-7.0f32; out_len];
    let mut lse = vec![-7.0f32; heads];
    let r = CpuBackend::new().sparse_attention(&batch, &mut out, &mut lse);
    if r.is_err() {
        assert!(out.iter().chain(&lse).all(|&x| x == -7.0), "a failed call wrote its outputs");
    }
    r.map(|()| out)
}

#[test]
fn attention_rejects_bad_arguments_by_name() {
    let a = attn();
    attend(&a, 4, fp8(), 0.1, 4 * 512).unwrap();
    // Wrong output length.
    let e = attend(&a, 4, fp8(), 0.1, 4 * 511).unwrap_err();
    assert_eq!(e, KernelError::Memory(MemoryError::LengthMismatch { field: "out", expected: 2048, actual: 2044 }));
    // Queries for a different head count.
    let e = attend(&a, 3, fp8(), 0.1, 3 * 512).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::LengthMismatch { field: "queries", .. })), "{e}");
    // Zero heads.
    let e = attend(&a, 0, fp8(), 0.1, 0).unwrap_err();
    assert!(e.to_string().contains("heads = 0"), "{e}");
    // Non-finite softmax scale.
    for bad in [f32::NAN, f32::INFINITY] {
        let e = attend(&a, 4, fp8(), bad, 4 * 512).unwrap_err();
        assert!(matches!(e, KernelError::InvalidArgument { field: "softmax_scale", .. }), "{e}");
    }
    // A row format that does not match the pool (ten 656 B rows read as 1152 B rows: five whole
    // ones, so location 9 lies past them).
    let bf16 = KvRowLayout::new(KvRowFormat::Bf16, 512, 64).unwrap();
    let e = attend(&a, 4, bf16, 0.1, 4 * 512).unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { field: "locations", .. }) && e.to_string().contains('9'), "{e}");
}

#[test]
fn attention_reads_only_a_pools_whole_rows() {
    // A shared pool of hybrid placement ends in whole key pages, not always whole rows: bytes
    // past the last whole row are never read.
    let a = attn();
    let want = attend(&a, 4, fp8(), 0.1, 4 * 512).unwrap();
    let mut long = Attn { q: a.q.clone(), pool: a.pool.clone(), locs: a.locs.clone() };
    long.pool.extend((0..600).map(|i| (i * 13 % 251) as u8));
    assert_eq!(attend(&long, 4, fp8(), 0.1, 4 * 512).unwrap(), want);
    long.locs[2] = 10;
    let e = attend(&long, 4, fp8(), 0.1, 4 * 512).unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { field: "locations", .. }), "600 bytes are no row: {e}");
}

#[test]
fn attention_rejects_bad_locations_and_scales() {
    let mut a = attn();
    a.locs[1] = 10;
    let e = attend(&a, 4, fp8(), 0.1, 2048).unwrap_err();
    assert!(
        matches!(e, KernelError::InvalidArgument { field: "locations", .. }) && e.to_string().contains("10"),
        "{e}"
    );
    a.locs[1] = -1;
    assert!(attend(&a, 4, fp8(), 0.1, 2048).is_err());
    // A non-finite scale stored in a selected row.
    let mut a = attn();
    a.pool[3 * 656 + 520..3 * 656 + 524].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = attend(&a, 4, fp8(), 0.1, 2048).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::BadScale { field: "kv_row", index: 2, .. })), "{e}");
}

#[test]
fn top_k_larger_than_seq_len_is_named() {
    let scores = vec![1.0f32; 100];
    let mut out = vec![0i32; 2 * 64];
    let e = CpuBackend::new().top_k(&scores, &[Span::new(0, 70), Span::new(70, 30)], 64, &mut out).unwrap_err();
    assert_eq!(e, KernelError::TopKExceedsLength { request: 1, top_k: 64, seq_len: 30 });
    assert!(e.to_string().contains("top_k = 64") && e.to_string().contains("seq_len = 30"));
    assert!(out.iter().all(|&x| x == 0), "nothing written");
    let mut one = vec![0i32; 64];
    let e = CpuBackend::new().top_k(&scores, &[Span::new(50, 70)], 64, &mut one).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::OutOfBounds { field: "scores", .. })), "{e}");
    // A span whose end overflows ends past every buffer: an error, not a wrapped index.
    let huge = Span::new(usize::MAX - 3, 70);
    assert_eq!(huge.end(), usize::MAX);
    let e = CpuBackend::new().top_k(&scores, &[huge], 64, &mut one).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::OutOfBounds { field: "scores", .. })), "{e}");
    assert!(one.iter().all(|&x| x == 0), "nothing written");
}

#[test]
fn indexer_rejects_bad_arguments_by_name() {
    let mut rng = random::rng(22);
    let key = IndexKeyLayout::new(128).unwrap();
    // 12 pages of 4 keys; request 0 uses pages [5..10), request 1 pages [0, 1, 2, 3, 4, 10, 11].
    let mut pool = random::index_key_pool(&mut rng, key, 48).unwrap();
    let q = random::normal_bf16(&mut rng, 2 * 4 * 128, 1.0);
    let w = random::head_weights(&mut rng, 2 * 4);
    let table: Vec<u32> = vec![5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 10, 11, 12];
    let cpu = CpuBackend::new();
    let req = |first_page, seq_len, score_offset| IndexerRequest { first_page, seq_len, score_offset };
    let good = [req(0, 20, 0), req(5, 28, 20)];
    let run = |pool: &Vec<u8>, heads, w: &Vec<f32>, page_tokens, requests: &[IndexerRequest], n_scores| {
        let batch = IndexerBatch {
            heads,
            key_layout: key,
            queries: &q,
            weights: w,
            keys: pool,
            page_tokens,
            page_table: &table,
            requests,
            pin_newest: false,
            queries_as: hisparse_kernels::IndexerQueries::Exact,
            score: hisparse_kernels::IndexScore::Lightning,
        };
        let mut s = vec![-3f32; n_scores];
        let r = cpu.indexer_scores(&batch, &mut s);
        if r.is_err() {
            assert!(s.iter().all(|&x| x == -3.0), "a failed call wrote scores");
        }
        r
    };
    run(&pool, 4, &w, 4, &good, 48).unwrap();
    let e = run(&pool, 0, &w, 4, &good, 48).unwrap_err();
    assert!(e.to_string().contains("heads = 0"), "{e}");
    let e = run(&pool, 4, &w, 0, &good, 48).unwrap_err();
    assert!(e.to_string().contains("page_tokens = 0"), "{e}");
    let e = run(&pool, 4, &w, 4, &[req(0, 20, 0), req(9, 28, 20)], 48).unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { field: "requests.first_page", .. }), "{e}");
    // Page 12 is not a page of a 12-page pool.
    let e = run(&pool, 4, &w, 4, &[req(0, 20, 0), req(6, 28, 20)], 48).unwrap_err();
    assert!(
        matches!(e, KernelError::InvalidArgument { field: "page_table", .. }) && e.to_string().contains("12"),
        "{e}"
    );
    let e = run(&pool, 4, &w, 4, &[req(0, 20, 0), req(5, 28, 10)], 48).unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    let e = run(&pool, 4, &w, 4, &good, 47).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::OutOfBounds { field: "scores", .. })), "{e}");
    let mut w2 = w.clone();
    w2[5] = f32::INFINITY;
    let e = run(&pool, 4, &w2, 4, &good, 48).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::NonFinite { field: "weights", index: 5, .. })), "{e}");
    // A non-finite scale in key 1 of page 5 (position 1 of request 0).
    pool[21 * 132 + 128..21 * 132 + 132].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = run(&pool, 4, &w, 4, &good, 48).unwrap_err();
    assert!(matches!(e, KernelError::Memory(MemoryError::BadScale { field: "index_key", .. })), "{e}");
}
