//! The fp8 e4m3 scalar codec, bit-exact with CUDA's `__nv_fp8_e4m3(float)` constructor.
//!
//! Encoding uses the [`float8`] crate (a port of CUDA's host reference conversion) with CUDA's
//! saturating semantics (`__NV_SATFINITE`): round to nearest, ties to even; every finite value
//! above 448 in magnitude, and ±infinity, becomes ±448; values of magnitude at most 2^-10 become
//! ±0; NaN becomes the canonical NaN `0x7f` (CUDA canonicalises the sign of a float NaN away;
//! `float8` alone would keep it). Decoding is exact: every e4m3 value is an f32.

use float8::F8E4M3;

/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The canonical NaN byte that CUDA produces for any NaN input.
pub const E4M3_NAN: u8 = 0x7f;

/// Encodes one f32 as e4m3, exactly as CUDA's `__nv_fp8_e4m3(float)` does (bit manipulation;
/// the tests hold it to [`F8E4M3::from_f32`] and to an independent nearest-value oracle).
#[inline]
pub fn encode_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return E4M3_NAN;
    }
    if a >= 0x43e0_0000 {
        // |x| >= 448 (infinity included): saturate.
        return sign | 0x7e;
    }
    if a < 0x3c80_0000 {
        // |x| < 2^-6: subnormal codes, steps of 2^-9; |x| * 2^9 < 8 is exact, and adding and
        // removing 2^23 rounds it to an integer, ties to even.
        let m = f32::from_bits(a) * 512.0;
        let q = (m + 8_388_608.0) - 8_388_608.0;
        return sign | q as u8;
    }
    // Normal: round the 23-bit mantissa to 3 bits, ties to even (a carry moves the exponent up),
    // then rebias the exponent from 127 to 7.
    let r = (a + 0x7_ffff + ((a >> 20) & 1)) >> 20;
    let code = r - (120 << 3);
    sign | code.min(0x7e) as u8
}

/// Decodes one e4m3 byte to f32 (exact; `0x7f`/`0xff` decode to NaN).
#[inline]
pub fn decode_e4m3(b: u8) -> f32 {
    E4M3_TABLE[usize::from(b)]
}

/// Decodes e4m3 `codes` times `scale` into `out` (as many as the shorter holds):
/// `E4M3_TABLE[c] * scale` for every code, the same bits, eight at a time with AVX2 and F16C
/// where the CPU has them (an e4m3 byte's exponent and mantissa, moved into an f16's, convert in
/// hardware; `* 256` restores the bias, exactly; the NaN codes are put back from the table).
pub fn decode_e4m3_scaled(codes: &[u8], scale: f32, out: &mut [f32]) {
    let n = codes.len().min(out.len());
    #[allow(unused_mut)] // only the x86_64 path below moves it
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C (checked just above).
        done = unsafe { decode_e4m3_scaled_f16c(&codes[..n], scale, &mut out[..n]) };
    }
    for (o, &c) in out[done..n].iter_mut().zip(&codes[done..n]) {
        *o = E4M3_TABLE[usize::from(c)] * scale;
    }
}

/// [`decode_e4m3_scaled`] of whole groups of eight codes; returns how many it decoded.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn decode_e4m3_scaled_f16c(codes: &[u8], scale: f32, out: &mut [f32]) -> usize {
    let mut done = 0;
    for (c, o) in codes.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // `c` holds exactly eight bytes (chunks_exact).
        let c = [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
        // SAFETY: this function runs only where the CPU has AVX2 and F16C.
        let v = unsafe { e4m3x8_scaled(c, scale) };
        // SAFETY: `o` holds exactly eight f32 (chunks_exact_mut); the store is unaligned.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr(), v) };
        done += 8;
    }
    done
}

