//! Tests of the 2-bit index key: its byte layout against an independent reading of the bytes,
//! its error bound (property test), its limits and bad input.

use proptest::prelude::*;

use super::{IndexKeyFormat, IndexKeyLayout};
use crate::error::MemoryError;

fn int2(dim: usize, group: usize) -> IndexKeyLayout {
    IndexKeyLayout::with_format(dim, IndexKeyFormat::Int2 { group }).unwrap()
}

#[test]
fn int2_key_byte_layout() {
    let l = int2(64, 16);
    assert_eq!(l.row_bytes(), 16 + 4 * 4);
    let values: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.913).sin() * (1.0 + i as f32 / 9.0)).collect();
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&values, &mut row).unwrap();
    let mut out = vec![0f32; 64];
    l.decode(&row, &mut out).unwrap();
    let levels = [-1.5f32, -0.5, 0.5, 1.5];
    for g in 0..4 {
        let vals = &values[16 * g..16 * (g + 1)];
        let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = f32::from_le_bytes(row[16 + 4 * g..20 + 4 * g].try_into().unwrap());
        assert_eq!(s, amax / 1.5, "group {g}'s scale");
        for j in 0..16 {
            let i = 16 * g + j;
            // The two bits read independently: value 4k + m in bits 2m and 2m + 1 of byte k.
            let c = (row[i / 4] >> (2 * (i % 4))) & 3;
            assert_eq!(out[i], levels[usize::from(c)] * s, "value {i}");
            // The nearest level (the levels are a step apart: never further than half a step).
            let nearest = levels.iter().map(|l| (l - values[i] / s).abs()).fold(f32::MAX, f32::min);
            assert!((levels[usize::from(c)] - values[i] / s).abs() <= nearest + 1e-6, "value {i}: code {c}");
        }
    }
    // The group's largest magnitude decodes to its own level, 1.5 steps.
    let i = (0..16).max_by(|&a, &b| values[a].abs().total_cmp(&values[b].abs())).unwrap();
    assert!((out[i] - values[i]).abs() <= values[i].abs() * 1e-6);
}

#[test]
fn an_all_zero_group_decodes_to_almost_zero() {
    let l = int2(32, 16);
    let mut values = vec![0f32; 32];
    values[20] = -3.0;
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&values, &mut row).unwrap();
    assert_eq!(f32::from_le_bytes(row[8..12].try_into().unwrap()), f32::MIN_POSITIVE);
    let mut out = vec![1f32; 32];
    l.decode(&row, &mut out).unwrap();
    assert!(out[..16].iter().all(|&v| v.abs() <= f32::MIN_POSITIVE), "{:?}", &out[..16]);
    assert_eq!(out[20], -3.0);
    // A subnormal largest value, whose step underflows to zero: still a key decode accepts.
    let mut tiny = vec![0f32; 32];
    tiny[3] = f32::from_bits(1);
    l.encode(&tiny, &mut row).unwrap();
    l.decode(&row, &mut out).unwrap();
    assert!(out.iter().all(|&v| v.abs() <= f32::MIN_POSITIVE));
}

#[test]
fn int2_limits_and_bad_input_are_named() {
    for (dim, group) in [(64, 0), (64, 2), (64, 6), (30, 4), (64, 24)] {
        let e = IndexKeyLayout::with_format(dim, IndexKeyFormat::Int2 { group }).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "index_format", .. }), "{dim}/{group}: {e}");
    }
    for bad in ["int2:", "int2:x", "int3", "int2:4:4"] {
        let e = bad.parse::<IndexKeyFormat>().unwrap_err();
        assert!(e.to_string().contains("index_format"), "{bad}: {e}");
    }
    assert_eq!("int2".parse::<IndexKeyFormat>().unwrap(), IndexKeyFormat::Int2 { group: 32 });
    assert_eq!("int2:8".parse::<IndexKeyFormat>().unwrap().to_string(), "int2:8");
    let l = int2(32, 16);
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&[0.5; 32], &mut row).unwrap();
    for s in [f32::NAN, 0.0] {
        row[12..16].copy_from_slice(&s.to_le_bytes());
        let e = l.decode(&row, &mut [0f32; 32]).unwrap_err();
        assert!(matches!(e, MemoryError::BadScale { index: 1, .. }), "{e}");
    }
    assert!(l.encode(&[f32::NAN; 32], &mut row).is_err());
    assert!(l.scale(&row).is_err(), "an int2 key has no single scale");
}

proptest! {
    #[test]
    fn int2_round_trip_is_within_half_a_step(values in prop::collection::vec(-1e4f32..1e4, 64), group in prop::sample::select(vec![4usize, 8, 16, 32, 64])) {
        let l = int2(64, group);
        let mut row = vec![0u8; l.row_bytes()];
        l.encode(&values, &mut row).unwrap();
        let mut out = vec![0f32; 64];
        l.decode(&row, &mut out).unwrap();
        for (g, (vals, outs)) in values.chunks(group).zip(out.chunks(group)).enumerate() {
            let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = if amax > 0.0 { amax / 1.5 } else { f32::MIN_POSITIVE };
            for (v, o) in vals.iter().zip(outs) {
                prop_assert!((v - o).abs() <= step * 0.5001, "group {}: {} -> {} (step {})", g, v, o, step);
            }
        }
    }
}
