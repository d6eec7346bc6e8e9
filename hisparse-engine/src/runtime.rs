//! What may change between decode steps without stopping the engine: the eviction policy (and
//! its seed) and the batch cap, swapped atomically through arc-swap from any thread.

use std::sync::Arc;

use arc_swap::ArcSwap;
use hisparse_policy::{EvictionPolicy, PolicyConfig};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// The runtime-swappable part of the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// Eviction policy name (an online policy).
    pub eviction_policy: String,
    /// Seed of randomised policies.
    pub policy_seed: u64,
    /// The policies' tunables (their seed is `policy_seed`).
    #[serde(default)]
    pub policy_config: PolicyConfig,
    /// Most requests decoded together (0: no cap beyond capacity).
    pub max_running: usize,
}

/// A runtime config with its policy resolved.
#[derive(Debug)]
pub struct Runtime {
    /// The config.
    pub config: RuntimeConfig,
    /// Its policy.
    pub policy: Arc<dyn EvictionPolicy>,
}

impl Runtime {
    /// Resolves `config`; refuses offline policies (they need the future).
    pub fn new(config: RuntimeConfig) -> Result<Self> {
        let cfg = PolicyConfig { seed: config.policy_seed, ..config.policy_config.clone() };
        let policy = hisparse_policy::policy::make(&config.eviction_policy, &cfg)?;
        if policy.needs_future() {
            return Err(EngineError::Config {
                field: "eviction_policy",
                value: config.eviction_policy.clone(),
                reason: "an offline policy (it needs the future): use it in `hisparse simulate`".into(),
            });
        }
        Ok(Self { config, policy })
    }
}

/// A handle that swaps the engine's runtime config from any thread; takes effect at the next
/// decode step.
#[derive(Clone, Debug)]
pub struct RuntimeHandle {
    pub(crate) cell: Arc<ArcSwap<Runtime>>,
}

impl RuntimeHandle {
    /// Replaces the whole runtime config.
    pub fn set(&self, config: RuntimeConfig) -> Result<()> {
        self.cell.store(Arc::new(Runtime::new(config)?));
        Ok(())
    }

    /// Replaces the eviction policy, keeping the rest.
    pub fn set_policy(&self, name: &str, seed: u64) -> Result<()> {
        let mut c = self.cell.load().config.clone();
        c.eviction_policy = name.to_owned();
        c.policy_seed = seed;
        self.set(c)
    }

    /// The current config.
    pub fn get(&self) -> RuntimeConfig {
        self.cell.load().config.clone()
    }
}
