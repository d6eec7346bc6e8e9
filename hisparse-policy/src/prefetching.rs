//! [`Prefetch`]: a prefetcher and its settings as one value — a built-in with the config it
//! reads (the speculative ones their budget of rows; the exact one and `none` nothing), or a
//! prefetcher embedding code registered, with the shared config. What a cache is described with
//! and what a config file's flat keys (`prefetcher`, `prefetch_budget`) resolve to once.
//!
//! ```
//! use hisparse_policy::{Prefetch, PrefetcherChoice, PrefetcherConfig};
//! let adjacent = Prefetch::AdjacentLayer { budget: 16 };
//! assert_eq!((adjacent.name(), adjacent.make().name()), ("adjacent-layer", "adjacent-layer"));
//! // A name and the shared config resolve to the typed value, keeping what the prefetcher reads.
//! let shared = Prefetch::from_parts(PrefetcherChoice::parse("shared-index")?, &PrefetcherConfig { budget: 16 });
//! assert_eq!((shared, shared.budget()), (Prefetch::SharedIndex, None));
//! assert_eq!(Prefetch::parse("next-step")?, Prefetch::NextStep { budget: 0 });
//! # Ok::<(), hisparse_policy::PolicyError>(())
//! ```

use std::sync::Arc;

use crate::choice::PrefetcherChoice;
use crate::error::{PolicyError, Result};
use crate::prefetch::{BuiltinPrefetcher, Prefetcher, PrefetcherConfig};

/// A prefetcher with its settings (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Prefetch {
    /// No prefetch.
    #[default]
    None,
    /// Exact: shared (IndexShare) layers get their full layer's selection as soon as it is known
    /// (the whole selection: no budget).
    SharedIndex,
    /// Speculative: layer l's selection into layer l + 1.
    AdjacentLayer {
        /// Most rows brought into one buffer per step (0: a quarter of top-k).
        budget: usize,
    },
    /// Speculative: the candidates just below the cut, for the same layer next step.
    NextStep {
        /// Most rows brought into one buffer per step (0: a quarter of top-k).
        budget: usize,
    },
    /// A prefetcher embedding code registered, made from the shared config.
    Registered {
        /// Its registry entry.
        prefetcher: PrefetcherChoice,
        /// What its maker reads.
        config: PrefetcherConfig,
    },
}

impl Prefetch {
    /// The typed value of `prefetcher` with what of `cfg` it reads (a registered one keeps it all).
    pub fn from_parts(prefetcher: PrefetcherChoice, cfg: &PrefetcherConfig) -> Self {
        let builtin = BuiltinPrefetcher::ALL.into_iter().find(|b| PrefetcherChoice::from(*b) == prefetcher);
        match builtin {
            None => Self::Registered { prefetcher, config: *cfg },
            Some(BuiltinPrefetcher::None) => Self::None,
            Some(BuiltinPrefetcher::SharedIndex) => Self::SharedIndex,
            Some(BuiltinPrefetcher::AdjacentLayer) => Self::AdjacentLayer { budget: cfg.budget },
            Some(BuiltinPrefetcher::NextStep) => Self::NextStep { budget: cfg.budget },
        }
    }

    /// [`Prefetch::from_parts`], refused where `cfg` sets a budget the prefetcher does not read
    /// (an error naming `prefetch_budget`).
    pub fn checked_parts(prefetcher: PrefetcherChoice, cfg: &PrefetcherConfig) -> Result<Self> {
        Self::from_parts(prefetcher, cfg).with_read_budget(cfg.budget)
    }

    /// The same prefetcher with `budget`, refused (naming `prefetch_budget`) where it reads no
    /// budget and `budget` is not 0 (0 stands for each prefetcher's default).
    fn with_read_budget(self, budget: usize) -> Result<Self> {
        if budget != 0 && self.budget().is_none() {
            return Err(PolicyError::Invalid {
                field: "prefetch_budget",
                value: budget.to_string(),
                reason: format!("the prefetcher {} reads no budget (adjacent-layer and next-step do)", self.name()),
            });
        }
        Ok(self.with_budget(budget))
    }

    /// Its registry entry and the shared config it stands for (a zero budget where it reads none).
    pub fn parts(&self) -> (PrefetcherChoice, PrefetcherConfig) {
        let (b, budget) = match *self {
            Self::Registered { prefetcher, config } => return (prefetcher, config),
            Self::None => (BuiltinPrefetcher::None, 0),
            Self::SharedIndex => (BuiltinPrefetcher::SharedIndex, 0),
            Self::AdjacentLayer { budget } => (BuiltinPrefetcher::AdjacentLayer, budget),
            Self::NextStep { budget } => (BuiltinPrefetcher::NextStep, budget),
        };
        (b.into(), PrefetcherConfig { budget })
    }

