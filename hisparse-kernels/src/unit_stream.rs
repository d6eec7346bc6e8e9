//! The unit stream: counter-based uniform values of unit variance (in `[-√3, √3)`), the same
//! bits on the CPU and in the CUDA kernel `fill_unit_bf16`, so that an emulated model's data can
//! be generated where it is used. Element `2p + i` of the stream seeded `s` takes 24 bits
//! (`i = 0`: bits 0..24, `i = 1`: bits 32..56) of `splitmix(s + (p + 1) * 0x9e3779b97f4a7c15)`
//! and maps them as `bits * (2√3 / 2^24) - √3`, both operations rounded separately.

/// The SplitMix64 increment.
pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
/// `√3`, the half-width of the values.
pub const HALF_WIDTH: f32 = 1.732_050_8;
/// The step between values: `2√3 / 2^24`.
pub const STEP: f32 = 2.0 * HALF_WIDTH / (1u64 << 24) as f32;

/// SplitMix64's output mix of a state.
#[inline]
pub fn mix(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with the stream seeded `seed` from its first element.
pub fn fill_unit(seed: u64, out: &mut [f32]) {
    let mut s = seed;
    for pair in out.chunks_mut(2) {
        s = s.wrapping_add(GOLDEN);
        let r = mix(s);
        for (i, o) in pair.iter_mut().enumerate() {
            let bits = ((r >> (32 * i)) & 0xff_ffff) as f32;
            *o = bits * STEP - HALF_WIDTH;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_counter_based_and_of_unit_variance() {
        let mut a = vec![0f32; 100_001];
        fill_unit(42, &mut a);
        // Element 2p + 1 is the high half of pair p: recompute a few directly.
        for p in [0u64, 7, 49_999] {
            let r = mix(42u64.wrapping_add((p + 1).wrapping_mul(GOLDEN)));
            assert_eq!(a[2 * p as usize + 1], ((r >> 32) & 0xff_ffff) as f32 * STEP - HALF_WIDTH);
        }
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
        assert!(a.iter().all(|x| x.abs() <= HALF_WIDTH));
    }
}