/// Eight e4m3 codes times `scale` in one AVX register, lane `i` the bits of
/// `E4M3_TABLE[codes[i]] * scale` ([`decode_e4m3_scaled`]'s conversion, for kernels that use
/// the values where they are).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub unsafe fn e4m3x8_scaled(codes: [u8; 8], scale: f32) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let (low7, sign) = (_mm_set1_epi16(0x7f), _mm_set1_epi16(0x80));
    let wide = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(codes)));
    let mag = _mm_and_si128(wide, low7);
    let half = _mm_or_si128(_mm_slli_epi16::<7>(mag), _mm_slli_epi16::<8>(_mm_and_si128(wide, sign)));
    let s = _mm256_set1_ps(scale);
    let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0)), s);
    // NaN codes (0x7f, 0xff): lanes of all ones where the low seven bits are all set.
    let nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, low7)));
    let negative = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(_mm_and_si128(wide, sign), sign)));
    let nans =
        _mm256_blendv_ps(_mm256_set1_ps(E4M3_TABLE[0x7f] * scale), _mm256_set1_ps(E4M3_TABLE[0xff] * scale), negative);
    _mm256_blendv_ps(v, nans, nan)
}

/// All 256 e4m3 values as f32, indexed by the byte.
pub static E4M3_TABLE: [f32; 256] = build_table();

