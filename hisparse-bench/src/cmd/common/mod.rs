//! Options shared by the engine commands (`run`, `sweep`, `dump-step`): preset, backend, the
//! hierarchy's config (a `--config` JSON file with SGLang's hisparse-config keys, then flags),
//! the device budget; and building an engine from them. The options and byte counts are here;
//! the config they make is in `hierarchy`, the engines in `build`.

use std::path::PathBuf;

use hisparse_kernels::IndexerQueries;
use hisparse_kernels::MissFillMode;
use hisparse_memory::{IndexKeyFormat, KvGeometry, KvRowFormat, MemoryError, Preset};
use hisparse_policy::{BuiltinPolicy, BuiltinPrefetcher};

use crate::error::{BenchError, Result};

/// What every output of a run without the swap-in's copies (`--miss-fill no-copies`, `sweep
/// --bound`) says of it.
pub const NO_COPIES: &str = "timing only: the swap-in decides but copies no row, so the outputs are wrong";

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

/// Which kernel runs the CUDA attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionKernel {
    /// Hopper's warpgroup MMA (the default: 2.2-3.0x mma.sync at batch 64 on the H200).
    Wgmma,
    /// mma.sync tiles (m16n8k16), without warpgroups.
    MmaSync,
}

/// Which kernels run the CUDA indexer at 32 and 64 heads (other head counts take mma.sync).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IndexerKernel {
    /// Hopper's warpgroup MMA (the default: 1.5x mma.sync at 64 heads, 128k, batch 64 on the H200).
    Wgmma,
    /// mma.sync tiles, without warpgroups.
    MmaSync,
}

