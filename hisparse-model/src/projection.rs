//! A weight matrix of the model and its products with rows of activations (`x @ w^T`). Q4_1
//! and Q8_0 weights (the default GGUF's projections and its output head) go through our own
//! kernels, parallel over output features on rayon's workers, with the arithmetic of candle's
//! `k_quants` on this machine (each activation row quantised to Q8_1 or Q8_0 per 32 values; each
//! output the blocks' integer dot products scaled and summed in candle's order: Q4_1's scalar
//! loop, Q8_0's AVX2 lanes), so its outputs are candle's bit for bit (tested). Candle runs those
//! products behind a pool whose threads spin while they wait, most of a decode step on two
//! cores. Every other weight type, and every weight on another device than the CPU (a CUDA
//! device's, with candle's `cuda`), goes through candle's `QMatMul` on the weight's device.

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

use crate::error::{ModelError, Result};

/// Values per block of every format here.
const BLOCK: usize = 32;
/// Output features one rayon task computes.
const FEATURES_PER_TASK: usize = 64;

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// A weight block format: its bytes, the activation blocks it multiplies, and their dot product.
trait BlockFormat: Sized + Send + Sync {
    /// Bytes of one weight block in the file.
    const BYTES: usize;
    /// An activation block.
    type Act: Send + Sync;
    fn read(bytes: &[u8]) -> Self;
    fn quantize(x: &[f32]) -> Self::Act;
    /// `w . x` over one row of blocks.
    fn dot(w: &[Self], x: &[Self::Act]) -> f32;
}

/// One Q4_1 block, its f16 fields widened (exactly) to f32.
struct Q4_1 {
    d: f32,
    m: f32,
    /// Value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble.
    qs: [u8; 16],
}

/// One activation block quantised as ggml's `quantize_row_q8_1` does.
struct Q8_1 {
    d: f32,
    /// `f16(sum of the codes) * f16(d)`, rounded to f16.
    s: f32,
    qs: [i8; BLOCK],
}

/// Codes of `x` under `quantize_row_q8_0/1`'s scale (`amax / 127`), and the scale as f16.
fn q8_codes(x: &[f32]) -> (f16, [i8; BLOCK]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; BLOCK];
    for (q, v) in qs.iter_mut().zip(x) {
        // |v * id| <= 127 (rounded): the cast saturates nothing.
        *q = (v * id).round() as i8;
    }
    (f16::from_f32(d), qs)
}

impl BlockFormat for Q4_1 {
    const BYTES: usize = 20;
    type Act = Q8_1;

    fn read(b: &[u8]) -> Self {
        let mut qs = [0u8; 16];
        qs.copy_from_slice(&b[4..20]);
        Self { d: f16_at(b, 0), m: f16_at(b, 2), qs }
    }

    fn quantize(x: &[f32]) -> Q8_1 {
        let (d, qs) = q8_codes(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        let s = f16::from_f32(f16::from_f32(sum as f32).to_f32() * d.to_f32());
        Q8_1 { d: d.to_f32(), s: s.to_f32(), qs }
    }

    /// Candle's scalar loop: per block `sumi * d_w * d_x + m_w * s_x`, summed in block order.
    fn dot(w: &[Self], x: &[Q8_1]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: this CPU has AVX2 (just checked), the feature `q4_1_dot_avx2` is compiled
            // for.
            return unsafe { q4_1_dot_avx2(w, x) };
        }
        q4_1_dot(w, x)
    }
}

/// [`Q4_1::dot`]'s arithmetic (the integer sums in any order; the floats, never contracted, in
/// candle's).
#[inline(always)]
fn q4_1_dot(w: &[Q4_1], x: &[Q8_1]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in w.iter().zip(x) {
        let mut p = [0i32; 16];
        for (j, p) in p.iter_mut().enumerate() {
            *p = i32::from(w.qs[j] & 15) * i32::from(x.qs[j]) + i32::from(w.qs[j] >> 4) * i32::from(x.qs[j + 16]);
        }
        let sumi: i32 = p.iter().sum();
        sum += sumi as f32 * w.d * x.d + w.m * x.s;
    }
    sum
}

