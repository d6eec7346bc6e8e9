//! The decode kernels' launches of [`CudaBackend`]: the indexer (its kernels and which one a call
//! takes) and top-k, their kernel-argument structs, and the host-side checks that run before anything is launched (the attention's are
//! in `attention_launch.rs`).

use super::facts::{GpuIndexerReq, GpuSpan};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use hisparse_memory::cuda::CudaMemory;

use std::sync::{Arc, Mutex};

use super::buffers::{lock, upload_cached};
use super::facts::TOPK_SMEM;
use super::printed_launch::PrintedLaunch;
use super::scratch::Scratch;
use super::topk_launch::TopKSplit;
use super::{CudaDevice, driver_error};
use crate::IndexerQueries;
use crate::batch::{IndexerBatch, Span};
use crate::error::{KernelError, Result, check_len};

/// Most indexer heads (shared memory of the query fragments).
pub(crate) const MAX_INDEX_HEADS: usize = 256;

/// Shared memory of the indexer: query fragments (`frag_bytes` a head) and weights, two staging
/// tiles per warp.
fn indexer_smem(heads: usize, frag_bytes: usize) -> usize {
    heads * (frag_bytes + 4) + 4 * 2 * 32 * 33 * 4
}

/// Which mma.sync kernel scores fp8 queries of 32 or 64 heads: the one for any multiple of 8
/// heads, or the one compiled for that count (head tiles unrolled, five blocks per SM). The
/// scores are the same either way. Consulted only where the warpgroup-MMA indexer does not run
/// ([`super::CudaBackend::with_wgmma_indexer`] off, or pages not a multiple of 64 positions).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FixedHeadIndexer {
    /// The fixed-head kernel for 32 heads, the any-count one for 64: the faster of each pair on
    /// the H200 (32 heads, 128k, batch 64: 73% of the HBM copy against 69%; 64 heads: 43%
    /// against 44%; BENCHMARKS.md).
    #[default]
    Auto,
    /// The fixed-head kernels for 32 and 64 heads.
    Always,
    /// The any-count kernel for every head count.
    Never,
}

impl FixedHeadIndexer {
    fn code(self) -> u8 {
        match self {
            Self::Auto => 0,
            Self::Always => 1,
            Self::Never => 2,
        }
    }
}

/// Shared memory of the warpgroup-MMA indexer (`kernels/indexer_wgmma.cu`): the queries as f16
/// and the weights, then `WGI_STAGES` staging tiles of 64 key rows.
fn indexer_wg_smem(heads: usize) -> usize {
    heads * 256 + heads * 4 + super::facts::WGI_STAGES * super::facts::WGI_TILE
}

/// The indexer's kernels: exact and fp8 queries for any multiple of 8 heads, the fp8 form
/// compiled for 32 and 64 heads, and the warpgroup-MMA forms for 32 and 64 heads.
pub(crate) struct IndexerKernels {
    exact: CudaFunction,
    fp8: CudaFunction,
    fp8_h32: CudaFunction,
    fp8_h64: CudaFunction,
    /// `kernels/indexer_wgmma.cu`: [exact, fp8] x [32, 64 heads].
    wg: [[CudaFunction; 2]; 2],
    /// Blocks of each `wg` kernel one SM holds (the driver's figure; at least 1).
    wg_per_sm: [[usize; 2]; 2],
    /// Where the fixed-head fp8 forms are used ([`FixedHeadIndexer::code`]).
    fixed_heads: AtomicU8,
    /// Whether 32 and 64 heads over pages of a multiple of 64 positions take the warpgroup-MMA
    /// forms (before any other choice).
    wgmma: AtomicBool,
}

