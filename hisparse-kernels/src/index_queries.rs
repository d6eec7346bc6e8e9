//! How the lightning indexer uses its queries: kept exact ([`IndexerQueries::Exact`]), or
//! quantised per head to e4m3 ([`IndexerQueries::Fp8`], DeepSeek-V3.2's recipe: one
//! power-of-two scale per 128-value block, which for a 128-dim head is one per head). Owns the
//! quantiser both backends apply, so that the CUDA kernel and its CPU twin score the same
//! quantised values.

use half::bf16;
use hisparse_memory::fp8::{E4M3_MAX, encode_e4m3};

/// The indexer's query precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexerQueries {
    /// bf16 queries used as given (the CUDA kernel: f16 tensor cores after an exact
    /// power-of-two rescale, keys converted e4m3 -> f16).
    #[default]
    Exact,
    /// Every head's 128 query values scaled by `2^-e` (the smallest power of two that brings
    /// the head's largest magnitude to at most 448) and rounded to e4m3; the scale folds into
    /// the head's weight (`w_h * 2^e`). The CUDA kernel then multiplies e4m3 by e4m3 on fp8
    /// tensor cores, keys used as stored.
    Fp8,
}

impl IndexerQueries {
    /// The names the configuration and the command line use.
    pub const NAMES: [&'static str; 2] = ["exact", "fp8"];

    /// Parses a name of [`IndexerQueries::NAMES`].
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(Self::Exact),
            "fp8" => Some(Self::Fp8),
            _ => None,
        }
    }

    /// The name of [`IndexerQueries::NAMES`].
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Fp8 => "fp8",
        }
    }
}

/// Most negative and positive scale exponents (the scale and `w_h * 2^e` stay normal floats).
pub const QUERY_EXPONENT_LIMIT: i32 = 120;

/// `floor(log2(x))` of a positive finite f32 (subnormals included).
fn ilogb(x: f32) -> i32 {
    let bits = x.to_bits() & 0x7fff_ffff;
    let exp = (bits >> 23) as i32;
    if exp == 0 {
        // Subnormal: x = m * 2^-149 with m the 23-bit mantissa (not zero: x > 0).
        31 - bits.leading_zeros() as i32 - 149
    } else {
        exp - 127
    }
}

/// `2^e` for `e` within [`QUERY_EXPONENT_LIMIT`] (a normal float, built exactly).
pub fn pow2(e: i32) -> f32 {
    let e = e.clamp(-QUERY_EXPONENT_LIMIT, QUERY_EXPONENT_LIMIT);
    // 127 + e lies in 7..=247: a normal exponent field.
    f32::from_bits(((127 + e) as u32) << 23)
}

/// The scale exponent of a head whose largest magnitude is `amax` (NaNs skipped): the smallest
/// `e` with `amax <= 448 * 2^e`, within [`QUERY_EXPONENT_LIMIT`]; 0 for an all-zero head, the
/// upper limit for an infinite value. The CUDA kernel computes the same with `ilogbf`/`ldexpf`.
pub fn query_exponent(amax: f32) -> i32 {
    if amax.is_nan() || amax <= 0.0 {
        return 0;
    }
    if amax.is_infinite() {
        return QUERY_EXPONENT_LIMIT;
    }
    let mut e = ilogb(amax) - 8;
    // amax / 2^e lies in [256, 512) and is exact in f64.
    if f64::from(amax) * 2f64.powi(-e) > f64::from(E4M3_MAX) {
        e += 1;
    }
    e.clamp(-QUERY_EXPONENT_LIMIT, QUERY_EXPONENT_LIMIT)
}

/// One head's queries quantised: its e4m3 codes (in `codes`) and the scale exponent.
pub fn quantize_head(q: &[bf16], codes: &mut [u8]) -> i32 {
    let amax = q.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
    let e = query_exponent(amax);
    let down = pow2(-e);
    for (c, v) in codes.iter_mut().zip(q) {
        *c = encode_e4m3(v.to_f32() * down);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use hisparse_memory::fp8::decode_e4m3;

    #[test]
    fn the_exponent_is_the_smallest_that_fits_448() {
        for &(amax, e) in &[(448.0f32, 0), (448.5, 1), (449.0, 1), (224.0, -1), (224.1, 0), (1.0, -8), (0.0, 0)] {
            assert_eq!(query_exponent(amax), e, "amax {amax}");
        }
        assert_eq!(query_exponent(f32::INFINITY), QUERY_EXPONENT_LIMIT);
        assert_eq!(query_exponent(f32::from_bits(1)), -QUERY_EXPONENT_LIMIT, "2^-149 clamps");
        // Against the definition over many magnitudes, subnormal to huge.
        let mut x = f32::from_bits(3);
        while x < 1e30 {
            let e = query_exponent(x);
            if e > -QUERY_EXPONENT_LIMIT {
                assert!(f64::from(x) <= 448.0 * 2f64.powi(e), "{x}: {e} too small");
                assert!(f64::from(x) > 448.0 * 2f64.powi(e - 1), "{x}: {e} not the smallest");
            }
            x *= 1.37;
        }
    }

    #[test]
    fn a_quantised_head_keeps_its_largest_value_within_e4m3_rounding() {
        let mut rng = crate::random::rng(4);
        for std in [1e-3f32, 1.0, 300.0, 7e4] {
            let q = crate::random::normal_bf16(&mut rng, 128, std);
            let mut codes = [0u8; 128];
            let e = quantize_head(&q, &mut codes);
            let up = f64::from(pow2(e));
            let amax = q.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
            let back = codes.iter().fold(0f64, |m, &c| m.max(f64::from(decode_e4m3(c)).abs())) * up;
            assert!(codes.iter().all(|&c| c & 0x7f != 0x7f), "no NaN codes");
            assert!((back - f64::from(amax)).abs() <= f64::from(amax) / 16.0, "std {std}: {back} vs {amax}");
            assert!(back / up > 224.0, "std {std}: the scale uses the range ({})", back / up);
        }
    }
}