/// [`q4_1_dot`] on AVX2: a block's 32 nibbles against its 32 codes by `maddubs` (unsigned times
/// signed, pairs summed exactly in 16 bits: at most 2 * 15 * 127) and `madd`, the eight lanes
/// summed to the block's exact integer; the floats as [`q4_1_dot`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn q4_1_dot_avx2(w: &[Q4_1], x: &[Q8_1]) -> f32 {
    use std::arch::x86_64::*;
    let (low, ones) = (_mm256_set1_epi8(15), _mm256_set1_epi16(1));
    let mut sum = 0f32;
    for (w, x) in w.iter().zip(x) {
        // SAFETY: `qs` holds 16 and 32 readable bytes; the loads are unaligned.
        let (packed, codes) =
            unsafe { (_mm_loadu_si128(w.qs.as_ptr().cast()), _mm256_loadu_si256(x.qs.as_ptr().cast())) };
        // Values 0..16 from the low nibbles, 16..32 from the high ones.
        let nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
        let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles, codes), ones);
        let mut l = [0i32; 8];
        // SAFETY: `l` holds 32 writable bytes.
        unsafe { _mm256_storeu_si256(l.as_mut_ptr().cast(), lanes) };
        let sumi: i32 = l.iter().sum();
        sum += sumi as f32 * w.d * x.d + w.m * x.s;
    }
    sum
}

/// One Q8_0 block (weights or activations), its f16 scale widened to f32.
struct Q8_0 {
    d: f32,
    qs: [i8; BLOCK],
}

impl BlockFormat for Q8_0 {
    const BYTES: usize = 34;
    type Act = Q8_0;

    fn read(b: &[u8]) -> Self {
        let mut qs = [0i8; BLOCK];
        for (q, &c) in qs.iter_mut().zip(&b[2..34]) {
            *q = c as i8;
        }
        Self { d: f16_at(b, 0), qs }
    }

    fn quantize(x: &[f32]) -> Q8_0 {
        let (d, qs) = q8_codes(x);
        Q8_0 { d: d.to_f32(), qs }
    }

    /// Candle's AVX2 kernel's order: eight lanes, lane `m` the integer dot of values
    /// `4m..4m + 4`, each block's `d_w * d_x` times it fused into the lane's sum; then
    /// `((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3))`.
    fn dot(w: &[Self], x: &[Q8_0]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if candle_q8_0_is_avx2() {
            // SAFETY: this CPU has AVX2 and FMA (just checked), the features `q8_0_dot_fma`
            // is compiled for.
            return unsafe { q8_0_dot_fma(w, x) };
        }
        q8_0_dot(w, x)
    }
}

/// [`Q8_0::dot`]'s arithmetic (`mul_add`: one rounding, as the FMA instruction).
#[inline(always)]
fn q8_0_dot(w: &[Q8_0], x: &[Q8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (w, x) in w.iter().zip(x) {
        let d = w.d * x.d;
        let mut p = [0i32; BLOCK];
        for ((p, &a), &b) in p.iter_mut().zip(&w.qs).zip(&x.qs) {
            *p = i32::from(a) * i32::from(b);
        }
        let mut q = [0f32; 8];
        for (q, p) in q.iter_mut().zip(p.chunks_exact(4)) {
            // Exact: at most 4 * 127 * 127 in magnitude.
            *q = (p[0] + p[1] + p[2] + p[3]) as f32;
        }
        for (a, q) in acc.iter_mut().zip(q) {
            *a = d.mul_add(q, *a);
        }
    }
    ((acc[4] + acc[0]) + (acc[6] + acc[2])) + ((acc[5] + acc[1]) + (acc[7] + acc[3]))
}

/// [`q8_0_dot`] on AVX2 and FMA, candle's kernel: each block's products by `maddubs` of the
/// weights' magnitudes and the codes signed by them (exact: at most 2 * 128 * 127 a pair), the
/// eight lanes by `madd`, fused into the lanes' sums; the same horizontal sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn q8_0_dot_fma(w: &[Q8_0], x: &[Q8_0]) -> f32 {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        let d = _mm256_set1_ps(w.d * x.d);
        // SAFETY: `qs` holds 32 readable bytes; the loads are unaligned.
        let (bw, bx) = unsafe { (_mm256_loadu_si256(w.qs.as_ptr().cast()), _mm256_loadu_si256(x.qs.as_ptr().cast())) };
        let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(bw, bw), _mm256_sign_epi8(bx, bw));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, pairs)), acc);
    }
    let mut a = [0f32; 8];
    // SAFETY: `a` holds 32 writable bytes.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), acc) };
    ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]))
}