impl IndexerKernels {
    /// The kernels of `dev`'s indexer module, with their shared memory opted in.
    pub(crate) fn load(dev: &CudaDevice) -> Result<Self> {
        let mut k = Self {
            exact: dev.function("indexer", "indexer_scores")?,
            fp8: dev.function("indexer", "indexer_scores_fp8")?,
            fp8_h32: dev.function("indexer", "indexer_scores_fp8_h32")?,
            fp8_h64: dev.function("indexer", "indexer_scores_fp8_h64")?,
            wg: [
                [dev.function("indexer", "indexer_scores_wg_h32")?, dev.function("indexer", "indexer_scores_wg_h64")?],
                [
                    dev.function("indexer", "indexer_scores_fp8_wg_h32")?,
                    dev.function("indexer", "indexer_scores_fp8_wg_h64")?,
                ],
            ],
            wg_per_sm: [[1; 2]; 2],
            fixed_heads: AtomicU8::new(FixedHeadIndexer::Auto.code()),
            wgmma: AtomicBool::new(true),
        };
        for (q, forms) in k.wg.iter().enumerate() {
            for (h, f) in forms.iter().enumerate() {
                let smem = indexer_wg_smem(32 << h);
                f.set_attribute(
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(driver_error("indexer shared memory opt-in"))?;
                let per_sm = f
                    .occupancy_max_active_blocks_per_multiprocessor(128, smem, None)
                    .map_err(driver_error("indexer occupancy"))?;
                k.wg_per_sm[q][h] = (per_sm as usize).max(1);
            }
        }
        for (f, smem) in [
            (&k.exact, indexer_smem(MAX_INDEX_HEADS, 256)),
            (&k.fp8, indexer_smem(MAX_INDEX_HEADS, 256)),
            (&k.fp8_h32, indexer_smem(32, 128)),
            (&k.fp8_h64, indexer_smem(64, 128)),
        ] {
            f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
                .map_err(driver_error("indexer shared memory opt-in"))?;
        }
        Ok(k)
    }

    /// Sets where the fixed-head fp8 forms are used (later launches).
    pub(crate) fn set_fixed_heads(&self, choice: FixedHeadIndexer) {
        self.fixed_heads.store(choice.code(), Ordering::Relaxed);
    }

    /// Sets whether the warpgroup-MMA forms are used where they apply (later launches).
    pub(crate) fn set_wgmma(&self, on: bool) {
        self.wgmma.store(on, Ordering::Relaxed);
    }

    /// The warpgroup-MMA form for `heads` heads of `queries_as` queries over pages of
    /// `page_tokens` positions, and its dynamic shared memory, where it applies and is chosen.
    /// Also the kernel's blocks per SM.
    fn pick_wg(
        &self,
        heads: usize,
        queries_as: IndexerQueries,
        page_tokens: usize,
    ) -> Option<(&CudaFunction, usize, usize)> {
        let h = match heads {
            32 => 0,
            64 => 1,
            _ => return None,
        };
        if !self.wgmma.load(Ordering::Relaxed) || !page_tokens.is_multiple_of(64) {
            return None;
        }
        let q = usize::from(queries_as == IndexerQueries::Fp8);
        Some((&self.wg[q][h], indexer_wg_smem(heads), self.wg_per_sm[q][h]))
    }

    /// The kernel for `heads` heads of `queries_as` queries, and its dynamic shared memory.
    fn pick(&self, heads: usize, queries_as: IndexerQueries) -> (&CudaFunction, usize) {
        let choice = self.fixed_heads.load(Ordering::Relaxed);
        let (auto, always) = (FixedHeadIndexer::Auto.code(), FixedHeadIndexer::Always.code());
        match (queries_as, heads) {
            (IndexerQueries::Exact, _) => (&self.exact, indexer_smem(heads, 256)),
            (IndexerQueries::Fp8, 32) if choice == auto || choice == always => (&self.fp8_h32, indexer_smem(32, 128)),
            (IndexerQueries::Fp8, 64) if choice == always => (&self.fp8_h64, indexer_smem(64, 128)),
            (IndexerQueries::Fp8, _) => (&self.fp8, indexer_smem(heads, 256)),
        }
    }
}

/// `batch`'s requests as the indexer kernels read them, checked: the page size, the queries and
/// weights against the requests, the key pool in whole pages, each request's pages within the
/// page table and its scores within `scores_len` (checked sums), every field within 32 bits
/// (the key format is the caller's to check: [`refuse_unread_format`], or the oracle's own).
/// With the longest request and the end of the furthest score span.
pub(crate) fn checked_requests(
    batch: &IndexerBatch<'_, CudaMemory>,
    scores_len: usize,
) -> Result<(Vec<GpuIndexerReq>, usize, usize)> {
    let (heads, dim, p) = (batch.heads, batch.key_layout.dim(), batch.page_tokens);
    if p == 0 {
        return Err(KernelError::invalid("page_tokens", p, "must be at least 1"));
    }
    let n = batch.requests.len();
    check_len("queries", n * heads * dim, batch.queries.len())?;
    check_len("weights", n * heads, batch.weights.len())?;
    let (mut reqs, mut max_len, mut score_end) = (Vec::with_capacity(n), 0usize, 0usize);
    let fit = |x: usize, f| u32::try_from(x).map_err(|_| KernelError::invalid(f, x, "must fit in 32 bits"));
    for (i, r) in batch.requests.iter().enumerate() {
        let pages = r.first_page.checked_add(r.seq_len.div_ceil(p));
        if pages.is_none_or(|end| end > batch.page_table.len()) {
            return Err(KernelError::invalid(
                "requests.first_page",
                r.first_page,
                format!("request {i}: pages leave the page table"),
            ));
        }
        let end = r.score_offset.checked_add(r.seq_len);
        let Some(end) = end.filter(|&end| end <= scores_len) else {
            return Err(KernelError::invalid(
                "requests.score_offset",
                r.score_offset,
                format!("request {i}: scores leave the output"),
            ));
        };
        reqs.push(GpuIndexerReq {
            first_page: fit(r.first_page, "requests.first_page")?,
            seq_len: fit(r.seq_len, "requests.seq_len")?,
            score_offset: fit(r.score_offset, "requests.score_offset")?,
            pad: 0,
        });
        max_len = max_len.max(r.seq_len);
        score_end = score_end.max(end);
    }
    Ok((reqs, max_len, score_end))
}

/// What the indexer and top-k launches use of the backend.
pub(crate) struct DecodeLaunch<'a> {
    pub(crate) dev: &'a Arc<CudaDevice>,
    pub(crate) scratch: &'a Mutex<Scratch>,
    pub(crate) sms: usize,
    pub(crate) indexer: &'a IndexerKernels,
    pub(crate) top_k: &'a CudaFunction,
    pub(crate) top_k_split: &'a TopKSplit,
}

