//! Tests of the row codecs: byte layouts, round-trip error bounds (property tests), bad input.

use proptest::prelude::*;

use super::*;
use crate::fp8::decode_e4m3;

fn fp8() -> KvRowLayout {
    KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap()
}

fn bf16_layout() -> KvRowLayout {
    KvRowLayout::new(KvRowFormat::Bf16, 512, 64).unwrap()
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i as f32) * 0.731).sin() * (1.0 + i as f32 / 50.0)).collect()
}

#[test]
fn fp8_row_byte_layout() {
    let l = fp8();
    assert_eq!((l.row_bytes(), l.scales_offset(), l.bf16_offset()), (656, Some(512), 528));
    let values = ramp(576);
    let mut row = vec![0u8; 656];
    l.encode(&values, &mut row).unwrap();
    for b in 0..4 {
        let block = &values[b * 128..(b + 1) * 128];
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = f32::from_le_bytes(row[512 + 4 * b..516 + 4 * b].try_into().unwrap());
        // Power of two, and the smallest one that keeps amax / s within 448.
        assert_eq!(s.log2().fract(), 0.0, "scale {s}");
        assert!(amax / s <= 448.0 && amax / (s / 2.0) > 448.0, "block {b}: amax {amax}, s {s}");
        // Byte i of the block is value i / s in e4m3.
        for i in 0..128 {
            assert_eq!(row[b * 128 + i], crate::fp8::encode_e4m3(block[i] / s));
        }
    }
    // Rope: bf16 little-endian at 528.
    for i in 0..64 {
        let bits = u16::from_le_bytes([row[528 + 2 * i], row[529 + 2 * i]]);
        assert_eq!(bits, half::bf16::from_f32(values[512 + i]).to_bits());
    }
}

#[test]
fn bf16_row_byte_layout() {
    let l = bf16_layout();
    assert_eq!((l.row_bytes(), l.scales_offset(), l.bf16_offset()), (1152, None, 1024));
    let values = ramp(576);
    let mut row = vec![0u8; 1152];
    l.encode(&values, &mut row).unwrap();
    for (i, v) in values.iter().enumerate() {
        let bits = u16::from_le_bytes([row[2 * i], row[2 * i + 1]]);
        assert_eq!(bits, half::bf16::from_f32(*v).to_bits(), "value {i}");
    }
}

/// Fixed vectors, worked out by hand from the e4m3 format (sign, 4 exponent bits of bias 7, 3
/// mantissa bits; subnormals `m * 2^-9`; round to nearest, ties to even) and the scale rule
/// (the smallest power of two with `amax / s <= 448`), not from the code under test.
#[test]
fn index_key_byte_layout() {
    let k = IndexKeyLayout::new(8).unwrap();
    assert_eq!(k.row_bytes(), 12);
    let cases: [([f32; 8], [u8; 12], [f32; 8]); 2] = [
        (
            // amax 448: scale 1. 448 = 1.75 * 2^8 -> 0 1111 110; 1 -> 0 0111 000; 0.5 -> 0 0110 000;
            // 2^-9 is the smallest subnormal (0x01); 3 = 1.5 * 2 -> 0 1000 100; -2 -> 1 1000 000.
            [448.0, -448.0, 1.0, 0.5, 0.0, 0.001_953_125, 3.0, -2.0],
            [0x7E, 0xFE, 0x38, 0x30, 0x00, 0x01, 0x44, 0xC0, 0x00, 0x00, 0x80, 0x3F],
            [448.0, -448.0, 1.0, 0.5, 0.0, 0.001_953_125, 3.0, -2.0],
        ),
        (
            // amax 1000: scale 4 (1000/2 = 500 is over 448). 250 lies between 240 and 256: 256
            // (0 1111 000); 62.5 between 60 and 64: 64 (0 1101 000); -0.25 -> 1 0101 000;
            // 0.00075 is under half the smallest subnormal: 0; 1.75 -> 0 0111 110.
            [1000.0, 250.0, -1.0, 0.003, 0.0, 0.0, 0.0, 7.0],
            [0x78, 0x68, 0xA8, 0x00, 0x00, 0x00, 0x00, 0x3E, 0x00, 0x00, 0x80, 0x40],
            [1024.0, 256.0, -1.0, 0.0, 0.0, 0.0, 0.0, 7.0],
        ),
    ];
    for (values, bytes, decoded) in cases {
        let mut row = [0u8; 12];
        k.encode(&values, &mut row).unwrap();
        assert_eq!(row, bytes, "{values:?}");
        let mut out = [0f32; 8];
        k.decode(&row, &mut out).unwrap();
        assert_eq!(out, decoded);
    }
    // The 128-dim key of the presets: codes first, the scale at byte 128.
    let k = IndexKeyLayout::new(128).unwrap();
    let mut values = vec![0f32; 128];
    values[5] = -448.0;
    values[127] = 1.0;
    let mut row = vec![0u8; 132];
    k.encode(&values, &mut row).unwrap();
    assert_eq!((row[5], row[127], &row[128..]), (0xFE, 0x38, &[0x00, 0x00, 0x80, 0x3F][..]));
    assert_eq!(decode_e4m3(0x38), 1.0);
}

