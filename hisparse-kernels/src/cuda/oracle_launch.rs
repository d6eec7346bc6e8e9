//! The oracle's scores on CUDA (`kernels/oracle_index.cu`): the CPU oracle's definition
//! (`crate::cpu`'s `oracle_index.rs`) for models without an indexer — the host-side checks that
//! run before the four launches (the queries as tensor-core fragments with the key chunks each
//! block of heads reads, the logits on tensor cores with their tiles' statistics, the per-head
//! statistics, the combined score), their arguments and scratch.

use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use hisparse_memory::IndexKeyFormat;
use hisparse_memory::cuda::CudaMemory;

use super::buffers::{lock, room, upload_cached};
use super::device::CudaDevice;
use super::driver_error;
use super::facts::{ORACLE_MAX_CHUNKS, ORACLE_MAX_HEADS, ORACLE_THREADS, ORACLE_TILE, OracleArgs, oracle_tile_stride};
use super::printed_launch::PrintedLaunch;
use super::scratch::Scratch;
use crate::IndexerQueries;
use crate::batch::{HeadCombine, IndexerBatch, OracleScore};
use crate::error::{KernelError, Result};

/// The oracle's kernels (chunks, logits, statistics, combine), loaded on first use: a backend
/// that never scores by the oracle never compiles them.
#[derive(Clone, Default)]
pub(crate) struct OracleKernels {
    loaded: OnceLock<[CudaFunction; 4]>,
}

/// The dynamic shared memory the logits kernel opts into (more than the 48 KiB a block gets
/// without asking): a tile of 64 keys of up to 1024 dims fits.
const ORACLE_SMEM_MAX: usize = 80 << 10;

/// `x` as a kernel's 32-bit field, or an error naming `field`.
fn u32_of(field: &'static str, x: usize) -> Result<u32> {
    u32::try_from(x).map_err(|_| KernelError::invalid(field, x, "must fit in 32 bits"))
}

