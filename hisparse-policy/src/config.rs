//! `HiSparseConfig`: SGLang's `--hisparse-config` keys as they are (`top_k`,
//! `device_buffer_size`, `host_to_device_ratio`, `swap_in_block_size`) plus ours, from JSON or
//! from code, validated against a geometry with typed errors naming the field.

use std::path::PathBuf;

use hisparse_memory::KvGeometry;
use hisparse_memory::slot_table::MAX_BUFFER_SLOTS;
use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};
use crate::policy::PolicyConfig;
use crate::prefetch::PrefetcherConfig;

/// The hierarchy's configuration.
///
/// ```
/// use hisparse_policy::HiSparseConfig;
/// // SGLang's keys as they are, plus any of ours.
/// let c = HiSparseConfig::from_json(r#"{"top_k": 2048, "device_buffer_size": 4096,
///     "host_to_device_ratio": 8, "swap_in_block_size": 512, "eviction_policy": "clock"}"#)?;
/// assert_eq!((c.device_buffer_size, c.eviction_policy.as_str()), (4096, "clock"));
/// let bad = HiSparseConfig { device_buffer_size: 1024, ..HiSparseConfig::default() };
/// let geometry = hisparse_memory::KvGeometry::preset("glm-5.1")?;
/// assert!(bad.validate(&geometry).unwrap_err().to_string().contains("device_buffer_size = 1024"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HiSparseConfig {
    /// SGLang: tokens selected per request, layer and step (must equal the geometry's).
    pub top_k: usize,
    /// SGLang: regular hot-buffer slots per request and layer (plus one reserved newest slot).
    pub device_buffer_size: usize,
    /// SGLang: host-tier capacity as a multiple of the device bytes given to the KV cache.
    pub host_to_device_ratio: f64,
    /// SGLang: threads per request block of the swap-in kernel (1..=1024).
    pub swap_in_block_size: usize,
    /// Ours: the eviction policy (a registered name: `lru`, `clock`, `score`, ...; `belady`
    /// only in the simulator).
    pub eviction_policy: String,
    /// Ours: seed of the `random` policy (it replaces `policy_config.seed`).
    pub policy_seed: u64,
    /// Ours: the policies' tunables (CLOCK's counter bits, MQ's queues, ...).
    pub policy_config: PolicyConfig,
    /// Ours: the prefetcher (`none`, `shared-index`, `adjacent-layer`, `next-step`).
    pub prefetcher: String,
    /// Ours: most rows a speculative prefetcher brings into one buffer per step (0: a quarter
    /// of top-k).
    pub prefetch_budget: usize,
    /// Ours: who brings a layer's missed rows into its hot buffer — `swap-in` (its own copy
    /// kernel, before the attention starts), `attention` (the attention reads them from the
    /// host tier as it goes and writes them back), `deferred` (the attention only reads them
    /// from the host tier; the swap-in's decisions and copies run after it on a stream of their
    /// own, off the critical path; not with a policy that reads scores), `deferred-gather` (as
    /// `deferred`, but the swap-in's first kernel gathers the misses into device staging rows
    /// and the attention reads them there, so that each miss crosses PCIe once), `hits-first` (as
    /// `deferred`, but the misses are gathered into staging rows on that stream while the attention
    /// runs over the hits alone; then the attention over the misses and the LSE merge: equal to
    /// the other forms within the attention's bf16 tolerance, not bit for bit; warpgroup-MMA attention only),
    /// `copy-engine` (as `deferred-gather`, but host threads gather the misses into pinned
    /// landing rows, the copy engine copies them to the device and a kernel scatters them into
    /// the staging rows: `copy_engine_share`, `host_gather_threads`), or `auto` (deferred for
    /// batches of at most `miss_fill_max_batch` requests, where the swap-in's latency dominates
    /// — with a policy that reads scores the attention fills them there — and the swap-in
    /// above). CUDA only: the CPU backend copies either way. Results are bit-identical in every
    /// form but `hits-first` (checked on the H200).
    pub miss_fill: String,
    /// Ours: with `miss_fill = "auto"`, the largest batch whose swap-in is deferred.
    pub miss_fill_max_batch: usize,
    /// Ours: with `miss_fill = "copy-engine"`, the share of a step's selection entries the
    /// copy engine copies per layer (a fixed size, as a graph's copy has one); misses past it are
    /// read from the host tier by the scatter kernel. In (0, 1].
    pub copy_engine_share: f64,
    /// Ours: with `miss_fill = "copy-engine"`, host threads of the gather (0: the machine's
    /// cores less two).
    pub host_gather_threads: usize,
    /// Ours: positions per page of the host tier and the device pools.
    pub page_tokens: usize,
    /// Ours: device bytes for KV rows, index keys and hot buffers (0: decided by the engine).
    pub device_kv_bytes: u64,
    /// Ours: host-tier bytes; 0 means `host_to_device_ratio * device_kv_bytes`.
    pub host_tier_bytes: u64,
    /// Ours: back the host tier with this file (the NVMe tier) instead of anonymous memory. A
    /// new file is created (an existing one is refused unless `host_tier_overwrite`), its space
    /// reserved up front, locked while in use and removed afterwards unless `host_tier_keep`.
    pub host_tier_path: Option<PathBuf>,
    /// Ours: replace an existing `host_tier_path` instead of refusing it.
    pub host_tier_overwrite: bool,
    /// Ours: leave the `host_tier_path` file in place when the tier goes away.
    pub host_tier_keep: bool,
    /// Ours: the longest request (prompt + output tokens) the tiers must be able to hold.
    pub max_request_tokens: usize,
}

