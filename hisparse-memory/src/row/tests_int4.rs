//! Tests of the 4-bit index key: its byte layout against an independent reading of the bytes,
//! its error bound (property test), its limits and bad input.

use proptest::prelude::*;

use super::{IndexKeyFormat, IndexKeyLayout};
use crate::error::MemoryError;

fn int4(dim: usize, group: usize) -> IndexKeyLayout {
    IndexKeyLayout::with_format(dim, IndexKeyFormat::Int4 { group }).unwrap()
}

#[test]
fn int4_key_byte_layout() {
    let l = int4(64, 16);
    assert_eq!(l.row_bytes(), 32 + 4 * 4);
    let values: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.913).sin() * (1.0 + i as f32 / 9.0)).collect();
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&values, &mut row).unwrap();
    let mut out = vec![0f32; 64];
    l.decode(&row, &mut out).unwrap();
    for g in 0..4 {
        let vals = &values[16 * g..16 * (g + 1)];
        let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = f32::from_le_bytes(row[32 + 4 * g..36 + 4 * g].try_into().unwrap());
        assert_eq!(s, amax / 7.0, "group {g}'s scale");
        for j in 0..16 {
            let i = 16 * g + j;
            // The nibble read independently: even values low, odd values high.
            let c = if i % 2 == 0 { row[i / 2] & 0xf } else { row[i / 2] >> 4 };
            assert!((1..=15).contains(&c), "value {i}: code {c}");
            assert_eq!(out[i], (f32::from(c) - 8.0) * s, "value {i}");
            assert_eq!(f32::from(c) - 8.0, (values[i] / s).round(), "value {i}: nearest code");
        }
    }
    // The group's largest magnitude decodes to within rounding of itself.
    let i = (0..16).max_by(|&a, &b| values[a].abs().total_cmp(&values[b].abs())).unwrap();
    assert!((out[i] - values[i]).abs() <= values[i].abs() * 1e-6);
}

#[test]
fn an_all_zero_group_keeps_zeros_with_unit_scale() {
    let l = int4(32, 16);
    let mut values = vec![0f32; 32];
    values[20] = -3.5;
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&values, &mut row).unwrap();
    assert_eq!(f32::from_le_bytes(row[16..20].try_into().unwrap()), 1.0);
    let mut out = vec![1f32; 32];
    l.decode(&row, &mut out).unwrap();
    assert!(out[..16].iter().all(|&v| v == 0.0));
    assert_eq!(out[20], -3.5);
    // A subnormal largest value, whose step underflows to zero: still a key decode accepts.
    let mut tiny = vec![0f32; 32];
    tiny[3] = f32::from_bits(1);
    l.encode(&tiny, &mut row).unwrap();
    l.decode(&row, &mut out).unwrap();
    assert!(out.iter().all(|&v| v == 0.0));
}

#[test]
fn int4_limits_and_bad_input_are_named() {
    for (dim, group) in [(64, 0), (64, 3), (64, 24), (30, 4)] {
        let e = IndexKeyLayout::with_format(dim, IndexKeyFormat::Int4 { group }).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "index_format", .. }), "{dim}/{group}: {e}");
    }
    for bad in ["int4:", "int4:x", "int8", "fp8:2", ""] {
        let e = bad.parse::<IndexKeyFormat>().unwrap_err();
        assert!(e.to_string().contains("index_format"), "{bad}: {e}");
    }
    assert_eq!("int4".parse::<IndexKeyFormat>().unwrap(), IndexKeyFormat::Int4 { group: 32 });
    assert_eq!("fp8".parse::<IndexKeyFormat>().unwrap(), IndexKeyFormat::Fp8);
    let l = int4(32, 16);
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&[0.5; 32], &mut row).unwrap();
    // A group's scale set to NaN, then to zero: refused naming the group.
    for s in [f32::NAN, 0.0] {
        row[20..24].copy_from_slice(&s.to_le_bytes());
        let e = l.decode(&row, &mut [0f32; 32]).unwrap_err();
        assert!(matches!(e, MemoryError::BadScale { index: 1, .. }), "{e}");
    }
    assert!(l.encode(&[f32::INFINITY; 32], &mut row).is_err());
    assert!(l.scale(&row).is_err(), "an int4 key has no single scale");
}

proptest! {
    #[test]
    fn int4_round_trip_is_within_half_a_step(values in prop::collection::vec(-1e4f32..1e4, 64), group in prop::sample::select(vec![2usize, 8, 16, 32, 64])) {
        let l = int4(64, group);
        let mut row = vec![0u8; l.row_bytes()];
        l.encode(&values, &mut row).unwrap();
        let mut out = vec![0f32; 64];
        l.decode(&row, &mut out).unwrap();
        for (g, (vals, outs)) in values.chunks(group).zip(out.chunks(group)).enumerate() {
            let amax = vals.iter().fold(0f32, |m, v| m.max(v.abs()));
            let step = if amax > 0.0 { amax / 7.0 } else { 1.0 };
            for (v, o) in vals.iter().zip(outs) {
                prop_assert!((v - o).abs() <= step * 0.5001, "group {}: {} -> {} (step {})", g, v, o, step);
            }
        }
    }
}
