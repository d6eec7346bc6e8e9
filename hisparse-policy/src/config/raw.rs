//! The config's JSON form: SGLang's keys and ours as flat keys, names as strings. It exists only
//! at the edge — read, then resolved once into [`HiSparseConfig`]'s typed values (an unknown
//! name is an error naming its key), and written back the same way.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::HiSparseConfig;
use crate::choice::{PolicyChoice, PrefetcherChoice};
use crate::error::PolicyError;
use crate::eviction::Eviction;
use crate::policy::PolicyConfig;
use crate::prefetch::PrefetcherConfig;
use crate::prefetching::Prefetch;

/// [`HiSparseConfig`] as JSON has it (missing keys take the defaults; unknown keys are errors).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConfig {
    device_buffer_size: usize,
    host_to_device_ratio: f64,
    swap_in_block_size: usize,
    eviction_policy: String,
    policy_seed: u64,
    policy_config: PolicyConfig,
    prefetcher: String,
    prefetch_budget: usize,
    page_tokens: usize,
    device_kv_bytes: u64,
    host_tier_bytes: u64,
    host_tier_path: Option<PathBuf>,
    host_tier_overwrite: bool,
    host_tier_keep: bool,
    max_request_tokens: usize,
}

impl Default for RawConfig {
    fn default() -> Self {
        HiSparseConfig::default().into()
    }
}

impl From<HiSparseConfig> for RawConfig {
    fn from(c: HiSparseConfig) -> Self {
        let (policy, policy_config) = c.eviction.parts();
        Self {
            device_buffer_size: c.device_buffer_size,
            host_to_device_ratio: c.host_to_device_ratio,
            swap_in_block_size: c.swap_in_block_size,
            eviction_policy: policy.name().to_owned(),
            // The seed is written once, as `policy_seed` (it replaces `policy_config.seed`).
            policy_seed: policy_config.seed,
            policy_config: PolicyConfig { seed: 0, ..policy_config },
            prefetcher: c.prefetch.name().to_owned(),
            prefetch_budget: c.prefetch.parts().1.budget,
            page_tokens: c.page_tokens,
            device_kv_bytes: c.device_kv_bytes,
            host_tier_bytes: c.host_tier_bytes,
            host_tier_path: c.host_tier_path,
            host_tier_overwrite: c.host_tier_overwrite,
            host_tier_keep: c.host_tier_keep,
            max_request_tokens: c.max_request_tokens,
        }
    }
}

impl TryFrom<RawConfig> for HiSparseConfig {
    type Error = PolicyError;

    fn try_from(r: RawConfig) -> Result<Self, PolicyError> {
        Ok(Self {
            device_buffer_size: r.device_buffer_size,
            host_to_device_ratio: r.host_to_device_ratio,
            swap_in_block_size: r.swap_in_block_size,
            eviction: Eviction::from_parts(
                PolicyChoice::parse(&r.eviction_policy)?,
                &PolicyConfig { seed: r.policy_seed, ..r.policy_config },
            ),
            prefetch: Prefetch::checked_parts(
                PrefetcherChoice::parse(&r.prefetcher)?,
                &PrefetcherConfig { budget: r.prefetch_budget },
            )?,
            page_tokens: r.page_tokens,
            device_kv_bytes: r.device_kv_bytes,
            host_tier_bytes: r.host_tier_bytes,
            host_tier_path: r.host_tier_path,
            host_tier_overwrite: r.host_tier_overwrite,
            host_tier_keep: r.host_tier_keep,
            max_request_tokens: r.max_request_tokens,
        })
    }
}
