//! bf16 pieces of rows: round-to-nearest-even encoding (as CUDA's `__float2bfloat16_rn`) and exact
//! decoding, little-endian.

use half::bf16;

/// Encodes `values` as little-endian bf16 into `out` (2 bytes per value; lengths must agree).
pub fn encode_bf16_into(values: &[f32], out: &mut [u8]) {
    for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Decodes little-endian bf16 from `bytes` into `out` (exact; the same bits as
/// [`bf16::to_f32`], a NaN's quiet bit set), eight at a time with AVX2 where the CPU has it.
#[inline]
pub fn decode_bf16_into(bytes: &[u8], out: &mut [f32]) {
    let n = out.len().min(bytes.len() / 2);
    #[allow(unused_mut)] // only the x86_64 path below moves it
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        done = unsafe { decode_bf16_avx2(&bytes[..2 * n], &mut out[..n]) };
    }
    for (o, b) in out[done..n].iter_mut().zip(bytes[2 * done..].chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// [`decode_bf16_into`] of whole groups of eight values; returns how many it decoded.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_bf16_avx2(bytes: &[u8], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let (magnitude, infinity, quiet) =
        (_mm256_set1_epi32(0x7fff_ffff), _mm256_set1_epi32(0x7f80_0000), _mm256_set1_epi32(0x0040_0000));
    let mut done = 0;
    for (b, o) in bytes.chunks_exact(16).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `b` holds exactly sixteen bytes (chunks_exact); the load is unaligned.
        let halves = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
        let x = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves));
        // A NaN (magnitude above infinity's) gets its quiet bit, as `bf16::to_f32` gives it.
        let nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, magnitude), infinity);
        let x = _mm256_or_si256(x, _mm256_and_si256(nan, quiet));
        // SAFETY: `o` holds exactly eight f32 (chunks_exact_mut); the store is unaligned.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_castsi256_ps(x)) };
        done += 8;
    }
    done
}

/// Decodes `width` bf16 values at byte `at` of each row `rows[i]` (of `row_bytes` bytes) of
/// `pool` into `out[i * width ..]`, as [`decode_bf16_into`] does; one dispatch for all rows.
/// Every row and range must lie in the pool (checked by the caller; a slice index panics
/// otherwise).
pub(super) fn decode_bf16_rows(pool: &[u8], rows: &[i32], row_bytes: usize, at: usize, out: &mut [f32], width: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { decode_bf16_rows_avx2(pool, rows, row_bytes, at, out, width) };
    }
    decode_bf16_rows_any(pool, rows, row_bytes, at, out, width)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_bf16_rows_avx2(pool: &[u8], rows: &[i32], row_bytes: usize, at: usize, out: &mut [f32], width: usize) {
    for (&r, o) in rows.iter().zip(out.chunks_exact_mut(width.max(1))) {
        let src = &pool[r as usize * row_bytes + at..][..2 * width];
        // SAFETY: this function runs only where the CPU has AVX2.
        let done = unsafe { decode_bf16_avx2(src, o) };
        if done < width {
            decode_bf16_into(&src[2 * done..], &mut o[done..]);
        }
    }
}

fn decode_bf16_rows_any(pool: &[u8], rows: &[i32], row_bytes: usize, at: usize, out: &mut [f32], width: usize) {
    for (&r, o) in rows.iter().zip(out.chunks_exact_mut(width.max(1))) {
        decode_bf16_into(&pool[r as usize * row_bytes + at..][..2 * width], o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_is_halfs_for_every_pattern() {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut got = vec![0f32; 1 << 16];
        // Twice: the eight-at-a-time part and a tail of five.
        decode_bf16_into(&bytes[..2 * 13], &mut got[..13]);
        decode_bf16_into(&bytes[2 * 13..], &mut got[13..]);
        for (i, g) in got.iter().enumerate() {
            // Every u16 is below 2^16: the index is the pattern.
            let want = bf16::from_bits(i as u16).to_f32();
            assert_eq!(g.to_bits(), want.to_bits(), "bf16 {i:#06x}");
        }
    }
}
