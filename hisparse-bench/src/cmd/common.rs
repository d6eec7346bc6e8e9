//! Options shared by the engine commands (`run`, `sweep`, `dump-step`): preset, backend, the
//! hierarchy's config (a `--config` JSON file with SGLang's hisparse-config keys, then flags),
//! the device budget; and building an engine from them.

use std::path::PathBuf;

use hisparse_engine::{DecodeEngine, Engine, EngineConfig, ModelShape};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{KvGeometry, KvRowFormat, Mode};
use hisparse_policy::HiSparseConfig;

use crate::error::{BenchError, Result};

/// Which backend runs the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// CUDA where a driver is found, else the CPU.
    Auto,
    /// The CPU backend (exact reference kernels, rayon).
    Cpu,
    /// The CUDA backend.
    Cuda,
}

/// Whether the model's non-attention layers are emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmulateKind {
    /// On where the backend is CUDA and the preset is a real model (glm-5.1, deepseek-v3.2).
    Auto,
    /// Always (the preset must be a real model).
    On,
    /// Never: attention alone.
    Off,
}

/// Options that build an engine.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Model geometry preset (deepseek-v3.2, glm-5.1, cpu-small).
    #[arg(long, default_value = "cpu-small")]
    pub preset: String,
    /// Backend: auto (CUDA where a driver is found, else CPU), cpu, or cuda.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// Launch every layer's kernels one by one instead of replaying layers 1..L as one
    /// captured CUDA graph.
    #[arg(long)]
    pub no_graphs: bool,
    /// Emulate the model's non-attention layers (projections, dense FFN, MoE experts) with
    /// cuBLAS GEMMs on random weights of one GPU's share of an 8-GPU deployment, occupying
    /// the HBM they would.
    #[arg(long, value_enum, default_value_t = EmulateKind::Auto)]
    pub emulate_model: EmulateKind,
    /// A JSON file with SGLang's hisparse-config keys (top_k, device_buffer_size,
    /// host_to_device_ratio, swap_in_block_size) and ours; flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Regular hot-buffer slots per request and layer (default: twice the preset's top_k).
    #[arg(long)]
    pub device_buffer_size: Option<usize>,
    /// Host-tier bytes as a multiple of the device KV budget.
    #[arg(long)]
    pub host_to_device_ratio: Option<f64>,
    /// Threads per request block of the GPU swap-in kernel (1..=1024).
    #[arg(long)]
    pub swap_in_block_size: Option<usize>,
    /// Eviction policy: lru, fifo, random, clock.
    #[arg(long)]
    pub eviction_policy: Option<String>,
    /// KV row format: fp8 (656 B rows) or bf16 (1152 B rows).
    #[arg(long, value_parser = ["fp8", "bf16"])]
    pub kv_format: Option<String>,
    /// Device memory for the KV cache, index keys and hot buffers, e.g. 48MiB, 80GiB
    /// (default: 48MiB for cpu-small; with an emulated model, 90% of the GPU's memory less its
    /// weights and a 4 GiB margin; 64GiB otherwise).
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Back the host tier with this file (the NVMe tier) instead of anonymous memory.
    #[arg(long)]
    pub host_tier_file: Option<PathBuf>,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Parses a byte count: a number with an optional unit (B, KiB, MiB, GiB, KB, MB, GB).
pub fn parse_bytes(flag: &'static str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| BenchError::flag(flag, s, "expected a number of bytes such as 48MiB or 80GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        _ => return Err(BenchError::flag(flag, s, "unknown unit (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(BenchError::flag(flag, s, "must be above 0"));
    }
    Ok((n * mult) as u64)
}

impl EngineArgs {
    /// The geometry of the preset, in the chosen row format.
    pub fn geometry(&self) -> Result<KvGeometry> {
        let mut g = KvGeometry::preset(&self.preset)?;
        if let Some(f) = &self.kv_format {
            g = g.with_kv_format(f.parse::<KvRowFormat>()?);
        }
        Ok(g)
    }