/// Options that build an engine.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Model geometry preset: deepseek-v3.2, glm-5.1, glm-5.2 (with IndexShare), cpu-small,
    /// smollm2-135m or llama-3.1-8b.
    #[arg(long, default_value = "cpu-small", value_parser = parse_preset)]
    pub preset: Preset,
    /// Positions each layer selects, 1..=65534 (default: the preset's; with --model or --gguf,
    /// 256). At least every request's length (resident mode), every position is selected and
    /// no selection runs: dense attention, and the device keeps no index keys.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Backend: auto (CUDA where a driver is found, else CPU), cpu, or cuda.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
    /// Launch every layer's kernels one by one instead of replaying layers 1..L as one
    /// captured CUDA graph.
    #[arg(long)]
    pub no_graphs: bool,
    /// CUDA: blocks per request of the top-k — 0 (the default), several for long requests at
    /// small batches (at least 8 chunks of 64k positions or more); 1, always one; more, at most
    /// that many. The selection is the same.
    #[arg(long, default_value_t = 0)]
    pub top_k_blocks: usize,
    /// CUDA: the attention's kernel, warpgroup MMA (the default) or mma.sync; both agree with
    /// the CPU within the same tolerance (each run uses one, so both modes stay bit-identical).
    #[arg(long, value_enum, default_value_t = AttentionKernel::Wgmma)]
    pub attention_kernel: AttentionKernel,
    /// CUDA: the indexer's kernel at 32 and 64 heads, warpgroup MMA (the default) or mma.sync;
    /// scores agree within fp32 rounding (each run uses one).
    #[arg(long, value_enum, default_value_t = IndexerKernel::Wgmma)]
    pub indexer_kernel: IndexerKernel,
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
    /// Eviction policy: lru, fifo, random, clock, clock-cold, s3fifo, mq, score, score-lru
    /// (`hisparse simulate` compares them on a trace).
    #[arg(long, value_enum)]
    pub eviction_policy: Option<BuiltinPolicy>,
    /// Prefetcher: none, shared-index (exact, for IndexShare layers, e.g. --preset glm-5.2),
    /// adjacent-layer, next-step (speculative; CPU backend only for now). On CUDA the prefetches
    /// run on a transfer stream beside the main one.
    #[arg(long, value_enum)]
    pub prefetcher: Option<BuiltinPrefetcher>,
    /// Run CUDA prefetches in order on the main stream instead of the transfer stream (the
    /// same results, without the overlap: for comparison).
    #[arg(long)]
    pub serial_prefetch: bool,
    /// The indexer's queries: exact (default: bf16 as given) or fp8 (quantised per head to
    /// e4m3 with a power-of-two scale, DeepSeek-V3.2's recipe; on CUDA scored on fp8 tensor
    /// cores). Both backends score the same quantised values.
    #[arg(long, default_value = "exact", value_parser = parse_index_queries)]
    pub index_queries: IndexerQueries,
    /// Hybrid placement (`--mode hybrid` or `all`): which requests on the device are demoted
    /// first when admitting another needs their pages — oldest (the earliest admitted) or
    /// largest (the largest reservation).
    #[arg(long, default_value = "oldest", value_parser = parse_demotion)]
    pub demotion: hisparse_engine::DemotionOrder,
    /// Most rows a speculative prefetcher brings into one hot buffer per step (default: a
    /// quarter of top_k).
    #[arg(long)]
    pub prefetch_budget: Option<usize>,
    /// Who brings a layer's missed rows into its hot buffer: swap-in (default: its copy kernel,
    /// before the attention), attention (read from the host tier by the attention as it goes),
    /// deferred (read by the attention, the swap-in run after it on a stream of its own; not
    /// with the score policy), deferred-gather (as deferred, the misses gathered into device
    /// staging rows first for the attention), hits-first (as deferred, the attention over the
    /// hits running while the misses are gathered, then over the misses and an LSE merge: equal
    /// within the attention's bf16 tolerance, not bit for bit), copy-engine (as deferred-gather,
    /// but host threads gather the misses into pinned memory and the copy engine copies them), or
    /// auto (deferred in batches of at most --miss-fill-max-batch requests, the swap-in above);
    /// no-copies is a timing bound (the swap-in decides but copies no row: outputs are wrong),
    /// its decisions placed as auto's: deferred in batches of at most --miss-fill-max-batch.
    /// CUDA; the CPU backend copies in every form but no-copies. Outputs are bit-identical in
    /// every form but hits-first and no-copies.
    #[arg(long, value_enum)]
    pub miss_fill: Option<MissFillMode>,
    /// With --miss-fill auto: the largest batch whose misses the attention fills (default 8);
    /// with no-copies, the largest batch whose decisions are deferred.
    #[arg(long)]
    pub miss_fill_max_batch: Option<usize>,
    /// With --miss-fill copy-engine: the share of a step's selection entries the copy engine
    /// copies per layer (default 0.125); misses past it are read by the scatter kernel.
    #[arg(long)]
    pub copy_engine_share: Option<f64>,
    /// With --miss-fill copy-engine: host threads of the gather (default 0: the cores less two).
    #[arg(long)]
    pub host_gather_threads: Option<usize>,
    /// KV row format: fp8 or bf16 (default: the preset's; MLA rows of 656 or 1152 B).
    #[arg(long, value_parser = parse_kv_format)]
    pub kv_format: Option<KvRowFormat>,
    /// Index key format of a grouped-query geometry (the oracle selecting): fp8, int4
    /// or int2 (4-bit or 2-bit integers, a scale per 32 values), int4:GROUP or int2:GROUP,
    /// pages or pages:TOKENS (page summaries of 16 or TOKENS positions), channels,
    /// channels:KEEP or channels:KEEP:GROUP (each key's KEEP largest of every GROUP values; 16
    /// of 64 by default). Default: fp8 for a preset; for a real model (`--model`, `--gguf`)
    /// the model's (`generate --help` says which). The CPU backend reads all; CUDA fp8, and
    /// a real model's channel keys.
    #[arg(long, value_parser = parse_index_format)]
    pub index_format: Option<IndexKeyFormat>,
    /// Device memory for the KV cache, index keys and hot buffers, e.g. 48MiB, 80GiB
    /// (default: 48MiB for cpu-small; with an emulated model, 90% of the GPU's memory less its
    /// weights and a 4 GiB margin; 64GiB otherwise).
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Back the host tier with this file (the NVMe tier) instead of anonymous memory (CPU
    /// backend only). A new file is created, its space reserved up front, locked while in use
    /// and removed at exit; an existing file is refused.
    #[arg(long)]
    pub host_tier_file: Option<PathBuf>,
    /// Replace an existing --host-tier-file instead of refusing it.
    #[arg(long, requires = "host_tier_file")]
    pub overwrite_host_tier_file: bool,
    /// Keep the --host-tier-file at exit instead of removing it.
    #[arg(long, requires = "host_tier_file")]
    pub keep_host_tier_file: bool,
    /// Seed of the synthetic workload (and of `run --arrival-rate`'s arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Most requests waiting for capacity at once; more are refused (counted as such).
    #[arg(long, default_value_t = hisparse_engine::DEFAULT_MAX_QUEUED)]
    pub max_queued: usize,
    /// The `--config` file's text, read once (a pipe can be read only once; every engine of a
    /// command sees the same config).
    #[arg(skip)]
    pub config_text: std::sync::OnceLock<String>,
}

/// `--kv-format`'s value, parsed once at the edge (clap names the flag; the message names no
/// internal field).
pub fn parse_kv_format(s: &str) -> std::result::Result<KvRowFormat, String> {
    s.parse::<KvRowFormat>().map_err(|_| "expected bf16 or fp8".into())
}

