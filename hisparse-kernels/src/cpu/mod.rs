//! The CPU backend: exact reference kernels with f32 accumulation in a fixed order (so results
//! do not depend on thread count or on where rows live), parallel over requests and heads with
//! rayon. `swap_in.rs` holds [`CpuSwapIn`], the CPU backend's swap-in: the policy crate's
//! reference step (`SwapInState::step`) per (seat, layer), rows read from the
//! host tier.

mod attention;
mod backup;
mod exp;
mod index_keys;
mod indexer;
mod key_block;
mod oracle_channels;
mod oracle_index;
mod oracle_keys;
mod swap_in;
mod topk;

pub use backup::CpuRowBackup;
pub use swap_in::CpuSwapIn;

#[cfg(feature = "cuda")]
pub(crate) use topk::check_spans as check_top_k_spans;
pub use topk::top_k_positions;

use hisparse_memory::{EmulatedDevice, HostTier};

use crate::backend::{Backend, Kernels, ModelKernels, StepControl};
use crate::batch::{AttentionBatch, IndexerBatch, Span};
use crate::error::{KernelError, Result};
use crate::row_backup::RowBackupConfig;
use crate::swap_in::{DeviceSwapInConfig, MissFill};

/// The CPU backend. Its device memory is host memory ([`EmulatedDevice`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    memory: EmulatedDevice,
    miss_fill: MissFill,
}

impl CpuBackend {
    /// A CPU backend using rayon's global thread pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// This backend with `fill` as its miss-fill form. The CPU swap-in copies the misses itself
    /// in every form but [`MissFill::NoCopies`] (the timing bound), whose swap-in copies nothing;
    /// a policy the form cannot run is refused as on CUDA ([`MissFill::check_policy`]).
    pub fn with_miss_fill(mut self, fill: MissFill) -> Result<Self> {
        fill.validate()?;
        self.miss_fill = fill;
        Ok(self)
    }
}

impl Kernels for CpuBackend {
    type Memory = EmulatedDevice;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn memory(&self) -> &EmulatedDevice {
        &self.memory
    }

    fn indexer_scores(&self, batch: &IndexerBatch<'_, EmulatedDevice>, scores: &mut Vec<f32>) -> Result<()> {
        indexer::indexer_scores(batch, scores)
    }

    fn top_k(&self, scores: &Vec<f32>, spans: &[Span], k: usize, out: &mut Vec<i32>) -> Result<()> {
        topk::top_k(scores, spans, k, out)
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, EmulatedDevice>,
        out: &mut Vec<f32>,
        lse: &mut Vec<f32>,
    ) -> Result<()> {
        attention::sparse_attention(batch, out, lse)
    }
}

impl StepControl for CpuBackend {}

impl ModelKernels for CpuBackend {
    fn join_group(
        &self,
        member: crate::collectives::RankMember,
    ) -> Result<Box<dyn crate::collectives::Collectives<EmulatedDevice>>> {
        match member {
            crate::collectives::RankMember::Cpu(r) => Ok(Box::new(r)),
            #[cfg(feature = "nccl")]
            crate::collectives::RankMember::Nccl { ranks, .. } => {
                Err(KernelError::invalid("gpus", ranks, "an NCCL rank on the CPU backend: use --backend cuda"))
            }
        }
    }
}

impl Backend for CpuBackend {
    type SwapIn = CpuSwapIn;
    type Backup = CpuRowBackup;

    fn device_swap_in(&self, cfg: &DeviceSwapInConfig, host: &mut HostTier) -> Result<CpuSwapIn> {
        CpuSwapIn::new(cfg, host, self.miss_fill)
    }

    fn miss_fill(&self) -> MissFill {
        self.miss_fill
    }

    fn row_backup(&self, cfg: &RowBackupConfig, host: &mut HostTier) -> Result<CpuRowBackup> {
        CpuRowBackup::new(host, cfg)
    }
}

/// Dot product with eight independent f32 accumulators, combined in a fixed order: vectorises
/// well and gives the same bits wherever it runs on the same inputs (with AVX2 where the CPU
/// has it: the eight accumulators are one register, the same products and sums).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_lanes(a, b)
}

/// [`dot`] in portable code: accumulator `i` sums the products of the values `8k + i`.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, ra) = a.as_chunks::<8>();
    let (cb, rb) = b.as_chunks::<8>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    pair_lanes(&acc, tail)
}

/// [`dot_lanes`] over exactly `8 * C` values each, as whole arrays (the same products, sums
/// and pairing: the same bits), so that a caller's fixed width unrolls and `a` stays in
/// registers across many `b`.
#[inline(always)]
pub(crate) fn dot_fixed<const C: usize>(a: &[[f32; 8]; C], b: &[[f32; 8]; C]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in a.iter().zip(b) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    pair_lanes(&acc, 0.0)
}

