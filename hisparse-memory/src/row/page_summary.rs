//! Page summaries (Quest, ICML 2024): one index row per `tokens` consecutive positions holding
//! the element-wise minimum and maximum of their keys, as bf16 rounded outward (the minimum
//! down, the maximum up), so that the box always contains every key it summarises. A query's
//! score of a page is the upper bound of `q . k` over the box, [`upper_bound`].
//!
//! A row is `[0, 2 * dim)` the minima, `[2 * dim, 4 * dim)` the maxima, bf16 little-endian. One
//! key encodes as a box of one point ([`encode`]); boxes merge by [`fold`], so the summary of a
//! page is the fold of its keys' boxes in any order (outward rounding is monotonic: the
//! rounded minimum of two values is the minimum of their rounded values).

use half::bf16;

use crate::error::{MemoryError, Result};

/// Bytes of one summary of `dim`-value keys.
pub(super) fn row_bytes(dim: usize) -> usize {
    4 * dim
}

/// The largest bf16 at most `v` (`v` finite; `-inf` below bf16's range).
fn round_down(v: f32) -> bf16 {
    let b = bf16::from_f32(v);
    if b.to_f32() <= v { b } else { step(b, false) }
}

/// The smallest bf16 at least `v` (`v` finite; `+inf` above bf16's range).
fn round_up(v: f32) -> bf16 {
    let b = bf16::from_f32(v);
    if b.to_f32() >= v { b } else { step(b, true) }
}

/// The next bf16 after finite-or-infinite `b` towards `+inf` (`up`) or `-inf`.
fn step(b: bf16, up: bool) -> bf16 {
    let bits = b.to_bits();
    let negative = bits & 0x8000 != 0;
    if bits & 0x7fff == 0 {
        // ±0: the smallest subnormal of the direction's sign.
        return bf16::from_bits(if up { 0x0001 } else { 0x8001 });
    }
    // Away from zero adds one to the magnitude's bits, towards zero takes one.
    bf16::from_bits(if up != negative { bits + 1 } else { bits - 1 })
}

fn read(row: &[u8], i: usize) -> f32 {
    bf16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32()
}

fn put(row: &mut [u8], i: usize, v: bf16) {
    row[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
}

/// Writes the box of one key (`values`, finite) into `row` (`row_bytes(values.len())`).
pub(super) fn encode(values: &[f32], row: &mut [u8]) {
    let dim = values.len();
    for (i, &v) in values.iter().enumerate() {
        put(row, i, round_down(v));
        put(row, dim + i, round_up(v));
    }
}

/// Widens box `into` to hold box `from` (both rows of `dim`-value keys).
pub(super) fn fold(dim: usize, into: &mut [u8], from: &[u8]) {
    for i in 0..dim {
        if read(from, i) < read(into, i) {
            into[2 * i..2 * i + 2].copy_from_slice(&from[2 * i..2 * i + 2]);
        }
        let j = dim + i;
        if read(from, j) > read(into, j) {
            into[2 * j..2 * j + 2].copy_from_slice(&from[2 * j..2 * j + 2]);
        }
    }
}

/// Checks that every bound of `row` is a number and each minimum is at most its maximum.
pub(super) fn check(dim: usize, row: &[u8]) -> Result<()> {
    for i in 0..dim {
        let (lo, hi) = (read(row, i), read(row, dim + i));
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(MemoryError::invalid(
                "page_summary",
                format!("[{lo}, {hi}]"),
                format!("value {i}: a page's bounds must be numbers, the minimum at most the maximum"),
            ));
        }
    }
    Ok(())
}

/// The box of a checked `row` as f32: `mins` and `maxs` hold `dim` values each.
pub(super) fn bounds(row: &[u8], mins: &mut [f32], maxs: &mut [f32]) {
    let dim = mins.len();
    for i in 0..dim {
        mins[i] = read(row, i);
        maxs[i] = read(row, dim + i);
    }
}