impl OracleKernels {
    fn kernels(&self, dev: &CudaDevice) -> Result<&[CudaFunction; 4]> {
        if let Some(k) = self.loaded.get() {
            return Ok(k);
        }
        let f = |k| dev.function("oracle_index", k);
        let loaded = [f("oracle_chunks")?, f("oracle_logits")?, f("oracle_stats")?, f("oracle_combine")?];
        loaded[1]
            .set_attribute(
                CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                ORACLE_SMEM_MAX as i32,
            )
            .map_err(driver_error("oracle logits shared memory"))?;
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
        // fp8 keys staged as they are; top-channel keys expanded in the tile into fp8 rows.
        let (keep, group) = match batch.key_layout.format() {
            IndexKeyFormat::Fp8 => (0, 0),
            IndexKeyFormat::Channels { keep, group } => (keep, group),
            other => {
                return Err(KernelError::invalid(
                    "index_format",
                    other,
                    "the oracle on CUDA reads fp8 and top-channel keys",
                ));
            }
        };
        let (reqs, max_len, score_end) = super::decode_launch::checked_requests(batch, scores.len())?;
        let n = batch.requests.len();
        if n == 0 || max_len == 0 {
            return Ok(());
        }
        if dim % 16 != 0 || (keep == 0 && kb % 4 != 0) || dim / 16 > ORACLE_MAX_CHUNKS {
            return Err(KernelError::invalid(
                "key_layout.dim",
                dim,
                format!("the oracle on CUDA takes keys of a multiple of 16 dims, at most {}", 16 * ORACLE_MAX_CHUNKS),
            ));
        }
        // Shared memory of the logits: the tile's rows, which then hold its logits (a padded row of
        // heads per position).
        // A staged row is an fp8 key: `dim` codes, then the f32 scale.
        let stride = oracle_tile_stride(dim + 4);
        let (hbs, dc) = (heads.div_ceil(8), dim / 16);
        let smem = (ORACLE_TILE * stride).max(ORACLE_TILE * (heads + 1) * 4);
        if smem > ORACLE_SMEM_MAX {
            return Err(KernelError::invalid(
                "key_layout.dim",
                dim,
                format!("the oracle's tile ({smem} B of shared memory) exceeds {ORACLE_SMEM_MAX} B"),
            ));
        }
        let tiles = max_len.div_ceil(ORACLE_TILE);
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
            tiles: u32_of("requests.seq_len", tiles)?,
            tile_stride: stride as u32,
            chunks: dc as u32,
            // Below 256 each (`IndexKeyLayout::with_format` checks).
            keep: keep as u32,
            group: group as u32,
        };
        let too_big = |what: &'static str| KernelError::invalid("requests.score_offset", score_end, what);
        let logits_len = score_end.checked_mul(heads).ok_or_else(|| too_big("times the heads overflows"))?;
        let partials_len =
            n.checked_mul(tiles).and_then(|x| x.checked_mul(heads * 2)).ok_or_else(|| too_big("partials overflow"))?;
        let [chunks, logits, stats, combine] = self.kernels(dev)?;
        let mut sc = lock(scratch)?;
        let Scratch {
            reqs: rd,
            reqs_c,
            oracle_logits,
            oracle_stats,
            oracle_partials,
            oracle_chunks,
            oracle_queries,
            oracle_scales,
            fault,
            ..
        } = &mut *sc;
        upload_cached(dev, rd, reqs_c, &reqs)?;
        room(dev, oracle_logits, logits_len)?;
        room(dev, oracle_stats, n * heads * 2)?;
        room(dev, oracle_partials, partials_len)?;
        // Each head block's count and list of chunks; its queries, two words per lane and chunk.
        room(dev, oracle_chunks, n * hbs * (dc + 1))?;
        room(dev, oracle_queries, n * hbs * dc * 64)?;
        room(dev, oracle_scales, n * heads)?;
        let s = dev.stream();
        let cfg = |grid: (u32, u32, u32), shared_mem_bytes: u32| LaunchConfig {
            grid_dim: grid,
            block_dim: (ORACLE_THREADS as u32, 1, 1),
            shared_mem_bytes,
        };
        let mut b = PrintedLaunch::new(&dev.print, s, chunks);
        b.arg(batch.queries).params(&args).arg_mut(oracle_chunks).arg_mut(oracle_queries).arg_mut(oracle_scales);
        // SAFETY: queries hold n requests of heads x dim (checked); the lists hold n x head
        // blocks x (chunks + 1) bytes, the fragments n x head blocks x chunks x 64 words, the
        // scales n x heads (sized above).
        unsafe { b.launch(cfg((n as u32, hbs as u32, 1), 0)) }.map_err(driver_error("oracle chunks launch"))?;
        drop(b);
        let mut b = PrintedLaunch::new(&dev.print, s, logits);
        b.arg(batch.weights)
            .arg(batch.keys)
            .arg(batch.page_table)
            .arg(&*rd)
            .params(&args)
            .arg(&*oracle_chunks)
            .arg(&*oracle_queries)
            .arg(&*oracle_scales)
            .arg_mut(oracle_logits)
            .arg_mut(oracle_partials)
            .arg_mut(fault);
        // SAFETY: weights hold n requests (checked), the lists, fragments and scales were written
        // for them by the launch before; every request's page-table entries and score span lie
        // within their buffers (checked), the logits hold a row of heads per score position up
        // to the furthest span and the partials n x tiles x heads pairs (sized above); the shared
        // memory is the size the kernel's layout needs (its rows, then its logits); page ids are
        // checked in the kernel (fault).
        unsafe { b.launch(cfg((tiles as u32, n as u32, 1), smem as u32)) }
            .map_err(driver_error("oracle logits launch"))?;
        drop(b);
        let mut b = PrintedLaunch::new(&dev.print, s, stats);
        b.arg(&*oracle_partials).arg(&*rd).params(&args).arg_mut(oracle_stats);
        // SAFETY: the partials were written for every tile of every request's span; the
        // statistics hold two words per (request, head) (sized above).
        unsafe { b.launch(cfg((heads as u32, n as u32, 1), 0)) }.map_err(driver_error("oracle stats launch"))?;
        drop(b);
        // A warp per 32 positions: a block covers ORACLE_THREADS / 32 x 32 = ORACLE_THREADS.
        let blocks = max_len.div_ceil(ORACLE_THREADS) as u32;
        let mut b = PrintedLaunch::new(&dev.print, s, combine);
        b.arg(&*oracle_logits).arg(&*oracle_stats).arg(&*rd).params(&args).arg_mut(scores);
        // SAFETY: as above; every request's score span lies within `scores` (checked).
        unsafe { b.launch(cfg((blocks, n as u32, 1), 0)) }.map_err(driver_error("oracle combine launch"))?;
        Ok(())
    }
}
