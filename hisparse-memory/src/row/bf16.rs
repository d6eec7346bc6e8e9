//! bf16 pieces of rows: round-to-nearest-even encoding (as CUDA's `__float2bfloat16_rn`) and exact
//! decoding, little-endian.

use half::bf16;

/// Encodes `values` as little-endian bf16 into `out` (2 bytes per value; lengths must agree).
pub fn encode_bf16_into(values: &[f32], out: &mut [u8]) {
    for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// Decodes little-endian bf16 from `bytes` into `out` (exact).
pub fn decode_bf16_into(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}
