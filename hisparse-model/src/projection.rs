//! A weight matrix of the model and its products with rows of activations (`x @ w^T`). Q4_1
//! weights (the default GGUF's) go through our own kernel, parallel over output features on
//! rayon's workers: the same arithmetic as candle's `k_quants` (each activation row quantised to
//! Q8_1 per 32 values; each output the blocks' integer dot products, each block's
//! `sumi * d_w * d_x + m_w * s_x` summed in block order), so its outputs are candle's bit for
//! bit (tested). Candle runs that product on one scalar loop behind a pool whose threads spin
//! while they wait, most of a decode step on two cores. Every other weight type goes through
//! candle's `QMatMul`.

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

use crate::error::{ModelError, Result};

/// Values per Q4_1 and Q8_1 block.
const BLOCK: usize = 32;
/// Bytes of one Q4_1 block: an f16 scale, an f16 minimum, 16 bytes of nibbles.
const Q4_1_BYTES: usize = 20;
/// Output features one rayon task computes.
const FEATURES_PER_TASK: usize = 64;

/// One Q4_1 block, its f16 fields widened (exactly) to f32.
#[derive(Clone, Copy)]
struct Q4_1Block {
    d: f32,
    m: f32,
    /// Value `j` in the low nibble of byte `j`, value `j + 16` in its high nibble.
    qs: [u8; 16],
}

/// One activation block quantised as ggml's `quantize_row_q8_1` does.
#[derive(Clone, Copy)]
struct Q8_1Block {
    d: f32,
    /// `f16(sum of the codes) * f16(d)`, rounded to f16.
    s: f32,
    qs: [i8; BLOCK],
}

impl Q8_1Block {
    fn quantize(x: &[f32]) -> Self {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d);
        let mut qs = [0i8; BLOCK];
        let mut sum = 0i32;
        for (q, v) in qs.iter_mut().zip(x) {
            // |v * id| <= 127 (rounded): the cast saturates nothing.
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        let s = f16::from_f32(f16::from_f32(sum as f32).to_f32() * d16.to_f32());
        Self { d: d16.to_f32(), s: s.to_f32(), qs }
    }
}

/// `w . x` over one row of blocks, in candle's order.
fn dot(w: &[Q4_1Block], x: &[Q8_1Block]) -> f32 {
    let mut sum = 0f32;
    for (w, x) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += i32::from(w.qs[j] & 15) * i32::from(x.qs[j]) + i32::from(w.qs[j] >> 4) * i32::from(x.qs[j + 16]);
        }
        sum += sumi as f32 * w.d * x.d + w.m * x.s;
    }
    sum
}

/// A Q4_1 matrix of `features` rows of `blocks` blocks each.
struct Q4_1Rows {
    features: usize,
    blocks: usize,
    data: Vec<Q4_1Block>,
}

impl Q4_1Rows {
    fn from_bytes(features: usize, cols: usize, bytes: &[u8]) -> Option<Self> {
        let blocks = cols / BLOCK;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != features.checked_mul(blocks)?.checked_mul(Q4_1_BYTES)? {
            return None;
        }
        let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        let data = bytes
            .chunks_exact(Q4_1_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[4..20]);
                Q4_1Block { d: f16_at(b, 0), m: f16_at(b, 2), qs }
            })
            .collect();
        Some(Self { features, blocks, data })
    }

    fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let cols = self.blocks * BLOCK;
        let xq: Vec<Q8_1Block> = x.chunks_exact(BLOCK).map(Q8_1Block::quantize).collect();
        let mut out = vec![0f32; rows * self.features];
        // Output features in tasks; each task writes its features of every row.
        let per_task: Vec<Vec<f32>> = self
            .data
            .par_chunks(FEATURES_PER_TASK * self.blocks)
            .map(|ws| {
                let n = ws.len() / self.blocks;
                let mut part = vec![0f32; rows * n];
                for r in 0..rows {
                    let xr = &xq[r * self.blocks..(r + 1) * self.blocks];
                    for (f, w) in ws.chunks_exact(self.blocks).enumerate() {
                        part[r * n + f] = dot(w, xr);
                    }
                }
                part
            })
            .collect();
        for (t, part) in per_task.iter().enumerate() {
            let (first, n) = (t * FEATURES_PER_TASK, part.len() / rows.max(1));
            for r in 0..rows {
                out[r * self.features + first..][..n].copy_from_slice(&part[r * n..(r + 1) * n]);
            }
        }
        debug_assert_eq!(x.len(), rows * cols);
        out
    }
}