const fn build_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = F8E4M3::from_bits(i as u8).to_f32();
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_decoding_is_the_tables_bits() {
        let codes: Vec<u8> = (0..=255u8).chain([0x7f, 0x00, 0x80, 0xff, 0x01, 0x81, 0x7e]).collect();
        for scale in [1.0f32, 0.75, 2f32.powi(-10), 3.0e37, 1.0e-40, 6.5e-3] {
            // Every length up to the codes' (the vector part and the tail both).
            for n in [0, 1, 7, 8, 9, 100, codes.len()] {
                let mut got = vec![0f32; n];
                decode_e4m3_scaled(&codes[..n], scale, &mut got);
                for (i, (g, &c)) in got.iter().zip(&codes).enumerate() {
                    let want = E4M3_TABLE[usize::from(c)] * scale;
                    assert_eq!(g.to_bits(), want.to_bits(), "code {c:#04x} at {i}, scale {scale}, n {n}");
                }
            }
        }
    }

    /// Independent oracle: nearest e4m3 value by f64 distance, ties to the even code, saturating.
    fn oracle(x: f32) -> u8 {
        if x.is_nan() {
            return E4M3_NAN;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let ax = f64::from(x.abs());
        if ax > 448.0 {
            return sign | 0x7e;
        }
        let mut best = 0u8;
        let mut best_d = f64::INFINITY;
        for code in 0u8..0x7f {
            let v = f64::from(F8E4M3::from_bits(code).to_f32());
            let d = (v - ax).abs();
            if d < best_d || (d == best_d && code % 2 == 0) {
                best = code;
                best_d = d;
            }
        }
        sign | best
    }

    #[test]
    fn the_bit_encoder_equals_the_float8_reference_on_a_dense_sweep() {
        let reference = |x: f32| if x.is_nan() { E4M3_NAN } else { F8E4M3::from_f32(x).to_bits() };
        // Every 97th f32 bit pattern of both signs, plus neighbours of every e4m3 midpoint.
        for hi in (0u32..0x8000_0000).step_by(97) {
            for x in [f32::from_bits(hi), f32::from_bits(hi | 0x8000_0000)] {
                assert_eq!(encode_e4m3(x), reference(x), "{x:e} ({:#x})", x.to_bits());
            }
        }
        for c in 0u8..0x7e {
            let mid = (f64::from(E4M3_TABLE[usize::from(c)]) + f64::from(E4M3_TABLE[usize::from(c) + 1])) / 2.0;
            let m = mid as f32;
            for x in [m, f32::from_bits(m.to_bits() + 1), f32::from_bits(m.to_bits() - 1), -m] {
                assert_eq!(encode_e4m3(x), reference(x), "{x:e}");
            }
        }
    }

    #[test]
    fn saturates_at_448() {
        assert_eq!(encode_e4m3(448.0), 0x7e);
        assert_eq!(encode_e4m3(449.0), 0x7e);
        assert_eq!(encode_e4m3(464.0), 0x7e);
        assert_eq!(encode_e4m3(1.0e6), 0x7e);
        assert_eq!(encode_e4m3(f32::INFINITY), 0x7e);
        assert_eq!(encode_e4m3(f32::NEG_INFINITY), 0xfe);
        assert_eq!(encode_e4m3(-500.0), 0xfe);
        assert_eq!(decode_e4m3(0x7e), 448.0);
    }

    #[test]
    fn nan_is_canonical() {
        assert_eq!(encode_e4m3(f32::NAN), 0x7f);
        assert_eq!(encode_e4m3(-f32::NAN), 0x7f);
        assert!(decode_e4m3(0x7f).is_nan());
        assert!(decode_e4m3(0xff).is_nan());
    }

    #[test]
    fn subnormals_and_underflow() {
        // Smallest subnormal 2^-9 = 0x01; largest subnormal 7 * 2^-9 = 0x07; smallest normal 2^-6 = 0x08.
        assert_eq!(decode_e4m3(0x01), 2f32.powi(-9));
        assert_eq!(decode_e4m3(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(decode_e4m3(0x08), 2f32.powi(-6));
        assert_eq!(encode_e4m3(2f32.powi(-9)), 0x01);
        // Exactly half the smallest subnormal is a tie between 0 and 0x01: even wins (0).
        assert_eq!(encode_e4m3(2f32.powi(-10)), 0x00);
        assert_eq!(encode_e4m3(-(2f32.powi(-10))), 0x80);
        // Just above half rounds up.
        assert_eq!(encode_e4m3(2f32.powi(-10) * 1.0001), 0x01);
        // 1.5 * 2^-9 is a tie between 0x01 and 0x02: even (0x02) wins.
        assert_eq!(encode_e4m3(1.5 * 2f32.powi(-9)), 0x02);
        // 2.5 * 2^-9 ties between 0x02 and 0x03: even (0x02).
        assert_eq!(encode_e4m3(2.5 * 2f32.powi(-9)), 0x02);
        assert_eq!(encode_e4m3(f32::MIN_POSITIVE), 0x00);
    }

    #[test]
    fn round_to_nearest_even() {
        // 1.0 = 0x38, next 1.125 = 0x39, 1.25 = 0x3a.
        assert_eq!(encode_e4m3(1.0625), 0x38); // tie 1.0 / 1.125 -> even 0x38
        assert_eq!(encode_e4m3(1.1875), 0x3a); // tie 1.125 / 1.25 -> even 0x3a
        assert_eq!(encode_e4m3(1.07), 0x39);
        assert_eq!(encode_e4m3(-1.0625), 0xb8);
        // Largest normals: 416 (0x7d) and 448 (0x7e); 432 ties -> even 0x7e.
        assert_eq!(encode_e4m3(432.0), 0x7e);
        assert_eq!(encode_e4m3(424.0), 0x7d);
    }

    #[test]
    fn every_code_round_trips() {
        for b in 0u8..=255 {
            let v = decode_e4m3(b);
            if v.is_nan() {
                continue;
            }
            let back = encode_e4m3(v);
            // -0 keeps its sign bit; all others map back to themselves.
            assert_eq!(back, b, "code {b:#04x} = {v}");
        }
    }

    #[test]
    fn matches_the_nearest_value_oracle() {
        // Every code, the midpoints between neighbours, and their f32 neighbours.
        let mut xs = Vec::new();
        for code in 0u8..0x7f {
            let v = decode_e4m3(code);
            let next = decode_e4m3(code + 1);
            xs.push(v);
            if next.is_finite() {
                let mid = (v + next) / 2.0;
                xs.extend([mid, f32::from_bits(mid.to_bits() + 1), f32::from_bits(mid.to_bits() - 1)]);
            }
        }
        xs.extend([448.0, 460.0, 464.0, 465.0, 1e30, 3.0e-3, 1e-7]);
        for x in xs.clone() {
            xs.push(-x);
        }
        for x in xs {
            assert_eq!(encode_e4m3(x), oracle(x), "x = {x:e}");
        }
    }

    #[test]
    fn random_values_match_the_oracle() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let x = f32::from_bits(rng.random::<u32>());
            let x = if x.is_finite() && x.abs() < 1e3 { x } else { rng.random_range(-500.0..500.0) };
            assert_eq!(encode_e4m3(x), oracle(x), "x = {x:e}");
        }
    }
}
