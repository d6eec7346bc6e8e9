//! The CPU backend: exact reference kernels with f32 accumulation in a fixed order (so results
//! do not depend on thread count or on where rows live), parallel over requests and heads with
//! rayon. `swap_in.rs` holds [`CpuSwapIn`], the CPU backend's swap-in: the policy crate's
//! reference step (`SwapInState::step`) per (seat, layer), rows read from the
//! host tier.

mod attention;
mod backup;
mod index_keys;
mod indexer;
mod oracle_index;
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
/// well and gives the same bits wherever it runs on the same inputs.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
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
