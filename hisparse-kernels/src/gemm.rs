//! Batched bf16 GEMMs — the arithmetic of an emulated model's non-attention layers: the shape
//! type, its checks, and the CPU twin (f32 accumulation, one rounding to bf16) that the CUDA
//! backend's cuBLAS calls are tested against.

use half::bf16;
use rayon::prelude::*;

use crate::error::{KernelError, Result};

/// A batch of row-major GEMMs `C_i[m × n] = A_i[m × k] · B_i[k × n]` for `i < batch`, operand
/// `i` of each buffer packed right after operand `i - 1` (`A_i` at `i * m * k`, `B_i` at
/// `i * k * n`, `C_i` at `i * m * n`). bf16 in and out, f32 accumulation.
///
/// ```
/// use hisparse_kernels::GemmShape;
/// let s = GemmShape { m: 2, n: 3, k: 4, batch: 5 };
/// assert_eq!((s.a_len(), s.b_len(), s.c_len()), (40, 60, 30));
/// assert_eq!(s.flops(), 2.0 * 2.0 * 3.0 * 4.0 * 5.0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Columns of `A`, rows of `B`.
    pub k: usize,
    /// GEMMs in the batch.
    pub batch: usize,
}

impl GemmShape {
    /// Elements of `A` the batch reads.
    pub fn a_len(&self) -> usize {
        self.batch * self.m * self.k
    }

    /// Elements of `B` the batch reads.
    pub fn b_len(&self) -> usize {
        self.batch * self.k * self.n
    }

    /// Elements of `C` the batch writes.
    pub fn c_len(&self) -> usize {
        self.batch * self.m * self.n
    }

    /// Floating-point operations (a multiply and an add per term).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }

    /// Whether the batch does nothing (a zero dimension).
    pub fn is_empty(&self) -> bool {
        self.m == 0 || self.n == 0 || self.k == 0 || self.batch == 0
    }

    /// Checks the buffers' lengths (`a`, `b`, `c` elements) against the shape, and that every
    /// dimension fits the 32-bit integers of BLAS interfaces.
    pub fn check(&self, a: usize, b: usize, c: usize) -> Result<()> {
        for (field, v) in [("m", self.m), ("n", self.n), ("k", self.k), ("batch", self.batch)] {
            if i32::try_from(v).is_err() {
                return Err(KernelError::invalid(field, v, "must fit in 32 bits"));
            }
        }
        for (field, need, have) in [("a", self.a_len(), a), ("b", self.b_len(), b), ("c", self.c_len(), c)] {
            if have < need {
                return Err(KernelError::invalid(field, have, format!("the GEMM needs {need} elements")));
            }
        }
        Ok(())
    }
}

/// The CPU twin: `c = a · b` for every GEMM of the batch (f32 accumulation in order of `k`,
/// rounded once to bf16).
pub fn gemm_bf16(s: &GemmShape, a: &[bf16], b: &[bf16], c: &mut [bf16]) -> Result<()> {
    s.check(a.len(), b.len(), c.len())?;
    if s.is_empty() {
        return Ok(());
    }
    let (m, n, k) = (s.m, s.n, s.k);
    c[..s.c_len()].par_chunks_mut(m * n).enumerate().for_each(|(i, ci)| {
        let (ai, bi) = (&a[i * m * k..(i + 1) * m * k], &b[i * k * n..(i + 1) * k * n]);
        let mut row = vec![0f32; n];
        for (r, out) in ci.chunks_mut(n).enumerate() {
            row.iter_mut().for_each(|x| *x = 0.0);
            for (t, &x) in ai[r * k..(r + 1) * k].iter().enumerate() {
                let x = x.to_f32();
                for (acc, &w) in row.iter_mut().zip(&bi[t * n..(t + 1) * n]) {
                    *acc += x * w.to_f32();
                }
            }
            out.iter_mut().zip(&row).for_each(|(o, &v)| *o = bf16::from_f32(v));
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_twin_multiplies_small_matrices_exactly() {
        // Two 2x2 GEMMs of small integers (exact in bf16 and f32).
        let s = GemmShape { m: 2, n: 2, k: 2, batch: 2 };
        let f = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let a = f(&[1., 2., 3., 4., 5., 6., 7., 8.]);
        let b = f(&[1., 0., 2., 1., -1., 3., 0., 2.]);
        let mut c = vec![bf16::ZERO; 8];
        gemm_bf16(&s, &a, &b, &mut c).unwrap();
        let got: Vec<f32> = c.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, [5., 2., 11., 4., -5., 27., -7., 37.]);
    }

    #[test]
    fn short_buffers_and_huge_dimensions_are_named() {
        let s = GemmShape { m: 2, n: 2, k: 2, batch: 1 };
        let e = gemm_bf16(&s, &[bf16::ONE; 3], &[bf16::ONE; 4], &mut [bf16::ZERO; 4]).unwrap_err();
        assert!(e.to_string().contains('a'), "{e}");
        let big = GemmShape { m: 1 << 33, ..s };
        assert!(big.check(0, 0, 0).unwrap_err().to_string().contains('m'));
    }
}