#[test]
fn zero_block_encodes_to_zero_with_unit_scale() {
    let l = fp8();
    let mut values = ramp(576);
    values[128..256].iter_mut().for_each(|v| *v = 0.0);
    let mut row = vec![0u8; 656];
    l.encode(&values, &mut row).unwrap();
    assert!(row[128..256].iter().all(|&b| b == 0));
    assert_eq!(f32::from_le_bytes(row[516..520].try_into().unwrap()), 1.0);
}

#[test]
fn bad_input_is_named() {
    let l = fp8();
    let mut row = vec![0u8; 656];
    let e = l.encode(&ramp(575), &mut row).unwrap_err();
    assert_eq!(e, MemoryError::LengthMismatch { field: "values", expected: 576, actual: 575 });
    let e = l.encode(&ramp(576), &mut row[..600]).unwrap_err();
    assert_eq!(e, MemoryError::LengthMismatch { field: "row", expected: 656, actual: 600 });
    let mut v = ramp(576);
    v[77] = f32::NAN;
    let e = l.encode(&v, &mut row).unwrap_err();
    assert!(matches!(e, MemoryError::NonFinite { field: "values", index: 77, .. }), "{e}");
    // Non-finite and non-positive scales are refused on decode.
    l.encode(&ramp(576), &mut row).unwrap();
    let mut out = vec![0f32; 576];
    for bad in [f32::INFINITY, f32::NAN, 0.0, -2.0] {
        let mut r = row.clone();
        r[516..520].copy_from_slice(&bad.to_le_bytes());
        let e = l.decode(&r, &mut out).unwrap_err();
        assert!(matches!(e, MemoryError::BadScale { field: "kv_row", index: 1, .. }), "{e}");
    }
    let k = IndexKeyLayout::new(128).unwrap();
    let mut key = vec![0u8; 132];
    k.encode(&ramp(128), &mut key).unwrap();
    key[128..].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
    assert!(matches!(k.scale(&key), Err(MemoryError::BadScale { field: "index_key", .. })));
    assert!(matches!(IndexKeyLayout::new(0), Err(MemoryError::InvalidField { field: "index_dim", .. })));
    assert!("fp16".parse::<KvRowFormat>().is_err());
}

