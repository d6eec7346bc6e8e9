//! Tests of top-channel keys: the byte layout against an independent reading of the bytes, that
//! the kept values are each group's largest, the error bound (property test), names and limits.

use proptest::prelude::*;

use super::{IndexKeyFormat, IndexKeyLayout};
use crate::error::MemoryError;
use crate::fp8::E4M3_TABLE;

fn channels(dim: usize, keep: usize, group: usize) -> IndexKeyLayout {
    IndexKeyLayout::with_format(dim, IndexKeyFormat::Channels { keep, group }).unwrap()
}

#[test]
fn top_channel_key_byte_layout() {
    let l = channels(24, 3, 8);
    assert_eq!(l.row_bytes(), 3 * 3 * 2 + 4);
    let values: Vec<f32> = (0..24).map(|i| ((i * 7) as f32 * 0.61).sin() * (1.0 + (i % 5) as f32)).collect();
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&values, &mut row).unwrap();
    let scale = f32::from_le_bytes(row[18..22].try_into().unwrap());
    assert_eq!(scale.log2().fract(), 0.0, "a power-of-two scale");
    let mut out = vec![0f32; 24];
    l.decode(&row, &mut out).unwrap();
    for g in 0..3 {
        let vals = &values[8 * g..8 * g + 8];
        // The three largest magnitudes of the group, found by counting the larger ones.
        let mut want: Vec<usize> =
            (0..8).filter(|&i| vals.iter().filter(|v| v.abs() > vals[i].abs()).count() < 3).collect();
        want.sort_unstable();
        let places: Vec<usize> = row[3 * g..3 * g + 3].iter().map(|&p| usize::from(p)).collect();
        assert_eq!(places, want, "group {g}'s places");
        for (j, &p) in places.iter().enumerate() {
            let code = row[9 + 3 * g + j];
            assert_eq!(out[8 * g + p], E4M3_TABLE[usize::from(code)] * scale, "group {g} place {p}");
            assert!((out[8 * g + p] - vals[p]).abs() <= vals[p].abs() / 16.0 + 1e-6, "e4m3's half step");
        }
        for i in (0..8).filter(|i| !places.contains(i)) {
            assert_eq!(out[8 * g + i], 0.0, "group {g}: an unkept value reads zero");
        }
    }
}

#[test]
fn top_channel_keys_are_named_and_limited() {
    let parse = |s: &str| s.parse::<IndexKeyFormat>();
    assert_eq!(parse("channels").unwrap(), IndexKeyFormat::Channels { keep: 16, group: 64 });
    assert_eq!(parse("channels:8").unwrap(), IndexKeyFormat::Channels { keep: 8, group: 64 });
    assert_eq!(parse("channels:8:32").unwrap().name(), "channels:8:32");
    for bad in ["channels:", "channels:x", "channels:8:y", "channelsx", "channels8"] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    for (keep, group) in [(0, 8), (9, 8), (4, 0), (2, 3), (4, 512)] {
        let e = IndexKeyLayout::with_format(40, IndexKeyFormat::Channels { keep, group }).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "index_format", .. }), "{keep}/{group}: {e}");
    }
    // SmolLM2's 192-dim keys, 16 of every 64: 3 groups of 16 places and codes, one scale.
    assert_eq!(channels(192, 16, 64).row_bytes(), 100);
    // Bad rows are refused: places out of order or past the group, a bad scale.
    let l = channels(16, 2, 8);
    let mut row = vec![0u8; l.row_bytes()];
    l.encode(&[1.0; 16], &mut row).unwrap();
    l.check_scales(&row).unwrap();
    for (at, v) in [(0usize, 5u8), (1, 8), (8, 0)] {
        let mut bad = row.clone();
        bad[at] = v;
        if at == 8 {
            bad[8..12].copy_from_slice(&(-1f32).to_le_bytes());
        }
        assert!(l.decode(&bad, &mut [0f32; 16]).is_err(), "byte {at} = {v}");
    }
}

proptest! {
    #[test]
    fn a_top_channel_key_keeps_its_largest_values_within_e4m3s_step(
        values in proptest::collection::vec(-100.0f32..100.0, 32),
        keep in 1usize..=8,
    ) {
        let l = channels(32, keep, 8);
        let mut row = vec![0u8; l.row_bytes()];
        l.encode(&values, &mut row).unwrap();
        let mut out = vec![0f32; 32];
        l.decode(&row, &mut out).unwrap();
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        for g in 0..4 {
            let vals = &values[8 * g..8 * g + 8];
            let kept: Vec<usize> = (0..8).filter(|&i| row[keep * g..keep * (g + 1)].contains(&(i as u8))).collect();
            prop_assert_eq!(kept.len(), keep);
            // Every kept magnitude is at least every dropped one's.
            let least_kept = kept.iter().map(|&i| vals[i].abs()).fold(f32::INFINITY, f32::min);
            for i in (0..8).filter(|i| !kept.contains(i)) {
                prop_assert!(vals[i].abs() <= least_kept);
                prop_assert_eq!(out[8 * g + i], 0.0);
            }
            for &i in &kept {
                // e4m3: within a 16th of the value, or its subnormal step below 2^-6 of the scale.
                let err = (out[8 * g + i] - vals[i]).abs();
                prop_assert!(err <= vals[i].abs() / 16.0 + amax / 448.0 / 8.0 + 1e-6, "{} vs {}", out[8 * g + i], vals[i]);
            }
        }
    }
}

proptest! {
    /// The pool-wide check (a branch-free test per row) refuses exactly the pools with a row
    /// `check_scales` refuses, with that first row's error.
    #[test]
    fn a_pools_check_finds_the_first_bad_row(
        values in proptest::collection::vec(-100.0f32..100.0, 4 * 128),
        (keep, group) in prop_oneof![(1usize..=8).prop_map(|k| (k, 8)), Just((16, 64)), Just((32, 64)), Just((5, 64))],
        hits in proptest::collection::vec((0usize..4, 0usize..300, any::<u8>()), 0..3),
    ) {
        // Groups of 8 (every keep) and of 64 (the whole-array tests of 16 and 32 kept, and another).
        let dim = if group == 8 { 32 } else { 128 };
        let l = channels(dim, keep, group);
        let rb = l.row_bytes();
        let mut rows = vec![0u8; 4 * rb];
        for (row, v) in rows.chunks_exact_mut(rb).zip(values.chunks(dim)) {
            l.encode(v, row).unwrap();
        }
        for (r, at, v) in hits {
            rows[r * rb + at % rb] = v;
        }
        let want = rows.chunks_exact(rb).map(|row| l.check_scales(row)).find(|c| c.is_err());
        match (l.check_scales_of_rows(&rows), want) {
            (Ok(()), None) => {}
            (Err(got), Some(Err(want))) => prop_assert_eq!(got.to_string(), want.to_string()),
            (got, want) => prop_assert!(false, "pool {:?}, first bad row {:?}", got, want),
        }
    }
}
