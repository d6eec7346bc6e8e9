//! Engines from the command line: the engine config, the backend (CPU, CUDA, or CUDA when a
//! driver is present) with its kernel choices, the emulated model, and the ranks of a
//! multi-GPU run.

use hisparse_engine::emulated::EmulatedModel;
use hisparse_engine::{DecodeEngine, Engine, EngineConfig};
use hisparse_kernels::{CpuBackend, MissFill};
use hisparse_memory::{KvGeometry, Mode};
use hisparse_policy::HiSparseConfig;

use super::{AttentionKernel, BackendKind, EmulateKind, EngineArgs, IndexerKernel};
use crate::error::{BenchError, Result};
use crate::guard;

impl EngineArgs {
    /// An engine config for `mode`, sized for requests of `typical_tokens` and at most
    /// `longest_tokens` (lengths the user set with `flag`, named if they cannot fit). A resident
    /// engine whose top-k holds the longest request attends to every position: its cache takes
    /// requests up to that length and keeps no index keys (`CacheConfig::keeps_index`).
    pub fn engine_config(
        &self,
        mode: Mode,
        (typical_tokens, longest_tokens): (usize, usize),
        flag: &'static str,
    ) -> Result<EngineConfig> {
        let g = self.geometry()?;
        let hs = self.hisparse(&g)?;
        // Checked as hisparse needs it (host tier, hot buffer and keys): a resident engine is
        // still made where its device cannot hold such a request (it rejects them whole).
        self.check_request_fits(&g, &hs, Mode::HiSparse, flag, typical_tokens, typical_tokens)?;
        let cache = hisparse_engine::CacheConfig {
            hisparse: hs,
            serial_prefetch: self.serial_prefetch,
            index_queries: self.index_queries,
            demotion: self.demotion,
            ..hisparse_engine::CacheConfig::new(g, mode, 0)
        }
        .sized_for(typical_tokens, longest_tokens);
        Ok(EngineConfig {
            cache,
            workload_seed: self.seed,
            capture_digests: false,
            launch_graphs: !self.no_graphs,
            emulated_model: self.emulated_model()?,
            max_queued: guard::at_least_one("max-queued", self.max_queued)?,
            stop: crate::interrupt::engine_stop(),
        })
    }

    /// The CUDA backend's kernel choices.
    fn cuda_knobs(&self) -> CudaKnobs {
        CudaKnobs {
            top_k_blocks: self.top_k_blocks,
            wgmma_attention: self.attention_kernel == AttentionKernel::Wgmma,
            wgmma_indexer: self.indexer_kernel == IndexerKernel::Wgmma,
        }
    }

    /// Whether the engine will run on CUDA (`--backend cuda`, or `auto` with a driver present).
    pub fn uses_cuda(&self) -> bool {
        match self.backend {
            BackendKind::Cpu => false,
            BackendKind::Cuda => true,
            BackendKind::Auto => cuda_driver_present(),
        }
    }

    /// The emulated model, if any (`--emulate-model`).
    pub fn emulated_model(&self) -> Result<Option<EmulatedModel>> {
        let uses_cuda = self.uses_cuda();
        let shape = match self.emulate_model {
            EmulateKind::Off => return Ok(None),
            EmulateKind::Auto if !uses_cuda => return Ok(None),
            EmulateKind::Auto => return Ok(EmulatedModel::preset(self.preset).ok()),
            EmulateKind::On => EmulatedModel::preset(self.preset).map_err(|_| {
                BenchError::flag("emulate-model", "on", format!("preset {} is not a real model", self.preset))
            })?,
        };
        if !uses_cuda {
            // On the CPU the "device" is host memory: refuse weights that cannot fit there.
            crate::cmd::sizing::check_cpu_room(&shape, guard::available_memory().unwrap_or(0))?;
        }
        Ok(Some(shape))
    }

    /// Builds an engine for `mode` on the chosen backend: `auto` takes CUDA where a driver is
    /// found (falling back to the CPU with a note if the GPU cannot be opened), `cuda` fails with
    /// a one-line error where it cannot be used.
    pub fn engine(&self, mode: Mode, lengths: (usize, usize), flag: &'static str) -> Result<Box<dyn DecodeEngine>> {
        let cfg = self.engine_config(mode, lengths, flag)?;
        let fill = self.miss_fill(&cfg.cache.hisparse)?;
        self.build(cfg, 0, fill)
    }

    /// A hisparse engine whose swap-in copies no row (`MissFill::NoCopies`): the timing bound
    /// of `hisparse sweep --bound`, whose outputs are wrong.
    pub fn bound_engine(&self, typical_tokens: usize, flag: &'static str) -> Result<Box<dyn DecodeEngine>> {
        let cfg = self.engine_config(Mode::HiSparse, (typical_tokens, typical_tokens), flag)?;
        let fill = self.miss_fill(&cfg.cache.hisparse)?.bound();
        self.build(cfg, 0, fill)
    }

    /// The engine of rank `rank` of `ranks` (one per GPU, `hisparse sweep --gpus`, `run
    /// --gpus`): on GPU `rank` (CUDA), with its slice of the host memory (whole pages,
    /// `RankPlan`), sized for requests of `typical_tokens` and at most `longest_tokens`.
    pub fn rank_engine(
        &self,
        mode: Mode,
        (typical_tokens, longest_tokens): (usize, usize),
        flag: &'static str,
        rank: usize,
        plan: &hisparse_engine::ranks::RankPlan,
    ) -> Result<Box<dyn DecodeEngine>> {
        let mut cfg = self.engine_config(mode, (typical_tokens, longest_tokens), flag)?;
        cfg.cache.hisparse = plan.share(&cfg.cache.hisparse, longest_tokens);
        let fill = self.miss_fill(&cfg.cache.hisparse)?;
        self.build(cfg, rank, fill)
    }