/// A matrix of `features` rows of `blocks` blocks of format `F`, copied out of the candle tensor
/// with their f16 fields widened: a second copy of the weight beside candle's (which the prompt's
/// f32 path and the fallback read), about 1.2x its bytes. Reading the tensor's bytes in place
/// instead cost about 10 ms of a 40 ms decode step at 2k on two cores (the f16 fields converted
/// anew in every product), so the copy stays.
struct BlockRows<F> {
    features: usize,
    blocks: usize,
    data: Vec<F>,
}

impl<F: BlockFormat> BlockRows<F> {
    fn from_bytes(features: usize, cols: usize, bytes: &[u8]) -> Option<Self> {
        let blocks = cols / BLOCK;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != features.checked_mul(blocks)?.checked_mul(F::BYTES)? {
            return None;
        }
        Some(Self { features, blocks, data: bytes.chunks_exact(F::BYTES).map(F::read).collect() })
    }

    fn cols(&self) -> usize {
        self.blocks * BLOCK
    }

    /// `x @ w^T` for `rows` rows of `cols` values.
    fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let xq: Vec<F::Act> = x.chunks_exact(BLOCK).map(F::quantize).collect();
        // Output features in tasks; each task computes its features of every row.
        let parts: Vec<Vec<f32>> = self
            .data
            .par_chunks(FEATURES_PER_TASK * self.blocks)
            .map(|ws| {
                let n = ws.len() / self.blocks;
                let mut part = vec![0f32; rows * n];
                for r in 0..rows {
                    let xr = &xq[r * self.blocks..(r + 1) * self.blocks];
                    for (f, w) in ws.chunks_exact(self.blocks).enumerate() {
                        part[r * n + f] = F::dot(w, xr);
                    }
                }
                part
            })
            .collect();
        let mut out = vec![0f32; rows * self.features];
        for (t, part) in parts.iter().enumerate() {
            let (first, n) = (t * FEATURES_PER_TASK, part.len() / rows.max(1));
            for r in 0..rows {
                out[r * self.features + first..][..n].copy_from_slice(&part[r * n..(r + 1) * n]);
            }
        }
        out
    }
}

/// Our kernel of a weight, by its format.
enum Kernel {
    Q4_1(BlockRows<Q4_1>),
    Q8_0(BlockRows<Q8_0>),
}

/// A weight matrix: see the module documentation.
pub struct Projection {
    q: QMatMul,
    kernel: Option<Kernel>,
    /// Where the weight lives and its products run (a CUDA device's: candle's kernels there).
    device: Device,
}

impl Projection {
    /// `q`, with its blocks read for our kernel where it is a Q4_1 or Q8_0 matrix of whole
    /// blocks (Q8_0 only where candle's AVX2 kernel is the one to match).
    /// A weight on another device than the CPU is multiplied there by candle's kernels.
    pub fn new(q: QMatMul) -> Result<Self> {
        let device = match &q {
            QMatMul::QTensor(t) => t.device(),
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.device().clone(),
        };
        let kernel = match &q {
            QMatMul::QTensor(_) if !device.is_cpu() => None,
            QMatMul::QTensor(t) => match (t.dtype(), t.shape().dims()) {
                (GgmlDType::Q4_1, &[features, cols]) => {
                    BlockRows::from_bytes(features, cols, &t.data()?).map(Kernel::Q4_1)
                }
                (GgmlDType::Q8_0, &[features, cols]) if candle_q8_0_is_avx2() => {
                    BlockRows::from_bytes(features, cols, &t.data()?).map(Kernel::Q8_0)
                }
                _ => None,
            },
            _ => None,
        };
        Ok(Self { q, kernel, device })
    }

    /// The candle weight.
    pub fn qmatmul(&self) -> &QMatMul {
        &self.q
    }

    /// The device the weight lives on, where its products run.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `x @ w^T` for `rows` rows of `x` (the weight's columns each).
    pub fn matmul(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let Some(kernel) = &self.kernel else {
            return self.candle_matmul(x, rows);
        };
        let cols = match kernel {
            Kernel::Q4_1(w) => w.cols(),
            Kernel::Q8_0(w) => w.cols(),
        };
        if rows.checked_mul(cols) != Some(x.len()) {
            return Err(ModelError::invalid("x", x.len(), format!("{rows} rows of {cols} values")));
        }
        Ok(match kernel {
            Kernel::Q4_1(w) => w.matmul(x, rows),
            Kernel::Q8_0(w) => w.matmul(x, rows),
        })
    }