fn row_values() -> impl Strategy<Value = Vec<f32>> {
    // Blocks of very different magnitudes, including tiny and huge ones, and exact zeros.
    (
        prop::collection::vec(-1.0f32..1.0, 576),
        prop::collection::vec(-20i32..20, 5),
        prop::collection::vec(0usize..576, 0..8),
    )
        .prop_map(|(mut v, exps, zeros)| {
            for (i, x) in v.iter_mut().enumerate() {
                let block = if i < 512 { i / 128 } else { 4 };
                *x *= 2f32.powi(exps[block]);
            }
            for z in zeros {
                v[z] = 0.0;
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_within_the_stated_error(values in row_values()) {
        for layout in [fp8(), bf16_layout()] {
            let mut row = vec![0u8; layout.row_bytes()];
            layout.encode(&values, &mut row).unwrap();
            let mut back = vec![0f32; 576];
            layout.decode(&row, &mut back).unwrap();
            for (i, (&x, &y)) in values.iter().zip(&back).enumerate() {
                let block = if i < 512 { &values[i / 128 * 128..i / 128 * 128 + 128] } else { &values[512..] };
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let bound = layout.error_bound(x, amax, i >= 512);
                prop_assert!((x - y).abs() <= bound, "{:?} value {}: {} -> {} (bound {})", layout.format(), i, x, y, bound);
            }
            // Decoded values survive another round trip unchanged (the bytes may differ: a block
            // whose largest value became exactly 448 * 2^-n may take the next smaller scale).
            let mut row2 = vec![0u8; layout.row_bytes()];
            layout.encode(&back, &mut row2).unwrap();
            let mut back2 = vec![0f32; 576];
            layout.decode(&row2, &mut back2).unwrap();
            prop_assert_eq!(back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), back2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn index_key_round_trip(values in prop::collection::vec(-1.0e3f32..1.0e3, 128)) {
        let k = IndexKeyLayout::new(128).unwrap();
        let mut row = vec![0u8; 132];
        k.encode(&values, &mut row).unwrap();
        let mut back = vec![0f32; 128];
        k.decode(&row, &mut back).unwrap();
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = k.scale(&row).unwrap();
        prop_assert!(amax / s <= 448.0);
        for (&x, &y) in values.iter().zip(&back) {
            prop_assert!((x - y).abs() <= (x.abs() / 16.0).max(s * 2f32.powi(-10)), "{} -> {}", x, y);
        }
    }
}

#[test]
fn a_block_at_exactly_448_times_a_power_of_two_keeps_its_values() {
    // Found by proptest: one value whose block's amax sits just above 448 * 2^-9 is quantised
    // to 224 * 2^-8; re-encoding takes the scale 2^-9 (code 448): new bytes, same values.
    let l = fp8();
    let mut v = vec![0f32; 576];
    v[300] = -0.8751;
    let mut row = vec![0u8; 656];
    l.encode(&v, &mut row).unwrap();
    let mut back = vec![0f32; 576];
    l.decode(&row, &mut back).unwrap();
    assert_eq!(back[300], -0.875);
    let mut row2 = vec![0u8; 656];
    l.encode(&back, &mut row2).unwrap();
    assert_ne!(row, row2, "the scale changed");
    let mut back2 = vec![0f32; 576];
    l.decode(&row2, &mut back2).unwrap();
    assert_eq!(back, back2);
}

/// A GQA row is named in its own terms: every value blocked (fp8), none kept bf16 after them,
/// no MLA dims; a format that cannot hold its values is refused naming `head_dim`.
#[test]
fn gqa_rows_are_blocked_values_named_by_their_heads() {
    let l = KvRowLayout::gqa(KvRowFormat::Fp8, 8, 128).unwrap();
    assert_eq!((l.blocked_dims(), l.bf16_dims(), l.row_dims(), l.mla_dims()), (2048, 0, 2048, None));
    assert_eq!((l.row_bytes(), l.scales_offset(), l.bf16_offset()), (2048 + 4 * 16, Some(2048), 2048 + 64));
    assert_eq!(fp8().mla_dims(), Some((512, 64)));
    let values = ramp(2048);
    let (mut row, mut back) = (vec![0u8; l.row_bytes()], vec![0f32; 2048]);
    l.encode(&values, &mut row).unwrap();
    l.decode(&row, &mut back).unwrap();
    let amax = |i: usize| values[i / 128 * 128..][..128].iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (v, b)) in values.iter().zip(&back).enumerate() {
        assert!((v - b).abs() <= l.error_bound(*v, amax(i), false), "value {i}: {v} against {b}");
    }
    let e = KvRowLayout::gqa(KvRowFormat::Fp8, 3, 32).unwrap_err(); // 192 values
    assert!(matches!(e, MemoryError::InvalidField { field: "head_dim", .. }), "{e}");
    assert!(KvRowLayout::gqa(KvRowFormat::Bf16, 3, 64).is_ok());
}

proptest! {
    /// Any piece of a row decodes to the same bits as that piece of the whole row's decoding,
    /// for MLA and GQA rows in both formats.
    #[test]
    fn a_rows_piece_decodes_as_the_whole_row_does(seed in 0u32..1000, start in 0usize..700, len in 0usize..700) {
        for layout in [fp8(), bf16_layout(), KvRowLayout::gqa(KvRowFormat::Fp8, 2, 64).unwrap(), KvRowLayout::gqa(KvRowFormat::Bf16, 3, 64).unwrap()] {
            let n = layout.row_dims();
            let values: Vec<f32> = (0..n).map(|i| ((i as f32 + seed as f32) * 0.731).sin() * (1.0 + (i % 130) as f32)).collect();
            let mut row = vec![0u8; layout.row_bytes()];
            layout.encode(&values, &mut row).unwrap();
            let mut whole = vec![0f32; n];
            layout.decode(&row, &mut whole).unwrap();
            let mut piece = vec![0f32; len];
            let got = layout.decode_range_checked(&row, start, &mut piece);
            if start + len > n {
                prop_assert!(got.is_err());
                continue;
            }
            got.unwrap();
            let same = piece.iter().zip(&whole[start..start + len]).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{layout:?} {start}+{len}");
        }
    }
}
