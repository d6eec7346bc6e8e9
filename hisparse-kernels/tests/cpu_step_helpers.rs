//! The step helpers every backend has (host defaults, the CUDA backend overrides them): batched
//! row writes, rows by position through page tables, the unit stream as bf16, the indexer's
//! pinned newest position, and their typed errors.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::unit_stream;
use hisparse_kernels::{CpuBackend, IndexerBatch, IndexerRequest, KernelError, Span, random};
use hisparse_kernels::{Kernels, ModelKernels};
use hisparse_memory::IndexKeyLayout;
use rand::Rng;

#[test]
fn write_rows_writes_each_row_where_asked_and_checks_lengths() {
    let cpu = CpuBackend::new();
    let mut rng = random::rng(1);
    let mut pool = vec![0u8; 10 * 132];
    rng.fill(&mut pool[..]);
    let before = pool.clone();
    let data: Vec<u8> = (0..3 * 132).map(|i| (i % 251) as u8).collect();
    cpu.write_rows(&mut pool, 132, &[7, 0, 4], &data).unwrap();
    for (j, &r) in [7usize, 0, 4].iter().enumerate() {
        assert_eq!(&pool[r * 132..(r + 1) * 132], &data[j * 132..(j + 1) * 132]);
    }
    for r in [1usize, 2, 3, 5, 6, 8, 9] {
        assert_eq!(&pool[r * 132..(r + 1) * 132], &before[r * 132..(r + 1) * 132], "row {r} untouched");
    }
    let e = cpu.write_rows(&mut pool, 132, &[1, 2], &data).unwrap_err();
    assert!(e.to_string().contains("data"), "{e}");
    assert!(cpu.write_rows(&mut pool, 132, &[10], &data[..132]).is_err(), "row past the pool");
    // All rows or none: a bad index after good ones writes nothing at all.
    let snapshot = pool.clone();
    let e = cpu.write_rows(&mut pool, 132, &[1, 2, 10], &data).unwrap_err();
    assert!(e.to_string().contains("rows = 10"), "{e}");
    assert_eq!(pool, snapshot, "a refused write changed the pool");
    assert!(cpu.write_rows(&mut pool, usize::MAX, &[0, 1], &[]).is_err(), "overflowing row sizes");
}

#[test]
fn locate_rows_maps_positions_through_each_requests_pages() {
    let cpu = CpuBackend::new();
    let sel = vec![0i32, 1, 63, 64, 200, 3, 17, 70];
    let table = vec![9u32, 2, 7, 4, 1, 8];
    let mut out = vec![-1i32; 8];
    cpu.locate_rows(&sel, &[Span::new(0, 5), Span::new(5, 3)], &table, &[0, 4], 64, &mut out).unwrap();
    assert_eq!(out, vec![576, 577, 639, 128, 264, 67, 81, 518]);
    let bad = |e: KernelError, field: &str| assert!(e.to_string().contains(field), "{e}");
    bad(cpu.locate_rows(&sel, &[Span::new(0, 5)], &table, &[0, 4], 64, &mut out).unwrap_err(), "first_pages");
    bad(cpu.locate_rows(&sel, &[Span::new(0, 5)], &table, &[0], 0, &mut out).unwrap_err(), "page_tokens");
    bad(cpu.locate_rows(&sel, &[Span::new(6, 5)], &table, &[0], 64, &mut out).unwrap_err(), "spans");
    let far = vec![0i32, 1000];
    bad(cpu.locate_rows(&far, &[Span::new(0, 2)], &table, &[0], 64, &mut out).unwrap_err(), "selections");
    let neg = vec![-3i32];
    bad(cpu.locate_rows(&neg, &[Span::new(0, 1)], &table, &[0], 64, &mut out).unwrap_err(), "selections");
}

#[test]
fn fill_unit_bf16_is_the_unit_stream_rounded() {
    let cpu = CpuBackend::new();
    let seeds = [5u64, 6, 0xffff_ffff_ffff];
    let len = 577;
    let mut out = vec![bf16::ZERO; seeds.len() * len];
    cpu.fill_unit_bf16(&seeds, len, &mut out).unwrap();
    let mut f = vec![0f32; len];
    for (i, &s) in seeds.iter().enumerate() {
        unit_stream::fill_unit(s, &mut f);
        let want: Vec<bf16> = f.iter().map(|&x| bf16::from_f32(x)).collect();
        assert_eq!(&out[i * len..(i + 1) * len], want.as_slice(), "segment {i}");
    }
    assert_ne!(out[..len], out[len..2 * len], "different seeds, different values");
    // Fixed vectors, computed apart from this code (SplitMix64 by hand, f32 steps, bf16 round to
    // nearest even): the first five values of the streams seeded 5 and 0xffff_ffff_ffff.
    let fixed: [(usize, [u16; 5]); 2] =
        [(0, [0x3e07, 0xbfd8, 0x3ea1, 0x3ea1, 0xbe8c]), (2, [0x3f55, 0x3f69, 0x3fbe, 0xbfd4, 0xbf79])];
    for (segment, bits) in fixed {
        let got: Vec<u16> = out[segment * len..segment * len + 5].iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, bits, "seed of segment {segment}");
    }
    assert!(cpu.fill_unit_bf16(&seeds, len + 1, &mut out).is_err(), "output of the wrong length");
}

#[test]
fn the_indexer_pins_each_requests_newest_position_when_asked() {
    let key = IndexKeyLayout::new(128).unwrap();
    let mut rng = random::rng(2);
    let pool = random::index_key_pool(&mut rng, key, 4 * 16).unwrap();
    let q = random::normal_bf16(&mut rng, 2 * 8 * 128, 1.0);
    let w = random::head_weights(&mut rng, 2 * 8);
    let table = vec![3u32, 1, 0, 2];
    let requests = [
        IndexerRequest { first_page: 0, seq_len: 20, score_offset: 0 },
        IndexerRequest { first_page: 2, seq_len: 9, score_offset: 20 },
    ];
    let run = |pin: bool| {
        let mut scores = vec![0f32; 29];
        let batch = IndexerBatch {
            heads: 8,
            key_layout: key,
            queries: &q,
            weights: &w,
            keys: &pool,
            page_tokens: 16,
            page_table: &table,
            requests: &requests,
            pin_newest: pin,
            queries_as: hisparse_kernels::IndexerQueries::Exact,
            score: hisparse_kernels::IndexScore::Lightning,
        };
        CpuBackend::new().indexer_scores(&batch, &mut scores).unwrap();
        scores
    };
    let (plain, pinned) = (run(false), run(true));
    for (i, (a, b)) in plain.iter().zip(&pinned).enumerate() {
        if i == 19 || i == 28 {
            assert_eq!(*b, f32::INFINITY, "position {i} is a request's newest");
            assert!(a.is_finite());
        } else {
            assert_eq!(a, b, "position {i}");
        }
    }
}