/// `--preset`'s value, parsed once at the edge.
pub fn parse_preset(s: &str) -> std::result::Result<Preset, String> {
    s.parse::<Preset>().map_err(|_| format!("expected one of {}", Preset::names()))
}

/// `--index-format`'s value, parsed once at the edge.
pub fn parse_index_format(s: &str) -> std::result::Result<IndexKeyFormat, String> {
    s.parse::<IndexKeyFormat>().map_err(|_| {
        "expected fp8, int4, int4:GROUP, int2, int2:GROUP, pages, pages:TOKENS, channels, channels:KEEP or \
         channels:KEEP:GROUP"
            .into()
    })
}

/// `--demotion`'s value, parsed once at the edge.
fn parse_demotion(s: &str) -> std::result::Result<hisparse_engine::DemotionOrder, String> {
    hisparse_engine::DemotionOrder::parse(s)
        .ok_or_else(|| format!("expected {}", hisparse_engine::DemotionOrder::NAMES.join(" or ")))
}

/// `--index-queries`' value, parsed once at the edge.
fn parse_index_queries(s: &str) -> std::result::Result<IndexerQueries, String> {
    IndexerQueries::from_name(s).ok_or_else(|| format!("expected {}", IndexerQueries::NAMES.join(" or ")))
}

/// Parses a byte count: a number with an optional unit (B; KiB, MiB, GiB, TiB and K, M, G, T
/// for powers of 1024; KB, MB, GB, TB for powers of 1000); refused unless above 0 and within a
/// 64-bit count.
pub fn parse_bytes(flag: &'static str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| BenchError::flag(flag, s, "expected a number of bytes such as 48MiB, 80GiB or 1TB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024f64.powi(2),
        "gib" | "g" => 1024f64.powi(3),
        "tib" | "t" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(BenchError::flag(flag, s, "unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let bytes = n * mult;
    if !(bytes.is_finite() && bytes >= 1.0) {
        return Err(BenchError::flag(flag, s, "must be at least 1 byte"));
    }
    if bytes >= u64::MAX as f64 {
        return Err(BenchError::flag(flag, s, "beyond a 64-bit byte count"));
    }
    Ok(bytes as u64)
}

impl EngineArgs {
    /// The geometry of the preset, in the chosen row and index key formats, with `--top-k`'s
    /// selection.
    pub fn geometry(&self) -> Result<KvGeometry> {
        let mut g = self.preset.geometry();
        if let Some(f) = self.kv_format {
            g = g.with_kv_format(f);
        }
        if let Some(f) = self.index_format {
            if self.backend == BackendKind::Cuda && f != IndexKeyFormat::Fp8 {
                return Err(BenchError::flag(
                    "index-format",
                    f,
                    "the emulated model writes fp8 index keys on the CUDA backend",
                ));
            }
            if g.kv_heads().is_none() && f != IndexKeyFormat::Fp8 {
                return Err(BenchError::flag(
                    "index-format",
                    f,
                    format!("{}'s lightning indexer reads fp8 keys", g.name),
                ));
            }
            g = g.with_index_format(f).map_err(|e| match e {
                MemoryError::InvalidField { reason, .. } => BenchError::flag("index-format", f, reason),
                e => e.into(),
            })?;
        }
        if let Some(k) = self.top_k {
            // Hisparse holds a step's selection in a hot buffer: top-k within its slots.
            let most = hisparse_memory::slot_table::MAX_BUFFER_SLOTS;
            if k == 0 || k > most {
                return Err(BenchError::flag("top-k", k, format!("must be in 1..={most} (a hot buffer's slots)")));
            }
            g.top_k = k;
        }
        Ok(g)
    }
}

mod build;
mod hierarchy;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("x", "48MiB").unwrap(), 48 << 20);
        assert_eq!(parse_bytes("x", "1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("x", "1000").unwrap(), 1000);
        assert_eq!(parse_bytes("x", "1e3").unwrap(), 1000);
        assert_eq!(parse_bytes("x", "2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("x", "2TB").unwrap(), 2_000_000_000_000);
        assert_eq!(parse_bytes("x", "1TiB").unwrap(), 1 << 40);
        assert!(parse_bytes("x", "12 parsecs").is_err());
        assert!(parse_bytes("x", "-3MiB").is_err());
        assert!(parse_bytes("x", "0.1").is_err(), "below one byte");
        assert!(parse_bytes("x", "1e30").unwrap_err().to_string().contains("64-bit"));
        assert!(parse_bytes("x", "NaN").is_err() && parse_bytes("x", "inf GiB").is_err());
    }
}