    /// The hierarchy's config: file, then flags, checked against the geometry.
    pub fn hisparse(&self, g: &KvGeometry) -> Result<HiSparseConfig> {
        let mut c = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|source| BenchError::Io { path: p.display().to_string(), source })?;
                HiSparseConfig::from_json(&text)?
            }
            None => HiSparseConfig::for_geometry(g),
        };
        if let Some(v) = self.device_buffer_size {
            c.device_buffer_size = v;
        }
        if let Some(v) = self.host_to_device_ratio {
            c.host_to_device_ratio = v;
        }
        if let Some(v) = self.swap_in_block_size {
            c.swap_in_block_size = v;
        }
        if let Some(v) = &self.eviction_policy {
            c.eviction_policy = v.clone();
        }
        if let Some(p) = &self.host_tier_file {
            c.host_tier_path = Some(p.clone());
        }
        let default = if g.name == "cpu-small" { 48u64 << 20 } else { 64u64 << 30 };
        c.device_kv_bytes = match (&self.device_memory, self.model()?) {
            (Some(s), _) => parse_bytes("device-memory", s)?,
            (None, _) if c.device_kv_bytes > 0 => c.device_kv_bytes,
            (None, Some(m)) if self.uses_cuda() => super::sizing::device_kv_budget(m.weight_bytes())?,
            (None, _) => default,
        };
        if self.host_to_device_ratio.is_none()
            && let Some(avail) = super::sizing::host_available()
        {
            // The default ratio may ask for more host memory than there is: shrink it to fit.
            c.host_to_device_ratio =
                c.host_to_device_ratio.min(super::sizing::host_ratio_cap(c.device_kv_bytes, avail));
        }
        c.validate(g)?;
        Ok(c)
    }

    /// An engine config for `mode`, sized for requests of `typical_tokens`.
    pub fn engine_config(&self, mode: Mode, typical_tokens: usize) -> Result<EngineConfig> {
        let g = self.geometry()?;
        let mut hs = self.hisparse(&g)?;
        hs.max_request_tokens = hs.max_request_tokens.max(typical_tokens);
        Ok(EngineConfig {
            geometry: g,
            mode,
            hisparse: hs,
            workload_seed: self.seed,
            typical_tokens,
            capture_digests: false,
            backup_delay: None,
            launch_graphs: !self.no_graphs,
            model: self.model()?,
        })
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
    pub fn model(&self) -> Result<Option<ModelShape>> {
        let uses_cuda = self.uses_cuda();
        let shape = match self.emulate_model {
            EmulateKind::Off => return Ok(None),
            EmulateKind::Auto if !uses_cuda => return Ok(None),
            EmulateKind::Auto => return Ok(ModelShape::preset(&self.preset).ok()),
            EmulateKind::On => ModelShape::preset(&self.preset).map_err(|_| {
                BenchError::flag("emulate-model", "on", format!("preset {} is not a real model", self.preset))
            })?,
        };
        if !uses_cuda {
            // On the CPU the "device" is host memory: refuse weights that cannot fit there.
            super::sizing::check_cpu_room(&shape, super::sizing::host_available().unwrap_or(0))?;
        }
        Ok(Some(shape))
    }

    /// Builds an engine for `mode` on the chosen backend: `auto` takes CUDA where a driver is
    /// found (falling back to the CPU with a note if the GPU cannot be opened), `cuda` fails with
    /// a one-line error where it cannot be used.
    pub fn engine(&self, mode: Mode, typical_tokens: usize) -> Result<Box<dyn DecodeEngine>> {
        let cfg = self.engine_config(mode, typical_tokens)?;
        let driver = cuda_driver_present();
        match self.backend {
            BackendKind::Cpu => Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?)),
            BackendKind::Auto if !driver => Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?)),
            BackendKind::Cuda if !driver => {
                Err(BenchError::flag("backend", "cuda", "no CUDA driver (libcuda.so) on this machine"))
            }
            BackendKind::Auto | BackendKind::Cuda => match cuda_engine(cfg.clone()) {
                Ok(e) => Ok(e),
                Err(e) if self.backend == BackendKind::Auto => {
                    eprintln!("hisparse: the CUDA backend could not start ({e}); running on the CPU");
                    Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?))
                }
                Err(e) => Err(BenchError::flag("backend", "cuda", e.to_string())),
            },
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_engine(cfg: EngineConfig) -> std::result::Result<Box<dyn DecodeEngine>, String> {
    let be = hisparse_kernels::cuda::CudaBackend::new(0).map_err(|e| e.to_string())?;
    Ok(Box::new(Engine::new(be, cfg).map_err(|e| e.to_string())?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_engine(_cfg: hisparse_engine::EngineConfig) -> std::result::Result<Box<dyn DecodeEngine>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("x", "48MiB").unwrap(), 48 << 20);
        assert_eq!(parse_bytes("x", "1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("x", "1000").unwrap(), 1000);
        assert_eq!(parse_bytes("x", "2GB").unwrap(), 2_000_000_000);
        assert!(parse_bytes("x", "12 parsecs").is_err());
        assert!(parse_bytes("x", "-3MiB").is_err());
    }
}