impl Default for HiSparseConfig {
    /// The LMSYS blog's colocated setting: `{top_k 2048, buffer 4096, ratio 8, block 512}`, LRU.
    fn default() -> Self {
        Self {
            top_k: 2048,
            device_buffer_size: 4096,
            host_to_device_ratio: 8.0,
            swap_in_block_size: 512,
            eviction_policy: "lru".into(),
            policy_seed: 0,
            policy_config: PolicyConfig::default(),
            prefetcher: "none".into(),
            prefetch_budget: 0,
            miss_fill: "swap-in".into(),
            miss_fill_max_batch: 8,
            copy_engine_share: 0.125,
            host_gather_threads: 0,
            page_tokens: 64,
            device_kv_bytes: 0,
            host_tier_bytes: 0,
            host_tier_path: None,
            host_tier_overwrite: false,
            host_tier_keep: false,
            max_request_tokens: 131_072,
        }
    }
}

fn invalid(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

impl HiSparseConfig {
    /// The values of `miss_fill`.
    pub const MISS_FILLS: [&'static str; 7] =
        ["auto", "swap-in", "attention", "deferred", "deferred-gather", "hits-first", "copy-engine"];

    /// The largest batch whose misses the attention brings in (0: none, `usize::MAX`: all).
    pub fn fill_max_batch(&self) -> usize {
        match self.miss_fill.as_str() {
            "attention" | "deferred" | "deferred-gather" | "hits-first" | "copy-engine" => usize::MAX,
            "auto" => self.miss_fill_max_batch,
            _ => 0,
        }
    }

    /// Whether, where the attention takes the misses, it only reads them and the swap-in runs
    /// after it (`deferred`, and `auto`'s small batches).
    pub fn fill_deferred(&self) -> bool {
        matches!(self.miss_fill.as_str(), "deferred" | "deferred-gather" | "hits-first" | "copy-engine" | "auto")
    }

    /// Parses JSON (unknown keys are errors; missing keys take their defaults).
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| invalid("hisparse_config", format!("{e}"), "not a valid config (JSON)"))
    }

    /// Parses JSON over `base`: keys present in `text` replace `base`'s, missing ones keep it
    /// (so a file of SGLang's keys alone, or `{}`, works with any preset when `base` is
    /// [`HiSparseConfig::for_geometry`]). Unknown keys are errors naming the key.
    pub fn from_json_over(base: &Self, text: &str) -> Result<Self> {
        let bad = |e: String| invalid("hisparse_config", e, "not a valid config (JSON)");
        let given: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let serde_json::Value::Object(given) = given else {
            return Err(bad("not a JSON object".into()));
        };
        let mut merged = serde_json::to_value(base).map_err(|e| bad(e.to_string()))?;
        if let serde_json::Value::Object(m) = &mut merged {
            m.extend(given);
        }
        serde_json::from_value(merged).map_err(|e| bad(e.to_string()))
    }

    /// The defaults with `top_k` taken from `geometry` and a buffer of twice that (the blog's
    /// 4096 slots for top-k 2048).
    pub fn for_geometry(geometry: &KvGeometry) -> Self {
        Self { top_k: geometry.top_k, device_buffer_size: 2 * geometry.top_k, ..Self::default() }
    }

    /// The policies' config with `policy_seed` as its seed.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig { seed: self.policy_seed, ..self.policy_config.clone() }
    }

    /// The prefetchers' config.
    pub fn prefetch(&self) -> PrefetcherConfig {
        PrefetcherConfig { budget: self.prefetch_budget }
    }

    /// Host-tier bytes this config gives (explicit, or the ratio times the device bytes).
    pub fn host_bytes(&self) -> u64 {
        if self.host_tier_bytes > 0 {
            self.host_tier_bytes
        } else {
            (self.host_to_device_ratio * self.device_kv_bytes as f64) as u64
        }
    }

    /// Checks every field against `geometry`; the error names the first field at fault.
    pub fn validate(&self, geometry: &KvGeometry) -> Result<()> {
        geometry.validate()?;
        for (field, v) in [
            ("top_k", self.top_k),
            ("device_buffer_size", self.device_buffer_size),
            ("page_tokens", self.page_tokens),
            ("max_request_tokens", self.max_request_tokens),
        ] {
            if v == 0 {
                return Err(invalid(field, v, "must be at least 1"));
            }
        }
        if self.top_k != geometry.top_k {
            return Err(invalid(
                "top_k",
                self.top_k,
                format!("the geometry {} selects top_k = {}", geometry.name, geometry.top_k),
            ));
        }
        if self.top_k > self.device_buffer_size {
            return Err(invalid(
                "device_buffer_size",
                self.device_buffer_size,
                format!("must be at least top_k = {} so that a step's selection fits", self.top_k),
            ));
        }
        if self.device_buffer_size > MAX_BUFFER_SLOTS {
            return Err(invalid("device_buffer_size", self.device_buffer_size, format!("at most {MAX_BUFFER_SLOTS}")));
        }
        if !(1..=1024).contains(&self.swap_in_block_size) {
            return Err(invalid(
                "swap_in_block_size",
                self.swap_in_block_size,
                "must be in 1..=1024 (threads per block)",
            ));
        }
        if !(self.host_to_device_ratio.is_finite() && self.host_to_device_ratio > 0.0) {
            return Err(invalid(
                "host_to_device_ratio",
                format!("{:?}", self.host_to_device_ratio),
                "must be a finite number above 0",
            ));
        }
        let policy = crate::policy::make(&self.eviction_policy, &self.policy())?;
        let deferred =
            self.miss_fill.starts_with("deferred") || ["hits-first", "copy-engine"].contains(&&*self.miss_fill);
        if deferred && policy.needs_scores() {
            return Err(invalid(
                "miss_fill",
                &self.miss_fill,
                format!(
                    "the {} policy reads each layer's scores, which the next layer overwrites before a deferred \
                     swap-in decides; use auto, swap-in or attention with it",
                    self.eviction_policy
                ),
            ));
        }
        crate::prefetch::make_prefetcher(&self.prefetcher, &self.prefetch())?;
        if !Self::MISS_FILLS.contains(&self.miss_fill.as_str()) {
            return Err(invalid(
                "miss_fill",
                &self.miss_fill,
                format!("must be one of {}", Self::MISS_FILLS.join(", ")),
            ));
        }
        if !(self.copy_engine_share > 0.0 && self.copy_engine_share <= 1.0) {
            return Err(invalid(
                "copy_engine_share",
                format!("{:?}", self.copy_engine_share),
                "must be in (0, 1] (a share of the selection entries)",
            ));
        }
        if self.host_gather_threads > 256 {
            return Err(invalid("host_gather_threads", self.host_gather_threads, "must be at most 256"));
        }
        if self.prefetch_budget > self.device_buffer_size {
            return Err(invalid(
                "prefetch_budget",
                self.prefetch_budget,
                format!("at most device_buffer_size = {} (rows one buffer can take)", self.device_buffer_size),
            ));
        }
        if self.host_bytes() > isize::MAX as u64 {
            let (field, value) = if self.host_tier_bytes > 0 {
                ("host_tier_bytes", self.host_tier_bytes.to_string())
            } else {
                ("host_to_device_ratio", format!("{:?}", self.host_to_device_ratio))
            };
            return Err(invalid(
                field,
                value,
                format!("gives a host tier of {} B, beyond the address space", self.host_bytes()),
            ));
        }
        if self.device_kv_bytes > 0 {
            let one = (self.max_request_tokens.div_ceil(self.page_tokens) as u64)
                .checked_mul(self.page_tokens as u64)
                .and_then(|t| t.checked_mul(geometry.kv_bytes_per_token().ok()? as u64))
                .ok_or_else(|| {
                    invalid("max_request_tokens", self.max_request_tokens, "its KV bytes overflow a 64-bit count")
                })?;
            if self.host_bytes() < one {
                let (field, value) = if self.host_tier_bytes > 0 {
                    ("host_tier_bytes", self.host_tier_bytes.to_string())
                } else {
                    ("host_to_device_ratio", format!("{:?}", self.host_to_device_ratio))
                };
                return Err(invalid(
                    field,
                    value,
                    format!(
                        "the host tier ({} B) cannot hold one request of max_request_tokens = {} ({one} B)",
                        self.host_bytes(),
                        self.max_request_tokens
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use hisparse_memory::MemoryError;

    use super::*;

    fn glm() -> KvGeometry {
        KvGeometry::preset("glm-5.1").unwrap()
    }

    fn field_of(e: PolicyError) -> &'static str {
        match e {
            PolicyError::Invalid { field, .. } | PolicyError::Memory(MemoryError::InvalidField { field, .. }) => field,
            PolicyError::UnknownPolicy { .. } => "eviction_policy",
            other => panic!("{other}"),
        }
    }

    #[test]
    fn sglang_keys_parse_as_they_are() {
        let c = HiSparseConfig::from_json(
            r#"{"top_k": 2048, "device_buffer_size": 6144, "host_to_device_ratio": 10, "swap_in_block_size": 960}"#,
        )
        .unwrap();
        assert_eq!(
            (c.top_k, c.device_buffer_size, c.host_to_device_ratio, c.swap_in_block_size),
            (2048, 6144, 10.0, 960)
        );
        assert_eq!(c.eviction_policy, "lru");
        c.validate(&glm()).unwrap();
        assert!(HiSparseConfig::from_json(r#"{"topk": 2048}"#).unwrap_err().to_string().contains("topk"));
    }

    #[test]
    fn a_partial_file_keeps_the_presets_values() {
        let small = KvGeometry::preset("cpu-small").unwrap();
        let base = HiSparseConfig::for_geometry(&small);
        let empty = HiSparseConfig::from_json_over(&base, "{}").unwrap();
        assert_eq!(empty, base);
        empty.validate(&small).unwrap();
        let c = HiSparseConfig::from_json_over(&base, r#"{"device_buffer_size": 1024, "swap_in_block_size": 256}"#)
            .unwrap();
        assert_eq!((c.top_k, c.device_buffer_size, c.swap_in_block_size), (256, 1024, 256));
        c.validate(&small).unwrap();
        // A value the preset fixes, set otherwise in the file: the error names both.
        let c = HiSparseConfig::from_json_over(&base, r#"{"top_k": 2048}"#).unwrap();
        let e = c.validate(&small).unwrap_err().to_string();
        assert!(e.contains("top_k = 2048") && e.contains("cpu-small selects top_k = 256"), "{e}");
        assert!(HiSparseConfig::from_json_over(&base, r#"{"topk": 1}"#).unwrap_err().to_string().contains("topk"));
        assert!(HiSparseConfig::from_json_over(&base, "[1, 2]").is_err());
    }

    #[test]
    fn each_bad_field_is_named() {
        let g = glm();
        let cases: Vec<(HiSparseConfig, &str)> = vec![
            (HiSparseConfig { device_buffer_size: 2047, ..Default::default() }, "device_buffer_size"),
            (HiSparseConfig { device_buffer_size: 0, ..Default::default() }, "device_buffer_size"),
            (HiSparseConfig { top_k: 0, ..Default::default() }, "top_k"),
            (HiSparseConfig { top_k: 1024, ..Default::default() }, "top_k"),
            (HiSparseConfig { swap_in_block_size: 0, ..Default::default() }, "swap_in_block_size"),
            (HiSparseConfig { swap_in_block_size: 1025, ..Default::default() }, "swap_in_block_size"),
            (HiSparseConfig { host_to_device_ratio: 0.0, ..Default::default() }, "host_to_device_ratio"),
            (HiSparseConfig { page_tokens: 0, ..Default::default() }, "page_tokens"),
            (HiSparseConfig { eviction_policy: "lfu-9000".into(), ..Default::default() }, "eviction_policy"),
            (HiSparseConfig { prefetcher: "psychic".into(), ..Default::default() }, "prefetcher"),
            (HiSparseConfig { miss_fill: "dma".into(), ..Default::default() }, "miss_fill"),
            (
                HiSparseConfig { miss_fill: "deferred".into(), eviction_policy: "score".into(), ..Default::default() },
                "miss_fill",
            ),
            (
                HiSparseConfig {
                    miss_fill: "deferred-gather".into(),
                    eviction_policy: "score".into(),
                    ..Default::default()
                },
                "miss_fill",
            ),
            (
                HiSparseConfig {
                    miss_fill: "hits-first".into(),
                    eviction_policy: "score".into(),
                    ..Default::default()
                },
                "miss_fill",
            ),
            (HiSparseConfig { prefetch_budget: 5000, ..Default::default() }, "prefetch_budget"),
            (
                HiSparseConfig {
                    miss_fill: "copy-engine".into(),
                    eviction_policy: "score".into(),
                    ..Default::default()
                },
                "miss_fill",
            ),
            (HiSparseConfig { copy_engine_share: 0.0, ..Default::default() }, "copy_engine_share"),
            (HiSparseConfig { copy_engine_share: 1.5, ..Default::default() }, "copy_engine_share"),
            (HiSparseConfig { copy_engine_share: f64::NAN, ..Default::default() }, "copy_engine_share"),
            (HiSparseConfig { host_gather_threads: 1000, ..Default::default() }, "host_gather_threads"),
            (
                HiSparseConfig {
                    policy_config: PolicyConfig { mq_queues: 99, ..PolicyConfig::default() },
                    ..Default::default()
                },
                "mq_queues",
            ),
            (HiSparseConfig { device_buffer_size: 70_000, top_k: 2048, ..Default::default() }, "device_buffer_size"),
            // 1 MiB of device bytes x 8 cannot hold a 128k-token request of 51 KB per token.
            (HiSparseConfig { device_kv_bytes: 1 << 20, ..Default::default() }, "host_to_device_ratio"),
            (
                HiSparseConfig { device_kv_bytes: 1 << 30, host_tier_bytes: 1 << 20, ..Default::default() },
                "host_tier_bytes",
            ),
            // A ratio whose host tier is beyond the address space (the product saturates).
            (
                HiSparseConfig { device_kv_bytes: 1 << 30, host_to_device_ratio: 1e300, ..Default::default() },
                "host_to_device_ratio",
            ),
            // A request length whose KV bytes overflow a 64-bit count.
            (
                HiSparseConfig { device_kv_bytes: 1 << 30, max_request_tokens: usize::MAX - 64, ..Default::default() },
                "max_request_tokens",
            ),
        ];
        for (c, field) in cases {
            assert_eq!(field_of(c.validate(&g).unwrap_err()), field, "{c:?}");
        }
        // Enough host bytes for one request passes.
        HiSparseConfig { device_kv_bytes: 1 << 30, ..Default::default() }.validate(&g).unwrap();
    }
}
