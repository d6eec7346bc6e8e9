//! What may change between decode steps without stopping the engine: the eviction policy (and
//! its seed) and the batch cap, swapped atomically through arc-swap from any thread.

use std::sync::Arc;

use arc_swap::ArcSwap;
use hisparse_policy::{Eviction, OnlinePolicy};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// The runtime-swappable part of the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// The eviction policy with its settings (an online one: refused otherwise when the config
    /// is set).
    pub eviction: Eviction,
    /// Most requests decoded together (0: no cap beyond capacity).
    pub max_running: usize,
}

/// A runtime config with its policy made.
#[derive(Debug)]
pub struct Runtime {
    /// The config.
    pub config: RuntimeConfig,
    /// Its policy.
    pub policy: OnlinePolicy,
}

impl Runtime {
    /// Makes `config`'s policy; refuses offline policies (they need the future).
    pub fn new(config: RuntimeConfig) -> Result<Self> {
        let policy = config.eviction.make_online()?;
        Ok(Self { config, policy })
    }
}

/// A handle that swaps the engine's runtime config from any thread; takes effect at the next
/// decode step.
#[derive(Clone, Debug)]
pub struct RuntimeHandle {
    pub(crate) cell: Arc<ArcSwap<Runtime>>,
    /// The backend's miss-fill form, which a new policy must be able to run under.
    pub(crate) miss_fill: hisparse_kernels::MissFill,
}

impl RuntimeHandle {
    /// Replaces the whole runtime config; refused, keeping the one in use, where its policy
    /// needs the future or cannot run under the cache's miss-fill.
    pub fn set(&self, config: RuntimeConfig) -> Result<()> {
        let runtime = Runtime::new(config)?;
        self.miss_fill.check_policy(&runtime.policy)?;
        self.cell.store(Arc::new(runtime));
        Ok(())
    }

    /// Replaces the eviction policy, keeping the rest.
    pub fn set_policy(&self, eviction: Eviction) -> Result<()> {
        let mut c = self.cell.load().config.clone();
        c.eviction = eviction;
        self.set(c)
    }

    /// The current config.
    pub fn get(&self) -> RuntimeConfig {
        self.cell.load().config.clone()
    }
}