/// A weight matrix: see the module documentation.
pub struct Projection {
    q: QMatMul,
    q4_1: Option<Q4_1Rows>,
}

impl Projection {
    /// `q`, with its Q4_1 blocks read for our kernel where it is a Q4_1 tensor of whole blocks.
    pub fn new(q: QMatMul) -> Result<Self> {
        let q4_1 = match &q {
            QMatMul::QTensor(t) if t.dtype() == GgmlDType::Q4_1 => match t.shape().dims() {
                &[features, cols] => Q4_1Rows::from_bytes(features, cols, &t.data()?),
                _ => None,
            },
            _ => None,
        };
        Ok(Self { q, q4_1 })
    }

    /// The candle weight.
    pub fn qmatmul(&self) -> &QMatMul {
        &self.q
    }

    /// `x @ w^T` for `rows` rows of `x` (the weight's columns each).
    pub fn matmul(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        if let Some(w) = &self.q4_1 {
            if x.len() != rows * w.blocks * BLOCK {
                return Err(ModelError::invalid("x", x.len(), format!("{rows} rows of {} values", w.blocks * BLOCK)));
            }
            return Ok(w.matmul(x, rows));
        }
        self.candle_matmul(x, rows)
    }

    /// `x @ w^T` through candle's `QMatMul`, rows split over rayon's workers.
    pub fn candle_matmul(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let cols = x.len() / rows.max(1);
        let one = |x: &[f32]| -> Result<Vec<f32>> {
            let t = Tensor::from_slice(x, (x.len() / cols.max(1), cols), &Device::Cpu)?;
            Ok(self.q.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let threads = rayon::current_num_threads();
        if rows < 2 || threads < 2 {
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

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;

    use super::*;

    /// A Q4_1 weight of `features x cols` pseudo-random values, as candle quantises it (an even number of blocks a row: candle asserts it in debug builds).
    fn weight(features: usize, cols: usize, seed: u32) -> Projection {
        let v: Vec<f32> = (0..features * cols)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.47)
            .collect();
        let t = Tensor::from_vec(v, (features, cols), &Device::Cpu).unwrap();
        Projection::new(QMatMul::from_qtensor(QTensor::quantize(&t, GgmlDType::Q4_1).unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn our_q4_1_products_are_candles_bit_for_bit() {
        // Features past one task and not a multiple of it; rows of one (decoding) and several.
        for (features, cols, rows) in [(150, 64, 1), (150, 128, 3), (7, 64, 2), (1, 320, 1)] {
            let w = weight(features, cols, features as u32);
            assert!(w.q4_1.is_some(), "read as Q4_1");
            let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 + 0.001).collect();
            let (ours, candles) = (w.matmul(&x, rows).unwrap(), w.candle_matmul(&x, rows).unwrap());
            assert_eq!(ours.len(), rows * features);
            let differ = ours.iter().zip(&candles).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{features}x{cols}, {rows} rows: {differ} outputs differ");
            assert!(ours.iter().any(|v| *v != 0.0));
        }
        let w = weight(8, 64, 1);
        let e = w.matmul(&[0.5; 63], 1).unwrap_err().to_string();
        assert!(e.contains('x') && e.contains("64"), "{e}");
    }
}
