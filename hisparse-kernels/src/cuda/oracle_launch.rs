//! The oracle's scores on CUDA (`kernels/oracle_index.cu`): the CPU oracle's definition
//! (`crate::cpu`'s `oracle_index.rs`) for models without an indexer — the host-side checks that
//! run before the three launches (logits, per-head statistics, the combined score), their
//! arguments and scratch.

use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use hisparse_memory::cuda::CudaMemory;

use super::buffers::{lock, room, upload_cached};
use super::device::CudaDevice;
use super::driver_error;
use super::facts::{ORACLE_MAX_HEADS, ORACLE_THREADS, OracleArgs};
use super::printed_launch::PrintedLaunch;
use super::scratch::Scratch;
use crate::IndexerQueries;
use crate::batch::{HeadCombine, IndexerBatch, OracleScore};
use crate::error::{KernelError, Result};

/// The oracle's kernels (logits, statistics, combine), loaded on first use: a backend that
/// never scores by the oracle never compiles them.
#[derive(Clone, Default)]
pub(crate) struct OracleKernels {
    loaded: OnceLock<[CudaFunction; 3]>,
}

/// `x` as a kernel's 32-bit field, or an error naming `field`.
fn u32_of(field: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| KernelError::invalid(field, x, "must fit in 32 bits"))
}

impl OracleKernels {
    fn kernels(&self, dev: &CudaDevice) -> Result<&[CudaFunction; 3]> {
        if let Some(k) = self.loaded.get() {
            return Ok(k);
        }
        let f = |k| dev.function("oracle_index", k);
        let loaded = [f("oracle_logits")?, f("oracle_stats")?, f("oracle_combine")?];
        Ok(self.loaded.get_or_init(|| loaded))
    }

    /// The oracle's score of every position of `batch`'s requests into `scores` (from each
    /// request's `score_offset`). Every size is checked before the first launch; page ids the
    /// device holds are checked by the kernel (fault).
    pub(crate) fn launch(
        &self,
        dev: &CudaDevice,
        scratch: &Mutex<Scratch>,
        batch: &IndexerBatch<'_, CudaMemory>,
        oracle: OracleScore,
        scores: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (heads, dim, kb, p) =
            (batch.heads, batch.key_layout.dim(), batch.key_layout.row_bytes(), batch.page_tokens);
        if heads == 0 || heads > ORACLE_MAX_HEADS {
            return Err(KernelError::invalid("heads", heads, format!("the oracle takes 1..={ORACLE_MAX_HEADS}")));
        }
        if batch.queries_as != IndexerQueries::Exact {
            return Err(KernelError::invalid("queries_as", "fp8", "the oracle reads exact queries"));
        }
        let (reqs, max_len, score_end) = super::decode_launch::checked_requests(batch, scores.len())?;
        let n = batch.requests.len();
        if n == 0 || max_len == 0 {
            return Ok(());
        }
        let args = OracleArgs {
            heads: heads as u32,
            dim: u32_of("key_layout.dim", dim)?,
            key_bytes: u32_of("key_layout.row_bytes", kb)?,
            page_tokens: u32_of("page_tokens", p)?,
            pool_pages: u32_of("keys", batch.keys.len() / (kb * p))?,
            // Past the longest request every position is kept anyway.
            sink: oracle.sink.min(max_len) as u32,
            window: oracle.window.min(max_len) as u32,
            pin_newest: u32::from(batch.pin_newest),
            combine_max: u32::from(oracle.combine == HeadCombine::Max),
            pad: 0,
        };
        let logits_len = score_end
            .checked_mul(heads)
            .ok_or_else(|| KernelError::invalid("requests.score_offset", score_end, "times the heads overflows"))?;
        let [logits, stats, combine] = self.kernels(dev)?;
        let mut sc = lock(scratch)?;
        let Scratch { reqs: rd, reqs_c, oracle_logits, oracle_stats, fault, .. } = &mut *sc;
        upload_cached(dev, rd, reqs_c, &reqs)?;
        room(dev, oracle_logits, logits_len)?;
        room(dev, oracle_stats, n * heads * 2)?;
        let s = dev.stream();
        let blocks = max_len.div_ceil(ORACLE_THREADS) as u32;
        let cfg = |grid: (u32, u32, u32)| LaunchConfig {
            grid_dim: grid,
            block_dim: (ORACLE_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = PrintedLaunch::new(&dev.print, s, logits);
        b.arg(batch.queries)
            .arg(batch.weights)
            .arg(batch.keys)
            .arg(batch.page_table)
            .arg(&*rd)
            .params(&args)
            .arg_mut(oracle_logits)
            .arg_mut(fault);
        // SAFETY: queries and weights hold n requests (checked); every request's page-table
        // entries and score span lie within their buffers (checked), the logits hold a row of
        // heads per score position up to the furthest span (sized above); page ids are checked
        // in the kernel (fault).
        unsafe { b.launch(cfg((blocks, n as u32, 1))) }.map_err(driver_error("oracle logits launch"))?;
        drop(b);
        let mut b = PrintedLaunch::new(&dev.print, s, stats);
        b.arg(&*oracle_logits).arg(&*rd).params(&args).arg_mut(oracle_stats);
        // SAFETY: the logits were written for every request's span; the statistics hold two
        // words per (request, head) (sized above).
        unsafe { b.launch(cfg((heads as u32, n as u32, 1))) }.map_err(driver_error("oracle stats launch"))?;
        drop(b);
        let mut b = PrintedLaunch::new(&dev.print, s, combine);
        b.arg(&*oracle_logits).arg(&*oracle_stats).arg(&*rd).params(&args).arg_mut(scores);
        // SAFETY: as above; every request's score span lies within `scores` (checked).
        unsafe { b.launch(cfg((blocks, n as u32, 1))) }.map_err(driver_error("oracle combine launch"))?;
        Ok(())
    }
}
