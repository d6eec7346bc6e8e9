//! The transformer's arithmetic outside attention, on f32 slices: RMSNorm, interleaved RoPE
//! (GGUF's llama convention: pairs `(2i, 2i+1)`), SiLU, and the matmuls through a
//! [`Projection`] (quantized) or its weight dequantized (long prompts).

use candle_core::Tensor;
use candle_core::quantized::QMatMul;

use crate::error::Result;
use crate::projection::Projection;

/// `out = x / rms(x) * w` for each row of `x` (`[rows, w.len()]`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (xr, or) in x.chunks(w.len()).zip(out.chunks_mut(w.len())) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
    out
}

/// RoPE tables: `cos` and `sin` of `pos * base^(-2i/d)` for every position and pair.
pub struct Rope {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// Tables for `positions` positions of heads of `head_dim`.
    pub fn new(head_dim: usize, base: f32, positions: usize) -> Self {
        let half = head_dim / 2;
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32)).collect();
        let (mut cos, mut sin) = (Vec::with_capacity(positions * half), Vec::with_capacity(positions * half));
        for p in 0..positions {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Self { half, cos, sin }
    }

    /// Positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.len() / self.half.max(1)
    }

    /// Rotates every head of `x` (heads of `2 * half` values) for position `pos` (< `positions`).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let (c, s) = (&self.cos[pos * self.half..][..self.half], &self.sin[pos * self.half..][..self.half]);
        for head in x.chunks_mut(2 * self.half) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c[i] - b * s[i];
                pair[1] = a * s[i] + b * c[i];
            }
        }
    }
}

/// `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `x @ w^T` for `rows` rows of `x` (`Projection::matmul`: for decoding and short prompts).
pub fn matmul(w: &Projection, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    w.matmul(x, rows)
}

/// `x @ w^T` for `rows` rows through the weight dequantized to f32 and candle's GEMM on the
/// weight's device (multi-threaded on the CPU): for prompts, where the quantized kernel's row-by-row products would take minutes. The
/// activations stay f32 (the quantized kernel rounds them to 8 bits), so the result differs from
/// [`matmul`]'s in the last digits.
pub fn matmul_f32(w: &Projection, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let cols = x.len() / rows.max(1);
    let wt = match w.qmatmul() {
        QMatMul::QTensor(q) => q.dequantize(w.device())?,
        QMatMul::Tensor(t) => t.clone(),
        QMatMul::TensorF16(t) => t.to_dtype(candle_core::DType::F32)?,
    };
    let xt = Tensor::from_slice(x, (rows, cols), w.device())?;
    Ok(xt.matmul(&wt.t()?)?.flatten_all()?.to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        let rope = Rope::new(8, 10_000.0, 16);
        let mut x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).sin() + 0.1).collect();
        let before = x.clone();
        rope.apply(&mut x, 0);
        assert_eq!(x, before, "position 0 is the identity");
        rope.apply(&mut x, 5);
        for (a, b) in x.chunks(2).zip(before.chunks(2)) {
            let (na, nb) = (a[0].hypot(a[1]), b[0].hypot(b[1]));
            assert!((na - nb).abs() < 1e-5);
        }
        // The first pair turns by 5 radians (frequency 1).
        let want = (before[0] * 5f32.cos() - before[1] * 5f32.sin(), before[0] * 5f32.sin() + before[1] * 5f32.cos());
        assert!((x[0] - want.0).abs() < 1e-5 && (x[1] - want.1).abs() < 1e-5);
    }

    #[test]
    fn rms_norm_scales_rows_to_unit_rms() {
        let x = [3.0f32, -4.0, 1.0, 2.0];
        let out = rms_norm(&x, &[1.0, 2.0], 0.0);
        let r0 = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r0).abs() < 1e-6 && (out[1] + 8.0 / r0).abs() < 1e-6);
        assert!((silu(0.0)).abs() < 1e-9 && (silu(10.0) - 10.0).abs() < 1e-3);
    }
}
