//! `HiSparseConfig`: SGLang's `--hisparse-config` keys as they are (`device_buffer_size`,
//! `host_to_device_ratio`, `swap_in_block_size`; its `top_k` is the geometry's, the one home of
//! top-k: a file that gives it is checked against the geometry when read) plus ours, from JSON or
//! from code, validated against a geometry with typed errors naming the field. The eviction
//! policy and the prefetcher are typed values ([`Eviction`], [`Prefetch`]); the JSON form keeps
//! their names as flat keys (`raw.rs`), resolved once when it is read. Who fills a step's misses
//! is the backend's option (`hisparse_kernels::MissFill`), not the cache's.

mod raw;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use hisparse_memory::KvGeometry;
use hisparse_memory::slot_table::MAX_BUFFER_SLOTS;
use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};
use crate::eviction::{Eviction, OnlinePolicy};
use crate::prefetching::Prefetch;

/// The hierarchy's configuration.
///
/// ```
/// use hisparse_policy::HiSparseConfig;
/// // SGLang's keys as they are, plus any of ours, over a geometry's defaults (its top_k, if
/// // given, must be the geometry's).
/// let geometry = hisparse_memory::KvGeometry::preset("glm-5.1")?;
/// let base = HiSparseConfig::for_geometry(&geometry);
/// let c = HiSparseConfig::from_json_over(&geometry, &base, r#"{"top_k": 2048, "device_buffer_size": 4096,
///     "host_to_device_ratio": 8, "swap_in_block_size": 512, "eviction_policy": "clock"}"#)?;
/// assert_eq!((c.device_buffer_size, c.eviction.name()), (4096, "clock"));
/// assert!(HiSparseConfig::from_json_over(&geometry, &base, r#"{"top_k": 1024}"#).is_err());
/// let bad = HiSparseConfig { device_buffer_size: 1024, ..HiSparseConfig::default() };
/// assert!(bad.validate(&geometry).unwrap_err().to_string().contains("device_buffer_size = 1024"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "raw::RawConfig", into = "raw::RawConfig")]
pub struct HiSparseConfig {
    /// SGLang: regular hot-buffer slots per request and layer (plus one reserved newest slot).
    pub device_buffer_size: usize,
    /// SGLang: host-tier capacity as a multiple of the device bytes given to the KV cache.
    pub host_to_device_ratio: f64,
    /// SGLang: threads per request block of the swap-in kernel (1..=1024).
    pub swap_in_block_size: usize,
    /// Ours: the eviction policy with its settings (JSON: `eviction_policy`, a registered name,
    /// `lru`, `clock`, `score`, ...; `belady` only in the simulator; `policy_seed`, the `random`
    /// policy's seed; `policy_config`, the tunables the policy reads: CLOCK's counter bits, MQ's
    /// queues, ...).
    pub eviction: Eviction,
    /// Ours: the prefetcher with its settings (JSON: `prefetcher`, `none`, `shared-index`,
    /// `adjacent-layer`, `next-step`; `prefetch_budget`, most rows a speculative prefetcher
    /// brings into one buffer per step, 0: a quarter of top-k).
    pub prefetch: Prefetch,
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
    /// The LMSYS blog's colocated setting (for its top-k of 2048): `{buffer 4096, ratio 8, block
    /// 512}`, LRU.
    fn default() -> Self {
        Self {
            device_buffer_size: 4096,
            host_to_device_ratio: 8.0,
            swap_in_block_size: 512,
            eviction: Eviction::default(),
            prefetch: Prefetch::None,
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

/// A hot buffer's regular slots when none are given: twice the top-k (the HiSparse blog's 4096
/// slots for top-k 2048), at most the buffer's limit but never below the top-k, so that a top-k
/// too large for any buffer is refused by the buffer's own limit.
pub fn default_device_buffer_size(top_k: usize) -> usize {
    top_k.saturating_mul(2).min(MAX_BUFFER_SLOTS).max(top_k)
}

/// The buffer sizes a comparison replays when none are given: 1, 2 and 4 times the top-k (the
/// published miss-rate points, 2048, 4096 and 8192 slots for top-k 2048); a multiple that
/// overflows is left out.
pub fn compared_device_buffer_sizes(top_k: usize) -> Vec<usize> {
    [1, 2, 4].into_iter().filter_map(|m| top_k.checked_mul(m)).collect()
}

impl HiSparseConfig {
    /// Parses JSON (unknown keys, and SGLang's `top_k`, which only a geometry can check, are
    /// errors; missing keys take their defaults).
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| invalid("hisparse_config", format!("{e}"), "not a valid config (JSON)"))
    }

    /// Parses JSON over `base` for `geometry`: keys present in `text` replace `base`'s, missing
    /// ones keep it (so a file of SGLang's keys alone, or `{}`, works with any preset when
    /// `base` is [`HiSparseConfig::for_geometry`]). SGLang's `top_k` key, when given, must be
    /// the geometry's (the error names both). Unknown keys are errors naming the key.
    pub fn from_json_over(geometry: &KvGeometry, base: &Self, text: &str) -> Result<Self> {
        let bad = |e: String| invalid("hisparse_config", e, "not a valid config (JSON)");
        let given: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let serde_json::Value::Object(mut given) = given else {
            return Err(bad("not a JSON object".into()));
        };
        if let Some(k) = given.remove("top_k")
            && k.as_u64() != Some(geometry.top_k as u64)
        {
            return Err(invalid(
                "top_k",
                k,
                format!("the geometry {} selects top_k = {}", geometry.name, geometry.top_k),
            ));
        }
        let mut merged = serde_json::to_value(base).map_err(|e| bad(e.to_string()))?;
        if let serde_json::Value::Object(m) = &mut merged {
            m.extend(given);
        }
        serde_json::from_value(merged).map_err(|e| bad(e.to_string()))
    }

    /// The defaults with the default hot buffer for `geometry`'s top-k ([`default_device_buffer_size`]).
    pub fn for_geometry(geometry: &KvGeometry) -> Self {
        Self { device_buffer_size: default_device_buffer_size(geometry.top_k), ..Self::default() }
    }

    /// The eviction policy made, refused if it needs the future.
    pub fn online_policy(&self) -> Result<OnlinePolicy> {
        self.eviction.make_online()
    }

    /// Host-tier bytes this config gives (explicit, or the ratio times the device bytes).
    pub fn host_bytes(&self) -> u64 {
        if self.host_tier_bytes > 0 {
            self.host_tier_bytes
        } else {
            (self.host_to_device_ratio * self.device_kv_bytes as f64) as u64
        }
    }

    /// Checks every field against `geometry` (the eviction policy made from [`Self::eviction`]);
    /// the error names the first field at fault.
    pub fn validate(&self, geometry: &KvGeometry) -> Result<()> {
        self.online_policy()?;
        self.validate_sizes(geometry)
    }

    /// [`Self::validate`] but the eviction policy (for a cache given one already made): the
    /// sizes, budgets and the prefetcher against `geometry`.
    pub fn validate_sizes(&self, geometry: &KvGeometry) -> Result<()> {
        geometry.validate()?;
        for (field, v) in [
            ("device_buffer_size", self.device_buffer_size),
            ("page_tokens", self.page_tokens),
            ("max_request_tokens", self.max_request_tokens),
        ] {
            if v == 0 {
                return Err(invalid(field, v, "must be at least 1"));
            }
        }
        if geometry.top_k > self.device_buffer_size {
            return Err(invalid(
                "device_buffer_size",
                self.device_buffer_size,
                format!("must be at least the top-k ({}) so that a step's selection fits", geometry.top_k),
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
        if let Some(budget) = self.prefetch.budget()
            && budget > self.device_buffer_size
        {
            return Err(invalid(
                "prefetch_budget",
                budget,
                format!("at most the hot buffer's {} slots (rows one buffer can take)", self.device_buffer_size),
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
