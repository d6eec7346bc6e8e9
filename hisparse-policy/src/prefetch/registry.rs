//! The prefetcher registry: one list defines every prefetcher — its name, what it does and how it
//! is made from the typed [`PrefetcherConfig`]. The built-ins are [`BuiltinPrefetcher`] (a clap
//! `ValueEnum` under the `clap` feature); embedding code adds its own with
//! [`register_prefetcher`].

use std::sync::{Arc, LazyLock, RwLock};

use serde::{Deserialize, Serialize};

use super::{AdjacentLayer, NextStep, NoPrefetch, Prefetcher, SharedIndex};
use crate::error::{PolicyError, Result};

/// The tunables of every prefetcher (missing keys take their defaults; unknown keys are errors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefetcherConfig {
    /// Most rows a speculative prefetcher brings into one buffer per step (0: a quarter of
    /// top-k). `shared-index` is exact and takes the whole selection.
    pub budget: usize,
}

/// How a registry entry makes its prefetcher.
pub type MakePrefetcher = fn(&PrefetcherConfig) -> Arc<dyn Prefetcher>;

/// A registered prefetcher.
#[derive(Clone, Copy, Debug)]
pub struct PrefetcherSpec {
    /// The name configs and the command line use.
    pub name: &'static str,
    /// One line saying what it does.
    pub about: &'static str,
    /// Makes it from the config.
    pub make: MakePrefetcher,
}

/// The built-in prefetchers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum BuiltinPrefetcher {
    /// No prefetch.
    None,
    /// Exact: shared (IndexShare) layers get their full layer's selection as soon as it is known.
    SharedIndex,
    /// Speculative: layer l's selection into layer l + 1, within the budget.
    AdjacentLayer,
    /// The candidates just below the cut, for the same layer next step, within the budget.
    NextStep,
}

impl BuiltinPrefetcher {
    /// Every built-in.
    pub const ALL: [BuiltinPrefetcher; 4] = [Self::None, Self::SharedIndex, Self::AdjacentLayer, Self::NextStep];

    /// Its registry entry.
    pub fn spec(self) -> PrefetcherSpec {
        let (name, about, make): (_, _, MakePrefetcher) = match self {
            Self::None => ("none", "no prefetch", |_| Arc::new(NoPrefetch)),
            Self::SharedIndex => {
                ("shared-index", "exact: shared layers get their full layer's selection", |_| Arc::new(SharedIndex))
            }
            Self::AdjacentLayer => ("adjacent-layer", "speculative: layer l's selection into layer l + 1", |c| {
                Arc::new(AdjacentLayer { budget: c.budget })
            }),
            Self::NextStep => ("next-step", "the candidates just below the cut, for the next step", |c| {
                Arc::new(NextStep { budget: c.budget })
            }),
        };
        PrefetcherSpec { name, about, make }
    }
}

/// Names of the built-in prefetchers.
pub const PREFETCHER_NAMES: [&str; 4] = ["none", "shared-index", "adjacent-layer", "next-step"];

static REGISTRY: LazyLock<RwLock<Vec<PrefetcherSpec>>> =
    LazyLock::new(|| RwLock::new(BuiltinPrefetcher::ALL.iter().map(|b| b.spec()).collect()));

fn read() -> std::sync::RwLockReadGuard<'static, Vec<PrefetcherSpec>> {
    // A writer that panicked mid-push leaves a consistent Vec: the data is still usable.
    REGISTRY.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Adds `spec` to the registry; refuses a name already taken.
pub fn register_prefetcher(spec: PrefetcherSpec) -> Result<()> {
    let mut all = REGISTRY.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if all.iter().any(|s| s.name == spec.name) {
        return Err(PolicyError::Invalid {
            field: "prefetcher",
            value: spec.name.to_owned(),
            reason: "a prefetcher of that name is registered already".into(),
        });
    }
    all.push(spec);
    Ok(())
}

/// Every registered prefetcher's entry, built-ins first.
pub fn prefetcher_specs() -> Vec<PrefetcherSpec> {
    read().clone()
}

/// The registered prefetcher named `name`, made from `cfg`.
pub fn make_prefetcher(name: &str, cfg: &PrefetcherConfig) -> Result<Arc<dyn Prefetcher>> {
    let all = read();
    match all.iter().find(|s| s.name == name) {
        Some(s) => Ok((s.make)(cfg)),
        None => Err(PolicyError::Invalid {
            field: "prefetcher",
            value: name.to_owned(),
            reason: format!("known prefetchers: {}", all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")),
        }),
    }
}

/// The registered prefetcher named `name` with the default config.
pub fn prefetcher_by_name(name: &str) -> Result<Arc<dyn Prefetcher>> {
    make_prefetcher(name, &PrefetcherConfig::default())
}
