//! Options shared by the engine commands (`run`, `sweep`, `dump-step`): preset, backend, the
//! hierarchy's config (a `--config` JSON file with SGLang's hisparse-config keys, then flags),
//! the device budget; and building an engine from them.

use std::path::PathBuf;

use hisparse_engine::{DecodeEngine, Engine, EngineConfig, ModelShape};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{KvGeometry, KvRowFormat, MemoryError, Mode};
use hisparse_policy::{BuiltinPolicy, BuiltinPrefetcher, HiSparseConfig, MissFill, MissFillMode, PolicyError};

use crate::error::{BenchError, Result};
use crate::guard;

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
    /// Model geometry preset (deepseek-v3.2, glm-5.1, glm-5.2 with IndexShare, cpu-small).
    #[arg(long, default_value = "cpu-small")]
    pub preset: String,
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
    #[arg(long, default_value = "exact", value_parser = ["exact", "fp8"])]
    pub index_queries: String,
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
    /// KV row format: fp8 (656 B rows) or bf16 (1152 B rows).
    #[arg(long, value_parser = ["fp8", "bf16"])]
    pub kv_format: Option<String>,
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

/// The flag that sets config field `field`, if there is one.
fn flag_of(field: &str) -> Option<&'static str> {
    Some(match field {
        "device_buffer_size" => "device-buffer-size",
        "host_to_device_ratio" => "host-to-device-ratio",
        "swap_in_block_size" => "swap-in-block-size",
        "eviction_policy" => "eviction-policy",
        "prefetcher" => "prefetcher",
        "prefetch_budget" => "prefetch-budget",
        "miss_fill" => "miss-fill",
        "copy_engine_share" => "copy-engine-share",
        "host_gather_threads" => "host-gather-threads",
        "host_tier_file" | "host_tier_path" => "host-tier-file",
        _ => return None,
    })
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

    /// Whether the user set config field `field` with its flag.
    fn flag_given(&self, field: &str) -> bool {
        match field {
            "device_buffer_size" => self.device_buffer_size.is_some(),
            "host_to_device_ratio" => self.host_to_device_ratio.is_some(),
            "swap_in_block_size" => self.swap_in_block_size.is_some(),
            "eviction_policy" => self.eviction_policy.is_some(),
            "prefetcher" => self.prefetcher.is_some(),
            "prefetch_budget" => self.prefetch_budget.is_some(),
            "miss_fill" => self.miss_fill.is_some(),
            "miss_fill_max_batch" => self.miss_fill_max_batch.is_some(),
            "copy_engine_share" => self.copy_engine_share.is_some(),
            "host_gather_threads" => self.host_gather_threads.is_some(),
            "host_tier_file" | "host_tier_path" => self.host_tier_file.is_some(),
            _ => false,
        }
    }

    /// The miss-fill form of the flags over `base` (the preset's or the config file's): the mode
    /// and each parameter the flags give, the rest from `base`; a parameter of another mode is
    /// refused naming its flag.
    fn miss_fill_over(&self, base: MissFill) -> Result<MissFill> {
        let mode = self.miss_fill.unwrap_or(base.mode());
        let max_batch = match base {
            MissFill::Auto { max_batch } | MissFill::NoCopies { max_batch } => max_batch,
            _ => MissFill::DEFAULT_MAX_BATCH,
        };
        let (share, threads) = base.copy_engine().unwrap_or((MissFill::DEFAULT_SHARE, 0));
        let (batched, engine) = (&[MissFillMode::Auto, MissFillMode::NoCopies][..], &[MissFillMode::CopyEngine][..]);
        for (flag, given, of) in [
            ("miss-fill-max-batch", self.miss_fill_max_batch.map(|v| v.to_string()), batched),
            ("copy-engine-share", self.copy_engine_share.map(|v| format!("{v:?}")), engine),
            ("host-gather-threads", self.host_gather_threads.map(|v| v.to_string()), engine),
        ] {
            if let Some(v) = given.filter(|_| !of.contains(&mode)) {
                let of = of.iter().map(ToString::to_string).collect::<Vec<_>>().join(" or ");
                return Err(BenchError::flag(flag, v, format!("applies to --miss-fill {of}, not {mode}")));
            }
        }
        Ok(MissFill::new(
            mode,
            self.miss_fill_max_batch.unwrap_or(max_batch),
            self.copy_engine_share.unwrap_or(share),
            self.host_gather_threads.unwrap_or(threads),
        ))
    }

    /// The `--config` file's text (read on first use) and the keys it sets.
    fn config_file(&self) -> Result<Option<(&std::path::Path, String, Vec<String>)>> {
        let Some(p) = &self.config else { return Ok(None) };
        let text = match self.config_text.get() {
            Some(t) => t,
            None => {
                let t = crate::files::input::read_config("config", p)?;
                self.config_text.get_or_init(|| t)
            }
        };
        let keys = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default();
        Ok(Some((p.as_path(), text.clone(), keys)))
    }

    /// The error for a size that several inputs set (`--flag` or config `key`): by the flag
    /// if the user gave it, else by the config key if the file set it, else by the flag that
    /// would change the preset's default.
    fn size_error(&self, sources: &[(&'static str, Option<String>, &str)], reason: &str) -> Result<BenchError> {
        if let Some((flag, Some(v), _)) = sources.iter().find(|s| s.1.is_some()) {
            return Ok(BenchError::flag(flag, v, reason.to_string()));
        }
        if let Some((path, text, keys)) = self.config_file()?
            && let Some(key) = sources.iter().map(|s| s.2).find(|k| keys.iter().any(|x| x == k))
        {
            let v = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get(key).map(ToString::to_string))
                .unwrap_or_default();
            return Ok(BenchError::flag("config", path.display(), format!("{key} = {v}: {reason}")));
        }
        let flag = sources.first().map_or("device-memory", |s| s.0);
        Ok(BenchError::flag(flag, "(the preset's default)", reason.to_string()))
    }

    /// A config error as the user would name it: by the flag they gave, else by the config file
    /// it came from, else as the library named it (a preset's value).
    fn name_error(&self, e: PolicyError) -> BenchError {
        let (field, value, reason) = match &e {
            PolicyError::Memory(MemoryError::InvalidField { field, value, reason })
            | PolicyError::Invalid { field, value, reason } => (*field, value, reason),
            PolicyError::UnknownPolicy { name, known } => {
                return match (&self.eviction_policy, &self.config) {
                    (Some(_), _) => BenchError::flag("eviction-policy", name, format!("known policies: {known}")),
                    (None, Some(path)) => BenchError::flag("config", path.display(), e.to_string()),
                    _ => e.into(),
                };
            }
            _ => return e.into(),
        };
        match (flag_of(field), &self.config) {
            (Some(flag), _) if self.flag_given(field) => BenchError::flag(flag, value, reason.clone()),
            (_, Some(path)) => BenchError::flag("config", path.display(), format!("{field} = {value}: {reason}")),
            _ => e.into(),
        }
    }

    /// The hierarchy's config: the preset's defaults, then the `--config` file's keys, then
    /// flags; checked against the geometry and against this machine's memory. Errors name the
    /// flag (or the file) the value came from.
    pub fn hisparse(&self, g: &KvGeometry) -> Result<HiSparseConfig> {
        let base = HiSparseConfig::for_geometry(g);
        let mut longest_given = false;
        let mut c = match self.config_file()? {
            Some((p, text, keys)) => {
                longest_given = keys.iter().any(|k| k == "max_request_tokens");
                HiSparseConfig::from_json_over(&base, &text)
                    .map_err(|e| BenchError::flag("config", p.display(), e.to_string()))?
            }
            None => base,
        };
        if let Some(v) = self.device_buffer_size {
            c.device_buffer_size = v;
        }
        if let Some(v) = self.host_to_device_ratio {
            if !(v.is_finite() && v > 0.0) {
                return Err(BenchError::flag(
                    "host-to-device-ratio",
                    format!("{v:?}"),
                    "must be a finite number above 0",
                ));
            }
            c.host_to_device_ratio = v;
        }
        if let Some(v) = self.swap_in_block_size {
            c.swap_in_block_size = v;
        }
        if let Some(v) = self.eviction_policy {
            c.eviction_policy = v.into();
        }
        if let Some(v) = self.prefetcher {
            if self.uses_cuda() && v == BuiltinPrefetcher::NextStep {
                return Err(BenchError::flag(
                    "prefetcher",
                    "next-step",
                    "the CUDA backend prefetches a layer's selection into later layers \
                     (shared-index, adjacent-layer); next-step needs near-cut candidates on the \
                     device, not built yet: use --backend cpu (or compare prefetchers on a trace \
                     with `hisparse simulate --prefetchers`)",
                ));
            }
            c.prefetcher = v.into();
        }
        if let Some(v) = self.prefetch_budget {
            c.prefetch_budget = v;
        }
        c.miss_fill = self.miss_fill_over(c.miss_fill)?;
        if let Some(p) = &self.host_tier_file {
            if self.uses_cuda() {
                return Err(BenchError::flag(
                    "host-tier-file",
                    p.display(),
                    "the CUDA backend cannot register a file mapping as pinned host memory \
                     (cuMemHostRegister refuses it); use --backend cpu for the file-backed tier",
                ));
            }
            check_tier_path(p, self.overwrite_host_tier_file)?;
            if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
                return Err(BenchError::flag(
                    "host-tier-file",
                    p.display(),
                    format!("its folder {} does not exist", d.display()),
                ));
            }
            c.host_tier_path = Some(p.clone());
            c.host_tier_overwrite = self.overwrite_host_tier_file;
            c.host_tier_keep = self.keep_host_tier_file;
        }
        let cuda = self.uses_cuda();
        let avail = guard::available_memory();
        let default = if g.name == "cpu-small" {
            48u64 << 20
        } else if cuda {
            64u64 << 30
        } else {
            // On the CPU the "device" is host memory: a quarter of what is available, at most 64 GiB.
            (64u64 << 30).min(avail.map_or(u64::MAX, |a| a / 4)).max(48 << 20)
        };
        c.device_kv_bytes = match (&self.device_memory, self.model()?) {
            (Some(s), _) => parse_bytes("device-memory", s)?,
            (None, _) if c.device_kv_bytes > 0 => c.device_kv_bytes,
            (None, Some(m)) if cuda => super::sizing::device_kv_budget(m.weight_bytes())?,
            (None, _) => default,
        };
        if !cuda
            && let Err(BenchError::Flag { reason, .. }) =
                guard::memory("device-memory", "", "the CPU backend's device tier", Some(c.device_kv_bytes))
        {
            return Err(self.size_error(&[("device-memory", self.device_memory.clone(), "device_kv_bytes")], &reason)?);
        }
        if self.host_to_device_ratio.is_none()
            && let Some(avail) = avail
        {
            // The default ratio may ask for more host memory than there is: shrink it to fit
            // (beside the CPU backend's device tier, which is host memory too).
            let left = if cuda { avail } else { avail.saturating_sub(c.device_kv_bytes) };
            c.host_to_device_ratio = c.host_to_device_ratio.min(super::sizing::host_ratio_cap(c.device_kv_bytes, left));
        }
        // The longest request the tiers must hold: what the host tier holds, up to the default
        // (each command checks its own lengths against the tiers, naming its flag).
        let per_token = g.kv_bytes_per_token()? as u64;
        let fits = (c.host_bytes() / per_token.max(1)) as usize / c.page_tokens.max(1) * c.page_tokens;
        if fits == 0 {
            let reason = format!(
                "the host tier ({}) holds less than one page of {} tokens of {per_token} B",
                guard::human_bytes(c.host_bytes()),
                c.page_tokens
            );
            return Err(self.size_error(
                &[
                    ("host-to-device-ratio", self.host_to_device_ratio.map(|r| format!("{r:?}")), "host_tier_bytes"),
                    ("host-to-device-ratio", None, "host_to_device_ratio"),
                    ("device-memory", self.device_memory.clone(), "device_kv_bytes"),
                    ("device-memory", None, "page_tokens"),
                ],
                &reason,
            )?);
        }
        if !longest_given {
            c.max_request_tokens = c.max_request_tokens.min(fits);
        }
        c.validate(g).map_err(|e| self.name_error(e))?;
        let host = c.host_bytes();
        // What this machine's memory must hold: the host tier (unless a file backs it) and, on
        // the CPU backend, the device tier too.
        let in_memory = match (self.host_tier_file.is_some(), cuda) {
            (true, true) => None,
            (true, false) => Some((Some(c.device_kv_bytes), "the CPU backend's device tier")),
            (false, true) => Some((Some(host), "the host tier")),
            (false, false) => {
                Some((host.checked_add(c.device_kv_bytes), "the host tier beside the CPU backend's device tier"))
            }
        };
        if let Some((bytes, what)) = in_memory
            && let Err(BenchError::Flag { reason, .. }) = guard::memory("device-memory", "", what, bytes)
        {
            let sources: &[(&'static str, Option<String>, &str)] = if self.host_tier_file.is_some() {
                &[("device-memory", self.device_memory.clone(), "device_kv_bytes")]
            } else {
                &[
                    ("host-to-device-ratio", self.host_to_device_ratio.map(|r| format!("{r:?}")), "host_tier_bytes"),
                    ("device-memory", self.device_memory.clone(), "device_kv_bytes"),
                    ("host-to-device-ratio", None, "host_to_device_ratio"),
                ]
            };
            return Err(self.size_error(sources, &reason)?);
        }
        if let Some(p) = &self.host_tier_file {
            check_tier_room(p, host)?;
            if !self.keep_host_tier_file {
                // A second Ctrl-C removes the file this process created and holds locked.
                static TIER: std::sync::OnceLock<crate::files::cleanup::Registered> = std::sync::OnceLock::new();
                TIER.get_or_init(|| {
                    crate::files::cleanup::register(crate::files::cleanup::Leftover::LockedFile(p.clone()))
                });
            }
        }
        Ok(c)
    }

    /// Checks that one request of `tokens` positions (set by `flag` = `value`) fits the tiers
    /// of `c` in `mode`: below the kernels' 2^31 positions, and within the host tier (hisparse)
    /// or the device budget (resident) on its own. Refuses naming the flag otherwise.
    pub fn check_request_fits(
        &self,
        g: &KvGeometry,
        c: &HiSparseConfig,
        mode: Mode,
        flag: &'static str,
        value: impl std::fmt::Display + Copy,
        tokens: usize,
    ) -> Result<()> {
        if tokens > u32::MAX as usize / 2 {
            return Err(BenchError::flag(flag, value, "a request must stay below 2^31 positions"));
        }
        let (kv, key) = (g.kv_row()?.row_bytes(), g.index_key()?.row_bytes());
        let positions = tokens.div_ceil(c.page_tokens) * c.page_tokens;
        let keys = guard::product(&[positions, key, g.layers]);
        let mut needs = vec![];
        match mode {
            Mode::HiSparse => {
                needs.push((
                    guard::product(&[positions, kv, g.layers]),
                    c.host_bytes(),
                    "host tier",
                    "--host-to-device-ratio",
                ));
                let seat = guard::product(&[c.device_buffer_size + 1, kv, g.layers]);
                let device = seat.zip(keys).and_then(|(a, b)| a.checked_add(b));
                needs.push((device, c.device_kv_bytes, "device budget (hot buffer and index keys)", "--device-memory"));
            }
            Mode::Resident => {
                let rows = guard::product(&[positions, kv, g.layers]);
                let device = rows.zip(keys).and_then(|(a, b)| a.checked_add(b));
                needs.push((device, c.device_kv_bytes, "device budget (KV rows and index keys)", "--device-memory"));
            }
        }
        for (need, have, tier, knob) in needs {
            if need.is_none_or(|n| n > have) {
                return Err(BenchError::flag(
                    flag,
                    value,
                    format!(
                        "one request of {tokens} tokens needs {} of the {mode} {tier}, which holds {} (raise {knob})",
                        need.map_or_else(|| "more than 2^64 B".into(), guard::human_bytes),
                        guard::human_bytes(have)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// An engine config for `mode`, sized for requests of `typical_tokens` (a length the user
    /// set with `flag`, named if it cannot fit).
    pub fn engine_config(&self, mode: Mode, typical_tokens: usize, flag: &'static str) -> Result<EngineConfig> {
        let g = self.geometry()?;
        let mut hs = self.hisparse(&g)?;
        // Checked as hisparse needs it (host tier, hot buffer and keys): a resident engine is
        // still made where its device cannot hold such a request (it rejects them whole).
        self.check_request_fits(&g, &hs, Mode::HiSparse, flag, typical_tokens, typical_tokens)?;
        hs.max_request_tokens = hs.max_request_tokens.max(typical_tokens);
        let cache = hisparse_engine::CacheConfig {
            hisparse: hs,
            typical_tokens,
            serial_prefetch: self.serial_prefetch,
            index_queries: hisparse_kernels::IndexerQueries::from_name(&self.index_queries)
                .ok_or_else(|| BenchError::flag("index-queries", &self.index_queries, "exact or fp8"))?,
            ..hisparse_engine::CacheConfig::new(g, mode, 0)
        };
        Ok(EngineConfig {
            cache,
            workload_seed: self.seed,
            capture_digests: false,
            launch_graphs: !self.no_graphs,
            model: self.model()?,
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
            super::sizing::check_cpu_room(&shape, guard::available_memory().unwrap_or(0))?;
        }
        Ok(Some(shape))
    }

    /// Builds an engine for `mode` on the chosen backend: `auto` takes CUDA where a driver is
    /// found (falling back to the CPU with a note if the GPU cannot be opened), `cuda` fails with
    /// a one-line error where it cannot be used.
    pub fn engine(&self, mode: Mode, typical_tokens: usize, flag: &'static str) -> Result<Box<dyn DecodeEngine>> {
        self.build(self.engine_config(mode, typical_tokens, flag)?, 0)
    }

    /// A hisparse engine whose swap-in copies no row (`MissFill::NoCopies`): the timing bound
    /// of `hisparse sweep --bound`, whose outputs are wrong.
    pub fn bound_engine(&self, typical_tokens: usize, flag: &'static str) -> Result<Box<dyn DecodeEngine>> {
        let mut cfg = self.engine_config(Mode::HiSparse, typical_tokens, flag)?;
        cfg.cache.hisparse.miss_fill = cfg.cache.hisparse.miss_fill.bound();
        self.build(cfg, 0)
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
        let mut cfg = self.engine_config(mode, typical_tokens, flag)?;
        cfg.cache.hisparse.host_tier_bytes = plan.host_bytes_per_rank;
        // A rank's slice holds the requests it is given, not the longest one the whole
        // machine's tier could.
        cfg.cache.hisparse.max_request_tokens = longest_tokens;
        self.build(cfg, rank)
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
        let mut share = hs.clone();
        share.host_tier_bytes = plan.host_bytes_per_rank;
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

    fn build(&self, cfg: EngineConfig, ordinal: usize) -> Result<Box<dyn DecodeEngine>> {
        let driver = cuda_driver_present();
        match self.backend {
            BackendKind::Cpu => Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?)),
            BackendKind::Auto if !driver => Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?)),
            BackendKind::Cuda if !driver => {
                Err(BenchError::flag("backend", "cuda", "no CUDA driver (libcuda.so) on this machine"))
            }
            BackendKind::Auto | BackendKind::Cuda => match cuda_engine(cfg.clone(), ordinal, self.cuda_knobs()) {
                Ok(e) => Ok(e),
                Err(e) if self.backend == BackendKind::Auto => {
                    crate::console::note(&format!(
                        "hisparse: the CUDA backend could not start ({e}); running on the CPU"
                    ));
                    Ok(Box::new(Engine::new(CpuBackend::new(), cfg)?))
                }
                Err(e) => Err(BenchError::flag("backend", "cuda", e.to_string())),
            },
        }
    }
}

/// Refuses a `--host-tier-file` path that could not hold a tier of this process's own: a
/// folder, a link (never followed: the tier would land in whatever it points to), something
/// that is not a regular file (a FIFO, a device), a folder that does not exist, or an existing
/// file without `--overwrite-host-tier-file`.
fn check_tier_path(p: &std::path::Path, overwrite: bool) -> Result<()> {
    let bad = |why: &str| Err(BenchError::flag("host-tier-file", p.display(), why.to_string()));
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => return bad("is a folder; give a file name"),
        Ok(m) if m.file_type().is_symlink() => {
            return bad("is a symbolic link; a host tier file is never reached through one (give the file's own path)");
        }
        Ok(m) if !m.is_file() => {
            return bad("is not a regular file (a FIFO, socket or device): a host tier needs a file of its own");
        }
        Ok(_) if !overwrite => {
            return bad("exists; refusing to overwrite it (pass --overwrite-host-tier-file to replace it)");
        }
        _ => {}
    }
    Ok(())
}

/// Refuses a host-tier file of `bytes` that the file system it would be on has no room for
/// (checked before any work; the tier reserves its space again when it is made).
fn check_tier_room(p: &std::path::Path, bytes: u64) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return Ok(()) };
    // SAFETY: statvfs writes only the zeroed struct it is given; `c` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers live across the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    // Both are 64-bit on Linux.
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    // An existing file being replaced gives its blocks back.
    let own = std::fs::symlink_metadata(p).map_or(0, |m| m.len());
    if bytes > free.saturating_add(own) {
        return Err(BenchError::flag(
            "host-tier-file",
            p.display(),
            format!(
                "the host tier needs {}; its file system has {} free",
                guard::human_bytes(bytes),
                guard::human_bytes(free)
            ),
        ));
    }
    Ok(())
}

/// The CUDA backend's kernel choices from the command line.
#[derive(Clone, Copy, Debug)]
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
) -> std::result::Result<Box<dyn DecodeEngine>, String> {
    let be = hisparse_kernels::cuda::CudaBackend::new(ordinal)
        .map_err(|e| e.to_string())?
        .with_top_k_blocks(knobs.top_k_blocks)
        .with_wgmma_attention(knobs.wgmma_attention)
        .with_wgmma_indexer(knobs.wgmma_indexer);
    Ok(Box::new(Engine::new(be, cfg).map_err(|e| e.to_string())?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_engine(
    _cfg: hisparse_engine::EngineConfig,
    _ordinal: usize,
    _knobs: CudaKnobs,
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
