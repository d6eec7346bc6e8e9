//! Block quantisation to e4m3 with one power-of-two fp32 scale per block, shared by fp8 KV rows
//! and index keys.

use crate::error::{MemoryError, Result};
use crate::fp8::{E4M3_MAX, decode_e4m3_scaled, encode_e4m3};

/// Latent values per fp32 scale in an fp8 KV row.
pub const FP8_BLOCK: usize = 128;

/// The smallest power of two `s` with `amax / s <= 448`, at least 2^-126; 1 when `amax` is 0.
pub(crate) fn pow2_scale(amax: f32) -> f32 {
    if amax <= 0.0 {
        return 1.0;
    }
    let r = amax / E4M3_MAX;
    let min = f32::MIN_POSITIVE;
    if r <= min {
        return min;
    }
    // r is finite and normal; floor(log2 r) is within one of the exact exponent, fixed below.
    let mut s = 2f32.powi(r.log2().floor() as i32);
    while s < r {
        s *= 2.0;
    }
    while s / 2.0 >= r && s / 2.0 >= min {
        s /= 2.0;
    }
    s
}

/// Quantises a block of finite values to e4m3 codes in `out` and returns the block's scale.
/// `out.len()` must equal `values.len()`.
pub fn quantize_block(values: &[f32], out: &mut [u8]) -> f32 {
    let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = pow2_scale(amax);
    let inv = 1.0 / s; // exact: s is a power of two
    for (v, o) in values.iter().zip(out.iter_mut()) {
        *o = encode_e4m3(v * inv);
    }
    s
}

/// Reads a little-endian fp32 scale and checks it is finite and positive.
pub(crate) fn read_scale(bytes: &[u8], field: &'static str, index: usize) -> Result<f32> {
    let s = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if s.is_finite() && s > 0.0 { Ok(s) } else { Err(MemoryError::BadScale { field, index, value: s }) }
}

/// Decodes `out.len()` e4m3 codes followed by their fp32 scales (one per `FP8_BLOCK` codes, or one
/// for all codes when fewer) from `bytes`.
pub(crate) fn decode_blocks(bytes: &[u8], out: &mut [f32], field: &'static str) -> Result<()> {
    let n = out.len();
    let block = FP8_BLOCK.min(n);
    let (codes, scales) = bytes.split_at(n);
    for (b, (chunk, codes)) in out.chunks_mut(block).zip(codes.chunks(block)).enumerate() {
        decode_e4m3_scaled(codes, read_scale(&scales[4 * b..], field, b)?, chunk);
    }
    Ok(())
}