    /// The registered prefetcher named `name` with its default settings.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(Self::from_parts(PrefetcherChoice::parse(name)?, &PrefetcherConfig::default()))
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.parts().0.name()
    }

    /// Whether it is `none`.
    pub fn is_none(&self) -> bool {
        *self == Self::None
    }

    /// The budget of rows it reads, if it reads one (the speculative ones and registered ones).
    pub fn budget(&self) -> Option<usize> {
        match *self {
            Self::AdjacentLayer { budget } | Self::NextStep { budget } => Some(budget),
            Self::Registered { config, .. } => Some(config.budget),
            Self::None | Self::SharedIndex => None,
        }
    }

    /// The same prefetcher with `budget` where it reads one.
    pub fn with_budget(self, budget: usize) -> Self {
        match self {
            Self::AdjacentLayer { .. } => Self::AdjacentLayer { budget },
            Self::NextStep { .. } => Self::NextStep { budget },
            Self::Registered { prefetcher, .. } => Self::Registered { prefetcher, config: PrefetcherConfig { budget } },
            other => other,
        }
    }

    /// This value with the prefetcher and the budget replaced where given (flags over a config):
    /// a new prefetcher keeps the budget set so far; a budget given for a prefetcher that reads
    /// none is refused as [`Prefetch::checked_parts`] refuses it.
    pub fn overridden(self, prefetcher: Option<PrefetcherChoice>, budget: Option<usize>) -> Result<Self> {
        let (choice, cfg) = self.parts();
        let p = Self::from_parts(prefetcher.unwrap_or(choice), &cfg);
        match budget {
            Some(b) => p.with_read_budget(b),
            None => Ok(p),
        }
    }

    /// The prefetcher made.
    pub fn make(&self) -> Arc<dyn Prefetcher> {
        let (p, cfg) = self.parts();
        p.make(&cfg)
    }
}

impl From<BuiltinPrefetcher> for Prefetch {
    fn from(b: BuiltinPrefetcher) -> Self {
        Self::from_parts(b.into(), &PrefetcherConfig::default())
    }
}

impl From<PrefetcherChoice> for Prefetch {
    fn from(p: PrefetcherChoice) -> Self {
        Self::from_parts(p, &PrefetcherConfig::default())
    }
}

impl std::fmt::Display for Prefetch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Prefetch {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_goes_to_its_parts_and_back() {
        for b in BuiltinPrefetcher::ALL {
            let cfg = PrefetcherConfig { budget: 7 };
            let p = Prefetch::from_parts(b.into(), &cfg);
            let (choice, back) = p.parts();
            assert_eq!(choice, PrefetcherChoice::from(b));
            assert_eq!(Prefetch::from_parts(choice, &back), p, "{b:?}");
            assert_eq!(back.budget, p.budget().unwrap_or(0), "{b:?}");
            assert_eq!(p.make().name(), b.spec().name);
            assert_eq!(p.with_budget(3).budget(), p.budget().map(|_| 3));
        }
        let adjacent = Some(BuiltinPrefetcher::AdjacentLayer.into());
        let next = Prefetch::NextStep { budget: 12 };
        assert_eq!(next.overridden(adjacent, None).unwrap(), Prefetch::AdjacentLayer { budget: 12 });
        assert_eq!(Prefetch::None.overridden(adjacent, Some(5)).unwrap(), Prefetch::AdjacentLayer { budget: 5 });
        assert_eq!(next.overridden(Some(BuiltinPrefetcher::SharedIndex.into()), None).unwrap(), Prefetch::SharedIndex);
        let e = Prefetch::None.overridden(None, Some(5)).unwrap_err().to_string();
        assert!(e.contains("prefetch_budget") && e.contains("none reads no budget"), "{e}");
        // A config and a flag follow one rule: 0 is every prefetcher's default, so it passes.
        assert_eq!(Prefetch::None.overridden(None, Some(0)).unwrap(), Prefetch::None);
        let shared =
            |budget| Prefetch::checked_parts(BuiltinPrefetcher::SharedIndex.into(), &PrefetcherConfig { budget });
        let e = shared(3).unwrap_err().to_string();
        assert!(e.contains("prefetch_budget") && e.contains("shared-index reads no budget"), "{e}");
        assert_eq!(shared(0).unwrap(), Prefetch::SharedIndex);
        assert!(Prefetch::parse("psychic").unwrap_err().to_string().contains("prefetcher"));
        assert!(Prefetch::default().is_none() && !Prefetch::SharedIndex.is_none());
    }
}