    /// `x @ w^T` through candle's `QMatMul` on the weight's device (`x` copied there and the
    /// product back), on the CPU with the rows split over rayon's workers.
    pub fn candle_matmul(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let cols = x.len() / rows.max(1);
        let one = |x: &[f32]| -> Result<Vec<f32>> {
            let t = Tensor::from_slice(x, (x.len() / cols.max(1), cols), &self.device)?;
            Ok(self.q.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let threads = rayon::current_num_threads();
        if rows < 2 || threads < 2 || !self.device.is_cpu() {
            return one(x);
        }
        let per = rows.div_ceil(threads.min(rows));
        let parts: Vec<Result<Vec<f32>>> = x.par_chunks(per * cols).map(one).collect();
        let mut out = Vec::new();
        for p in parts {
            out.extend(p?);
        }
        Ok(out)
    }
}

/// Whether candle multiplies Q8_0 blocks with its AVX2 kernel here (its choice at run time);
/// elsewhere its scalar loop sums in another order, and candle keeps the product.
fn candle_q8_0_is_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;

    use super::*;

    /// A weight of `features x cols` pseudo-random values in `dtype`, as candle quantises it (an
    /// even number of blocks a row: candle asserts it in debug builds).
    fn weight(dtype: GgmlDType, features: usize, cols: usize, seed: u32) -> Projection {
        let v: Vec<f32> = (0..features * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.47)
            .collect();
        let t = Tensor::from_vec(v, (features, cols), &Device::Cpu).unwrap();
        Projection::new(QMatMul::from_qtensor(QTensor::quantize(&t, dtype).unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn our_products_are_candles_bit_for_bit() {
        let q8_0 = if candle_q8_0_is_avx2() { Some(GgmlDType::Q8_0) } else { None };
        // Features past one task and not a multiple of it; rows of one (decoding) and several.
        for (dtype, (features, cols, rows)) in [GgmlDType::Q4_1]
            .into_iter()
            .chain(q8_0)
            .flat_map(|d| [(150, 64, 1), (150, 128, 3), (7, 64, 2), (1, 320, 1)].map(|s| (d, s)))
        {
            let w = weight(dtype, features, cols, features as u32);
            assert!(w.kernel.is_some(), "read as {dtype:?}");
            let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 + 0.001).collect();
            let (ours, candles) = (w.matmul(&x, rows).unwrap(), w.candle_matmul(&x, rows).unwrap());
            assert_eq!(ours.len(), rows * features);
            let differ = ours.iter().zip(&candles).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{dtype:?} {features}x{cols}, {rows} rows: {differ} outputs differ");
            assert!(ours.iter().any(|v| *v != 0.0));
        }
        // The vectorised kernels against their portable twins, on codes of both extremes.
        #[cfg(target_arch = "x86_64")]
        if candle_q8_0_is_avx2() {
            let xs: Vec<f32> = (0..256).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.21).collect();
            let (a8, a1): (Vec<Q8_0>, Vec<Q8_1>) =
                (xs.chunks(BLOCK).map(Q8_0::quantize).collect(), xs.chunks(BLOCK).map(Q4_1::quantize).collect());
            let w8: Vec<Q8_0> = (0..8)
                .map(|b| Q8_0 {
                    d: 0.01 * (b + 1) as f32,
                    qs: std::array::from_fn(|i| (i as i32 * 37 - 128 + b) as i8),
                })
                .collect();
            let w4: Vec<Q4_1> = (0..8)
                .map(|b| Q4_1 { d: 0.02, m: -0.1 * b as f32, qs: std::array::from_fn(|i| (i * 29 + b * 7) as u8) })
                .collect();
            // SAFETY: AVX2 and FMA are present (checked above).
            let (v8, v4) = unsafe { (q8_0_dot_fma(&w8, &a8), q4_1_dot_avx2(&w4, &a1)) };
            assert_eq!((v8.to_bits(), v4.to_bits()), (q8_0_dot(&w8, &a8).to_bits(), q4_1_dot(&w4, &a1).to_bits()));
        }
        let w = weight(GgmlDType::Q4_1, 8, 64, 1);
        let e = w.matmul(&[0.5; 63], 1).unwrap_err().to_string();
        assert!(e.contains('x') && e.contains("64"), "{e}");
    }
}