    /// The host memory divided between `ranks` engines, refused naming `--gpus` where a rank's
    /// share cannot hold one page or a request of `longest` tokens.
    pub fn rank_plan(
        &self,
        g: &KvGeometry,
        hs: &HiSparseConfig,
        ranks: usize,
        longest: usize,
    ) -> Result<hisparse_engine::ranks::RankPlan> {
        let plan = hisparse_engine::ranks::RankPlan::new(ranks, hs.host_bytes(), self.host_page_bytes(g, hs)?)
            .map_err(|e| BenchError::flag("gpus", ranks, e.to_string()))?;
        let share = plan.share(hs, longest);
        self.check_request_fits(g, &share, Mode::HiSparse, "gpus", ranks, longest).map_err(|e| match e {
            BenchError::Flag { reason, .. } => {
                BenchError::flag("gpus", ranks, format!("a GPU's share of the host memory is too small: {reason}"))
            }
            e => e,
        })?;
        Ok(plan)
    }

    /// Bytes of one host page of every layer (what `RankPlan` divides the host memory in).
    pub fn host_page_bytes(&self, g: &KvGeometry, hs: &HiSparseConfig) -> Result<u64> {
        let row = g.kv_row()?.row_bytes() as u64;
        (hs.page_tokens as u64)
            .checked_mul(row)
            .and_then(|b| b.checked_mul(g.layers as u64))
            .ok_or_else(|| BenchError::flag("config", "page_tokens", "a host page's bytes overflow"))
    }

    /// The engine of `cfg` on GPU `ordinal` (or the CPU), its backend filling misses as `fill`.
    fn build(&self, cfg: EngineConfig, ordinal: usize, fill: MissFill) -> Result<Box<dyn DecodeEngine>> {
        let driver = cuda_driver_present();
        let cpu = || CpuBackend::new().with_miss_fill(fill);
        match self.backend {
            BackendKind::Cpu => Ok(Box::new(Engine::new(cpu()?, cfg)?)),
            BackendKind::Auto if !driver => Ok(Box::new(Engine::new(cpu()?, cfg)?)),
            BackendKind::Cuda if !driver => {
                Err(BenchError::flag("backend", "cuda", "no CUDA driver (libcuda.so) on this machine"))
            }
            BackendKind::Auto | BackendKind::Cuda => match cuda_engine(cfg.clone(), ordinal, self.cuda_knobs(), fill) {
                Ok(e) => Ok(e),
                Err(e) if self.backend == BackendKind::Auto => {
                    crate::console::note(&format!(
                        "hisparse: the CUDA backend could not start ({e}); running on the CPU"
                    ));
                    Ok(Box::new(Engine::new(cpu()?, cfg)?))
                }
                Err(e) => Err(BenchError::flag("backend", "cuda", e.to_string())),
            },
        }
    }
}

/// The CUDA backend's kernel choices from the command line.
#[derive(Clone, Copy, Debug)]
// Read only by the CUDA backend's constructor (a build without `cuda` refuses `--backend cuda`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct CudaKnobs {
    top_k_blocks: usize,
    wgmma_attention: bool,
    wgmma_indexer: bool,
}

#[cfg(feature = "cuda")]
fn cuda_engine(
    cfg: EngineConfig,
    ordinal: usize,
    knobs: CudaKnobs,
    fill: MissFill,
) -> std::result::Result<Box<dyn DecodeEngine>, String> {
    let be = cuda_backend(ordinal, knobs, fill)?;
    Ok(Box::new(Engine::new(be, cfg).map_err(|e| e.to_string())?))
}

/// The CUDA backend on GPU `ordinal` with the command line's kernel choices and miss-fill form.
#[cfg(feature = "cuda")]
fn cuda_backend(
    ordinal: usize,
    knobs: CudaKnobs,
    fill: MissFill,
) -> std::result::Result<hisparse_kernels::cuda::CudaBackend, String> {
    hisparse_kernels::cuda::CudaBackend::new(ordinal)
        .map_err(|e| e.to_string())?
        .with_top_k_blocks(knobs.top_k_blocks)
        .with_wgmma_attention(knobs.wgmma_attention)
        .with_wgmma_indexer(knobs.wgmma_indexer)
        .with_miss_fill(fill)
        .map_err(|e| e.to_string())
}

#[cfg(feature = "cuda")]
impl EngineArgs {
    /// The CUDA backend of GPU 0 for a cache of `hs` (`--backend cuda`; a real model's engine),
    /// failing with a message naming `--backend`.
    pub fn cuda_backend(&self, hs: &HiSparseConfig) -> Result<hisparse_kernels::cuda::CudaBackend> {
        if !cuda_driver_present() {
            return Err(BenchError::flag("backend", "cuda", "no CUDA driver (libcuda.so) on this machine"));
        }
        cuda_backend(0, self.cuda_knobs(), self.miss_fill(hs)?).map_err(|e| BenchError::flag("backend", "cuda", e))
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_engine(
    _cfg: EngineConfig,
    _ordinal: usize,
    _knobs: CudaKnobs,
    _fill: MissFill,
) -> std::result::Result<Box<dyn DecodeEngine>, String> {
    Err("this build has no CUDA support (feature `cuda`)".into())
}

#[cfg(feature = "cuda")]
fn cuda_driver_present() -> bool {
    hisparse_kernels::cuda::driver_available()
}

#[cfg(not(feature = "cuda"))]
fn cuda_driver_present() -> bool {
    false
}
