//! `exp` of many f32 at once, for the oracle's softmax: a range reduction by `ln 2` in two parts
//! and a degree-7 polynomial (Cephes' `expf` coefficients), products and sums rounded one by
//! one, no fused multiply-add, so the portable loop and the AVX2 lanes give the same bits.
//! Within 2 ulp of the true value for `x` in `[-87.3, 88.3]`; below that it is 0 (no
//! subnormals), above it `+inf`; NaN stays NaN.

/// Inputs below this give 0 (`e^x` below the smallest normal f32).
const LO: f32 = -87.336_54;
/// Inputs above this give `+inf`.
const HI: f32 = 88.376_26;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` in two parts: the first exact in a few bits, so `n * C1` is exact.
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `e^x`, the portable form of [`exp_in_place`]'s lanes.
pub(crate) fn exp(x: f32) -> f32 {
    if x < LO {
        return 0.0;
    }
    if x > HI {
        return f32::INFINITY;
    }
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1;
    let r = r - n * C2;
    let z = r * r;
    let mut y = P[0];
    for p in &P[1..] {
        y = y * r + p;
    }
    let y = y * z + r + 1.0;
    // `n` lies in -126..=128 here (NaN casts to 0 and stays NaN through `y`): a normal scale
    // or, at 128, one past it; `y` below 2 keeps the product finite below `HI`.
    let scale = f32::from_bits(((n as i32 + 127).clamp(0, 255) as u32) << 23);
    y * scale
}

/// Replaces every value of `v` by its [`exp`], eight at a time where the CPU has AVX2.
pub(crate) fn exp_in_place(v: &mut [f32]) {
    #[allow(unused_mut)] // only the x86_64 path below moves it
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        done = unsafe { avx2::exp_chunks(v) };
    }
    for x in &mut v[done..] {
        *x = exp(*x);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{C1, C2, HI, LO, LOG2E, P};

    /// [`super::exp`] of every whole group of eight values of `v`; returns how many it did.
    #[target_feature(enable = "avx2")]
    pub(super) fn exp_chunks(v: &mut [f32]) -> usize {
        let (chunks, _) = v.as_chunks_mut::<8>();
        for c in chunks.iter_mut() {
            // SAFETY: a chunk holds exactly eight f32; the loads and stores are unaligned.
            let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            let n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _mm256_set1_ps(0.5)));
            let r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(C1)));
            let r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(C2)));
            let z = _mm256_mul_ps(r, r);
            let mut y = _mm256_set1_ps(P[0]);
            for p in &P[1..] {
                y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(*p));
            }
            let y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, z), r), _mm256_set1_ps(1.0));
            // The scale's exponent, clamped as the portable form clamps it (NaN's lanes are
            // NaN through `y`, whatever their scale).
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            let e = _mm256_min_epi32(_mm256_max_epi32(e, _mm256_setzero_si256()), _mm256_set1_epi32(255));
            let out = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)));
            // Below LO: 0; above HI: +inf (both compares false for NaN, which stays).
            let low = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(LO));
            let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HI));
            let out = _mm256_andnot_ps(low, out);
            let out = _mm256_blendv_ps(out, _mm256_set1_ps(f32::INFINITY), high);
            // SAFETY: as the load above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), out) };
        }
        chunks.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<f32> {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut v: Vec<f32> = (0..20_000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 * 200.0 - 110.0
            })
            .collect();
        v.extend([0.0, -0.0, LO, HI, -87.0, 88.0, 1e-8, -1e-8, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -200.0]);
        v
    }

    #[test]
    fn the_lanes_give_the_portable_bits() {
        let x = inputs();
        let mut lanes = x.clone();
        exp_in_place(&mut lanes);
        for (x, l) in x.iter().zip(&lanes) {
            let p = exp(*x);
            assert!(p.to_bits() == l.to_bits() || (p.is_nan() && l.is_nan()), "exp({x}): {p} vs {l}");
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_true_value() {
        for x in inputs() {
            let got = exp(x);
            if x.is_nan() {
                assert!(got.is_nan());
                continue;
            }
            let want = f64::from(x).exp();
            if x < LO {
                assert_eq!(got, 0.0, "exp({x})");
            } else if x > HI {
                assert_eq!(got, f32::INFINITY, "exp({x})");
            } else {
                let ulp = f64::from(f32::from_bits(got.to_bits() + 1) - got);
                assert!((f64::from(got) - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, want {want}");
            }
        }
    }
}
