//! Choices made at the edge: an eviction policy or a prefetcher named in a config file or on
//! the command line is resolved against its registry once, into a [`PolicyChoice`] or a
//! [`PrefetcherChoice`] that carries the registry entry — nothing downstream looks a name up or
//! compares one again.
//!
//! ```
//! use hisparse_policy::{BuiltinPolicy, PolicyChoice, PolicyConfig};
//! let lru = PolicyChoice::parse("lru")?;
//! assert_eq!(lru, PolicyChoice::from(BuiltinPolicy::Lru));
//! assert_eq!(lru.make(&PolicyConfig::default())?.name(), "lru");
//! assert!(PolicyChoice::parse("lfu-9000").is_err());
//! # Ok::<(), hisparse_policy::PolicyError>(())
//! ```

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{PolicyError, Result};
use crate::policy::registry::specs;
use crate::policy::{BuiltinPolicy, EvictionPolicy, PolicyConfig, PolicySpec};
use crate::prefetch::{BuiltinPrefetcher, Prefetcher, PrefetcherConfig, PrefetcherSpec, prefetcher_specs};

/// A registered eviction policy, chosen by name once.
#[derive(Clone, Copy, Debug)]
pub struct PolicyChoice(PolicySpec);

impl PolicyChoice {
    /// The registered policy named `name` (built-ins and those embedding code registered).
    pub fn parse(name: &str) -> Result<Self> {
        let all = specs();
        all.iter().find(|s| s.name == name).map(|s| Self(*s)).ok_or_else(|| PolicyError::UnknownPolicy {
            name: name.to_owned(),
            known: all.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        })
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// Its registry entry.
    pub fn spec(&self) -> PolicySpec {
        self.0
    }

    /// The policy made from `cfg` (checked first).
    pub fn make(&self, cfg: &PolicyConfig) -> Result<Arc<dyn EvictionPolicy>> {
        cfg.validate()?;
        Ok((self.0.make)(cfg))
    }
}

impl From<BuiltinPolicy> for PolicyChoice {
    fn from(b: BuiltinPolicy) -> Self {
        Self(b.spec())
    }
}

impl Default for PolicyChoice {
    /// LRU, HiSparse's own.
    fn default() -> Self {
        BuiltinPolicy::Lru.into()
    }
}

impl PartialEq for PolicyChoice {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for PolicyChoice {}

impl std::fmt::Display for PolicyChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyChoice {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl Serialize for PolicyChoice {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for PolicyChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// A registered prefetcher, chosen by name once.
#[derive(Clone, Copy, Debug)]
pub struct PrefetcherChoice(PrefetcherSpec);

impl PrefetcherChoice {
    /// The registered prefetcher named `name`.
    pub fn parse(name: &str) -> Result<Self> {
        let all = prefetcher_specs();
        all.iter().find(|s| s.name == name).map(|s| Self(*s)).ok_or_else(|| PolicyError::Invalid {
            field: "prefetcher",
            value: name.to_owned(),
            reason: format!("known prefetchers: {}", all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")),
        })
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// Whether it is `none`.
    pub fn is_none(&self) -> bool {
        *self == BuiltinPrefetcher::None.into()
    }

    /// The prefetcher made from `cfg`.
    pub fn make(&self, cfg: &PrefetcherConfig) -> Arc<dyn Prefetcher> {
        (self.0.make)(cfg)
    }
}

impl From<BuiltinPrefetcher> for PrefetcherChoice {
    fn from(b: BuiltinPrefetcher) -> Self {
        Self(b.spec())
    }
}

impl Default for PrefetcherChoice {
    /// No prefetch.
    fn default() -> Self {
        BuiltinPrefetcher::None.into()
    }
}

impl PartialEq for PrefetcherChoice {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for PrefetcherChoice {}

impl std::fmt::Display for PrefetcherChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PrefetcherChoice {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

impl Serialize for PrefetcherChoice {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for PrefetcherChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Self::parse(&name).map_err(serde::de::Error::custom)
    }
}