/// The largest `q . k` over the box `[mins, maxs]`: `sum_i q_i * (q_i > 0 ? max_i : min_i)`,
/// in index order (a zero `q_i` adds nothing, whatever its bounds).
pub fn upper_bound(q: &[f32], mins: &[f32], maxs: &[f32]) -> f32 {
    let mut s = 0f32;
    for ((&x, &lo), &hi) in q.iter().zip(mins).zip(maxs) {
        // Selects, not branches: the loop vectorises.
        let corner = if x > 0.0 { hi } else { lo };
        s += if x != 0.0 { x * corner } else { 0.0 };
    }
    s
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn outward_rounding_brackets_the_value() {
        for v in [0.0f32, -0.0, 1.0, -1.0, 0.1, -0.1, 1e-40, -1e-40, 3.3e38, -3.3e38, f32::MAX, f32::MIN] {
            let (lo, hi) = (round_down(v).to_f32(), round_up(v).to_f32());
            assert!(lo <= v && v <= hi, "{v}: [{lo}, {hi}]");
            // Adjacent or equal: no bf16 lies strictly between them and v on either side.
            assert!(lo == hi || step(round_down(v), true).to_f32() >= v, "{v}");
        }
        assert_eq!(round_up(f32::MAX).to_f32(), f32::INFINITY);
        assert_eq!(round_down(0.1).to_f32(), 0.099_609_375);
        assert_eq!(round_up(0.1).to_f32(), 0.100_097_656);
    }

    proptest! {
        #[test]
        fn a_folded_box_holds_every_key_and_bounds_every_product(
            keys in proptest::collection::vec(proptest::collection::vec(-4.0f32..4.0, 6), 1..20),
            q in proptest::collection::vec(-2.0f32..2.0, 6),
        ) {
            let mut sum = vec![0u8; row_bytes(6)];
            encode(&keys[0], &mut sum);
            let mut one = vec![0u8; row_bytes(6)];
            for k in &keys[1..] {
                encode(k, &mut one);
                fold(6, &mut sum, &one);
            }
            check(6, &sum).unwrap();
            let (mut lo, mut hi) = (vec![0f32; 6], vec![0f32; 6]);
            bounds(&sum, &mut lo, &mut hi);
            for k in &keys {
                for i in 0..6 {
                    prop_assert!(lo[i] <= k[i] && k[i] <= hi[i]);
                }
                let dot: f64 = q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                let ub: f64 = (0..6).map(|i| f64::from(q[i]) * f64::from(if q[i] > 0.0 { hi[i] } else { lo[i] })).sum();
                prop_assert!(ub >= dot - 1e-9);
            }
            // The bound is the box's largest product: attained at its corner.
            let corner: Vec<f32> = (0..6).map(|i| if q[i] > 0.0 { hi[i] } else { lo[i] }).collect();
            let at: f32 = q.iter().zip(&corner).fold(0f32, |s, (a, b)| s + if *a != 0.0 { a * b } else { 0.0 });
            prop_assert_eq!(upper_bound(&q, &lo, &hi), at);
            // Folding in another order gives the same box, bit for bit.
            let mut rev = vec![0u8; row_bytes(6)];
            encode(keys.last().unwrap(), &mut rev);
            for k in keys.iter().rev().skip(1) {
                encode(k, &mut one);
                fold(6, &mut rev, &one);
            }
            prop_assert_eq!(rev, sum);
        }
    }

    #[test]
    fn a_box_upside_down_is_refused() {
        let mut row = vec![0u8; row_bytes(2)];
        encode(&[1.0, 2.0], &mut row);
        check(2, &row).unwrap();
        put(&mut row, 1, bf16::from_f32(3.0));
        let e = check(2, &row).unwrap_err().to_string();
        assert!(e.contains("page_summary") && e.contains("value 1"), "{e}");
    }
}