/// The last step of [`dot`]: `(a0 + a4) + (a1 + a5)`, plus `(a2 + a6) + (a3 + a7)`, plus `tail`.
#[inline(always)]
fn pair_lanes(acc: &[f32; 8], tail: f32) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// [`dot_lanes`] with the accumulators in one AVX register: a product rounded, then added (no
/// fused multiply-add), then the same pairing of lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        // SAFETY: `x` and `y` hold exactly eight f32 each (chunks_exact); the loads are unaligned.
        let (x, y) = unsafe { (_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr())) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    // SAFETY: this function runs only where the CPU has AVX2.
    unsafe { sum_lanes(acc, tail) }
}

/// [`dot_lanes`]' last step over accumulators in one AVX register: `(a0 + a4) + (a1 + a5)`, plus
/// `(a2 + a6) + (a3 + a7)`, plus `tail`.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn sum_lanes(acc: std::arch::x86_64::__m256, tail: f32) -> f32 {
    use std::arch::x86_64::*;
    // (a0 + a4, a1 + a5, a2 + a6, a3 + a7), then its pairs (0 + 1) and (2 + 3), then their sum.
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let pairs = _mm_hadd_ps(s, s);
    (_mm_cvtss_f32(pairs) + _mm_cvtss_f32(_mm_movehdup_ps(pairs))) + tail
}

/// Splits `buf` into one mutable slice per span (in the spans' order), failing if a span leaves
/// the buffer or two spans overlap.
pub(crate) fn disjoint_spans_mut<'a, T>(
    field: &'static str,
    buf: &'a mut [T],
    spans: &[Span],
) -> Result<Vec<&'a mut [T]>> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].offset);
    let mut out: Vec<Option<&'a mut [T]>> = (0..spans.len()).map(|_| None).collect();
    let mut rest = buf;
    let mut consumed = 0usize;
    for i in order {
        let s = spans[i];
        let end = s.offset.checked_add(s.len).ok_or_else(|| KernelError::invalid(field, s.offset, "span overflows"))?;
        if s.offset < consumed {
            return Err(KernelError::invalid(field, format!("{}..{}", s.offset, end), "spans overlap"));
        }
        if end > consumed + rest.len() {
            return Err(hisparse_memory::MemoryError::OutOfBounds {
                field,
                start: s.offset,
                end,
                len: consumed + rest.len(),
            }
            .into());
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(s.offset - consumed);
        let (mine, tail) = tail.split_at_mut(s.len);
        out[i] = Some(mine);
        rest = tail;
        consumed = end;
    }
    // Every index was visited exactly once above, so every entry is Some.
    Ok(out.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_the_portable_lanes_bits() {
        for n in [0, 1, 7, 8, 9, 64, 100, 577] {
            // Values of mixed signs and magnitudes, so that rounding depends on the order.
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 10f32.powi(i % 5 - 2)).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3 + 0.2).cos() * 3.0).collect();
            assert_eq!(dot(&a, &b).to_bits(), dot_lanes(&a, &b).to_bits(), "length {n}");
        }
        // The fixed-width form, at a width of 64.
        let a: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 10f32.powi(i % 5 - 2)).collect();
        let b: Vec<f32> = (0..64).map(|i| (i as f32 * 1.3 + 0.2).cos() * 3.0).collect();
        let fixed = |x: &[f32]| -> [[f32; 8]; 8] { std::array::from_fn(|c| std::array::from_fn(|i| x[8 * c + i])) };
        assert_eq!(dot_fixed(&fixed(&a), &fixed(&b)).to_bits(), dot_lanes(&a, &b).to_bits());
    }

    #[test]
    fn dot_matches_f64() {
        let a: Vec<f32> = (0..577).map(|i| (i as f32 * 0.1).sin()).collect();
        let b: Vec<f32> = (0..577).map(|i| (i as f32 * 0.3).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        assert!((f64::from(dot(&a, &b)) - exact).abs() < 1e-4, "{} vs {exact}", dot(&a, &b));
    }

    #[test]
    fn disjoint_spans_split_and_refuse_overlap() {
        let mut v = vec![0u8; 10];
        let parts = disjoint_spans_mut("scores", &mut v, &[Span::new(6, 3), Span::new(0, 2)]).unwrap();
        assert_eq!((parts[0].len(), parts[1].len()), (3, 2));
        assert!(disjoint_spans_mut("scores", &mut v, &[Span::new(0, 5), Span::new(4, 2)]).is_err());
        assert!(disjoint_spans_mut("scores", &mut v, &[Span::new(8, 3)]).is_err());
    }
}
