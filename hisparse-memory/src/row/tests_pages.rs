//! Tests of page summaries as an index format: names, sizes and limits; a device tier folding
//! the keys written at a page's positions into one row, against the minima and maxima computed
//! here from the keys; the plan counting their real bytes.

use super::{IndexKeyFormat, IndexKeyLayout};
use crate::device_memory::EmulatedDevice;
use crate::device_tier::{DeviceTier, DeviceTierConfig};
use crate::error::MemoryError;
use crate::{KvRowFormat, KvRowLayout, Mode, RequestId};

fn pages(dim: usize, tokens: usize) -> IndexKeyLayout {
    IndexKeyLayout::with_format(dim, IndexKeyFormat::Pages { tokens }).unwrap()
}

#[test]
fn page_summaries_are_named_sized_and_limited() {
    assert_eq!("pages".parse::<IndexKeyFormat>().unwrap(), IndexKeyFormat::Pages { tokens: 16 });
    assert_eq!("pages:32".parse::<IndexKeyFormat>().unwrap().name(), "pages:32");
    assert!("pages:x".parse::<IndexKeyFormat>().is_err());
    let l = pages(192, 16);
    // SmolLM2's 3 KV heads of 64: 768 B a summary, 48 B a position (fp8 keys: 196).
    assert_eq!((l.row_bytes(), l.positions_per_row(), l.bytes_per_position()), (768, 16, 48));
    assert_eq!(l.page_bytes(64).unwrap(), 4 * 768);
    let e = l.page_bytes(40).unwrap_err().to_string();
    assert!(e.contains("index_format") && e.contains("pages:16") && e.contains("40"), "{e}");
    for tokens in [0, 1, 7] {
        let e = IndexKeyLayout::with_format(6, IndexKeyFormat::Pages { tokens }).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "index_format", .. }), "{tokens}: {e}");
    }
    let fp8 = IndexKeyLayout::new(128).unwrap();
    assert_eq!((fp8.positions_per_row(), fp8.bytes_per_position(), fp8.page_bytes(5).unwrap()), (1, 132, 660));
    assert!(fp8.fold(&mut [0u8; 132], &[0u8; 132]).is_err(), "fp8 keys do not fold");
    let mut row = vec![0u8; 768];
    l.encode(&[0.5; 192], &mut row).unwrap();
    assert!(l.decode(&row, &mut [0f32; 192]).is_err(), "a summary holds bounds, not a key");
}

/// The bf16 at or below `v` and the one at or above it, from `v`'s bits (an independent reading
/// of outward rounding: a bf16 is an f32 whose low 16 bits are zero, so cutting them rounds
/// towards zero and the next such value lies away from it).
fn bracket(v: f32) -> (f32, f32) {
    let cut = v.to_bits() & 0xffff_0000;
    let toward = f32::from_bits(cut);
    if toward == v {
        return (v, v);
    }
    let away = f32::from_bits(cut + 0x1_0000);
    if v > 0.0 { (toward, away) } else { (away, toward) }
}