impl DecodeLaunch<'_> {
    pub(crate) fn launch_indexer(
        &self,
        batch: &IndexerBatch<'_, CudaMemory>,
        scores: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (heads, dim, kb, p) =
            (batch.heads, batch.key_layout.dim(), batch.key_layout.row_bytes(), batch.page_tokens);
        if batch.score != crate::IndexScore::Lightning {
            return Err(KernelError::invalid(
                "score",
                format!("{:?}", batch.score),
                "this launch computes the lightning score (the backend sends the oracle to oracle_launch.rs)",
            ));
        }
        if heads == 0 || !heads.is_multiple_of(8) {
            return Err(KernelError::invalid("heads", heads, "the CUDA indexer needs a multiple of 8"));
        }
        if dim != 128 {
            return Err(KernelError::invalid("key_layout.dim", dim, "the CUDA indexer is built for 128"));
        }
        refuse_unread_format(batch.key_layout)?;
        let (reqs, max_len, _) = checked_requests(batch, scores.len())?;
        let (n, pool_pages) = (batch.requests.len(), batch.keys.len() / (kb * p));
        if n == 0 || max_len == 0 {
            return Ok(());
        }
        let mut sc = lock(self.scratch)?;
        let Scratch { reqs: rd, reqs_c, .. } = &mut *sc;
        upload_cached(self.dev, rd, reqs_c, &reqs)?;
        let s = self.dev.stream();
        // About four blocks per SM in all; each warp then walks many 32-position chunks.
        let chunks = max_len.div_ceil(32);
        // At most one wave of four blocks per SM (a second, nearly empty wave would double the time).
        let per_request = (4 * self.sms / n).clamp(1, chunks.div_ceil(4));
        if heads > MAX_INDEX_HEADS {
            return Err(KernelError::invalid(
                "heads",
                heads,
                format!("the CUDA indexer takes at most {MAX_INDEX_HEADS}"),
            ));
        }
        let (f, smem, per_request) = match self.indexer.pick_wg(heads, batch.queries_as, p) {
            // A warpgroup takes 64 positions at a time; one wave of as many blocks as the SMs hold
            // (a second, partial wave would idle most SMs for a whole block's time: 1.2 waves
            // measured as slow as two), at least eight chunks a block, so that its queries'
            // setup is a small share of its work.
            Some((f, smem, per_sm)) => (f, smem, (per_sm * self.sms / n).clamp(1, max_len.div_ceil(64).div_ceil(8))),
            None => {
                let (f, smem) = self.indexer.pick(heads, batch.queries_as);
                (f, smem, per_request)
            }
        };
        let cfg = LaunchConfig {
            grid_dim: (per_request as u32, n as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (h, pt, pp, pin) = (heads as u32, p as u32, pool_pages as u32, u32::from(batch.pin_newest));
        let Scratch { fault, reqs: reqs_d, .. } = &mut *sc;
        let mut b = PrintedLaunch::new(&self.dev.print, s, f);
        b.arg(batch.queries)
            .arg(batch.weights)
            .arg(batch.keys)
            .arg(batch.page_table)
            .arg(&*reqs_d)
            .arg_mut(scores)
            .arg(&h)
            .arg(&pt)
            .arg(&pp)
            .arg(&pin)
            .arg_mut(fault);
        // SAFETY: queries/weights hold n requests (checked); every request's page-table entries
        // and score span lie within their buffers (checked); page ids are checked in the kernel.
        unsafe { b.launch(cfg) }.map_err(driver_error("indexer launch"))?;
        Ok(())
    }

    pub(crate) fn launch_top_k(
        &self,
        scores: &CudaSlice<f32>,
        spans: &[Span],
        k: usize,
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        if out.len() < spans.len() * k {
            return Err(KernelError::invalid("out", out.len(), format!("{} spans of top-{k} need more", spans.len())));
        }
        crate::cpu::check_top_k_spans(spans, k, scores.len())?;
        if k == 0 || spans.is_empty() {
            return Ok(());
        }
        let n = spans.len();
        let host: Vec<GpuSpan> = spans.iter().map(|s| GpuSpan { offset: s.offset as u64, len: s.len as u64 }).collect();
        let mut sc = lock(self.scratch)?;
        let Scratch { spans: sd, spans_c, .. } = &mut *sc;
        upload_cached(self.dev, sd, spans_c, &host)?;
        let longest = spans.iter().map(|s| s.len).max().unwrap_or(0);
        if let Some(chunks) = self.top_k_split.choice.choose(n, longest) {
            return self.top_k_split.launch(self.dev, scores, (&sc.spans, &host), k, chunks, out);
        }
        let s = self.dev.stream();
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (super::facts::TOPK_THREADS as u32, 1, 1),
            shared_mem_bytes: TOPK_SMEM as u32,
        };
        let k32 = k as u32;
        let mut b = PrintedLaunch::new(&self.dev.print, s, self.top_k);
        b.arg(scores).arg(&sc.spans).arg(&k32).arg_mut(out);
        // SAFETY: every span lies within `scores` and `out` holds at least n * k positions
        // (checked).
        unsafe { b.launch(cfg) }.map_err(driver_error("top-k launch"))?;
        Ok(())
    }
}

/// The CUDA kernels read fp8 index keys (the oracle top-channel keys too; the CPU backend reads
/// every format).
pub(crate) fn refuse_unread_format(key: hisparse_memory::IndexKeyLayout) -> Result<()> {
    match key.format() {
        hisparse_memory::IndexKeyFormat::Fp8 => Ok(()),
        other => Err(KernelError::invalid("index_format", other, "the CUDA backend reads fp8 index keys here")),
    }
}

#[cfg(test)]
mod tests {
    use hisparse_memory::{IndexKeyFormat, IndexKeyLayout};

    #[test]
    fn the_cuda_kernels_refuse_index_keys_they_cannot_read_by_name() {
        assert!(super::refuse_unread_format(IndexKeyLayout::new(128).unwrap()).is_ok());
        let int4 = IndexKeyLayout::with_format(128, IndexKeyFormat::Int4 { group: 32 }).unwrap();
        let e = super::refuse_unread_format(int4).unwrap_err().to_string();
        assert!(e.contains("index_format") && e.contains("int4:32"), "{e}");
    }
}