#[test]
fn a_tier_folds_a_pages_keys_into_its_summary() {
    let (dim, q, p) = (8usize, 4usize, 8usize);
    let key = pages(dim, q);
    let cfg = DeviceTierConfig {
        layers: 1,
        index_layers: 1,
        kv_row: KvRowLayout::new(KvRowFormat::Bf16, 8, 0).unwrap(),
        index_key: key,
        keeps_index: true,
        page_tokens: p,
        kv_pages: 4,
        index_pages: 4,
        seats: 0,
        device_buffer_size: 1,
        shared_pool: false,
    };
    let mut t = DeviceTier::new(EmulatedDevice, cfg.clone()).unwrap();
    assert_eq!(t.config().bytes(), 4 * p * 16 + 4 * (p / q) * 4 * dim, "KV pages, then 2 summaries a key page");
    let (a, b) = (RequestId(1), RequestId(2));
    for r in [a, b] {
        t.register(r, Mode::Resident).unwrap();
    }
    t.grow(a, 14).unwrap();
    t.grow(b, 3).unwrap();
    let keys: Vec<Vec<f32>> =
        (0..14).map(|i| (0..dim).map(|j| ((i * 7 + j * 3) as f32 * 0.77).sin() * (1.0 + j as f32)).collect()).collect();
    let mut row = vec![0u8; key.row_bytes()];
    for (i, k) in keys.iter().enumerate() {
        key.encode(k, &mut row).unwrap();
        t.write_index_key(a, 0, i, &row).unwrap();
        if i < 3 {
            // Another request's keys between them change nothing of a's.
            key.encode(&[9.0; 8], &mut row).unwrap();
            t.write_index_key(b, 0, i, &row).unwrap();
        }
    }
    assert_eq!(t.index_key_row(a, 5).unwrap(), t.index_key_row(a, 7).unwrap(), "one row for positions 4..8");
    assert_ne!(t.index_key_row(a, 3).unwrap(), t.index_key_row(a, 4).unwrap());
    let (mut lo, mut hi) = (vec![0f32; dim], vec![0f32; dim]);
    for s in 0..14usize.div_ceil(q) {
        let at = t.index_key_row(a, s * q).unwrap() * key.row_bytes();
        key.check_scales(&t.keys(0)[at..at + key.row_bytes()]).unwrap();
        key.bounds(&t.keys(0)[at..at + key.row_bytes()], &mut lo, &mut hi).unwrap();
        let members = &keys[s * q..(s * q + q).min(14)];
        for j in 0..dim {
            let min = members.iter().map(|k| k[j]).fold(f32::INFINITY, f32::min);
            let max = members.iter().map(|k| k[j]).fold(f32::NEG_INFINITY, f32::max);
            assert_eq!((lo[j], hi[j]), (bracket(min).0, bracket(max).1), "summary {s}, value {j}");
        }
    }
    // In use: whole key pages (2 for a, 1 for b) of 2 summaries each, and 3 KV pages.
    assert_eq!(t.bytes_in_use(), 3 * p * 16 + 3 * 2 * 4 * dim);
    let plan_bad = DeviceTierConfig { page_tokens: 6, ..cfg };
    let e = DeviceTier::new(EmulatedDevice, plan_bad).err().unwrap().to_string();
    assert!(e.contains("pages:4") && e.contains("page of 6"), "{e}");
}

#[test]
fn folding_a_prompts_keys_at_once_equals_writing_them_one_by_one() {
    let key = pages(8, 4);
    let values: Vec<f32> = (0..11 * 8).map(|i| ((i * 13) as f32 * 0.31).cos() * (i % 5) as f32).collect();
    let mut rows = vec![0u8; 11 * key.row_bytes()];
    for (v, r) in values.chunks(8).zip(rows.chunks_mut(key.row_bytes())) {
        key.encode(v, r).unwrap();
    }
    let at_once = key.fold_positions(&rows).unwrap();
    assert_eq!(at_once.len(), 3 * key.row_bytes(), "11 positions: 2 whole summaries and a partial one");
    let mut one_by_one = rows[..key.row_bytes()].to_vec();
    for r in rows.chunks(key.row_bytes()).take(4).skip(1) {
        key.fold(&mut one_by_one, r).unwrap();
    }
    assert_eq!(&at_once[..key.row_bytes()], one_by_one.as_slice());
    assert_eq!(&at_once[2 * key.row_bytes()..], {
        let mut last = rows[8 * key.row_bytes()..9 * key.row_bytes()].to_vec();
        for r in rows.chunks(key.row_bytes()).skip(9) {
            key.fold(&mut last, r).unwrap();
        }
        last
    });
    assert!(key.fold_positions(&rows[1..]).is_err(), "a partial row is refused");
}
