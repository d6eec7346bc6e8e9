//! [`Eviction`]: an eviction policy and its settings as one value — a built-in with the typed
//! config it reads (CLOCK its counter bits, MQ its queues and lifetime, ...), or a policy that
//! embedding code registered, with the shared tunables. What a cache is described with, what
//! the runtime swaps, and what a config file's flat keys (`eviction_policy`, `policy_seed`,
//! `policy_config`) resolve to once. [`OnlinePolicy`] is a made policy known to run online: the
//! one place that asks whether a policy needs the future.
//!
//! ```
//! use hisparse_policy::{Eviction, PolicyChoice, PolicyConfig};
//! let clock = Eviction::Clock { bits: 2 };
//! assert_eq!((clock.name(), clock.make_online()?.name()), ("clock", "clock"));
//! // A name and the shared tunables resolve to the typed value, keeping what the policy reads.
//! let cfg = PolicyConfig { clock_bits: 2, mq_queues: 8, ..PolicyConfig::default() };
//! assert_eq!(Eviction::from_parts(PolicyChoice::parse("clock")?, &cfg), clock);
//! assert!(Eviction::Clock { bits: 9 }.make().unwrap_err().to_string().contains("clock_bits"));
//! assert!(Eviction::Belady.make_online().is_err(), "an offline bound runs only in the simulator");
//! # Ok::<(), hisparse_policy::PolicyError>(())
//! ```

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::choice::PolicyChoice;
use crate::error::{PolicyError, Result};
use crate::policy::{BuiltinPolicy, EvictionPolicy, PolicyConfig};

/// An eviction policy with its settings (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Least recently used (HiSparse's own).
    Lru,
    /// First in, first out.
    Fifo,
    /// Seeded uniform random victims.
    Random {
        /// The seed.
        seed: u64,
    },
    /// Step-batched CLOCK; fills set the reference counter.
    Clock {
        /// Reference counter width in bits, 1..=8 (1: classic CLOCK).
        bits: u32,
    },
    /// CLOCK with the reference counter left clear on fill.
    ClockCold {
        /// Reference counter width in bits, 1..=8.
        bits: u32,
    },
    /// S3-FIFO, batch form.
    S3fifo {
        /// Steps a token dropped from probation is remembered (its ghost queue), >= 1.
        ghost_steps: u32,
    },
    /// Multi-queue, batch form.
    Mq {
        /// Queues, 1..=16.
        queues: u32,
        /// Steps without a selection after which an entry drops one queue, >= 1.
        lifetime: u32,
    },
    /// Evict the lowest indexer score this step (needs scores).
    Score,
    /// LRU where ranking just below the cut counts as a use (needs scores).
    ScoreLru,
    /// Belady's offline optimum (the simulator's bound; no cache runs it).
    Belady,
    /// A policy embedding code registered ([`crate::policy::registry::register`]), made from
    /// the shared tunables.
    Registered {
        /// Its registry entry.
        policy: PolicyChoice,
        /// What its maker reads.
        config: PolicyConfig,
    },
}

impl Default for Eviction {
    /// LRU, HiSparse's own.
    fn default() -> Self {
        Self::Lru
    }
}

impl Eviction {
    /// The typed value of `policy` with the tunables of `cfg` it reads (a registered policy keeps
    /// them all).
    pub fn from_parts(policy: PolicyChoice, cfg: &PolicyConfig) -> Self {
        let Some(builtin) = BuiltinPolicy::ALL.into_iter().find(|b| PolicyChoice::from(*b) == policy) else {
            return Self::Registered { policy, config: cfg.clone() };
        };
        match builtin {
            BuiltinPolicy::Lru => Self::Lru,
            BuiltinPolicy::Fifo => Self::Fifo,
            BuiltinPolicy::Random => Self::Random { seed: cfg.seed },
            BuiltinPolicy::Clock => Self::Clock { bits: cfg.clock_bits },
            BuiltinPolicy::ClockCold => Self::ClockCold { bits: cfg.clock_bits },
            BuiltinPolicy::S3fifo => Self::S3fifo { ghost_steps: cfg.s3fifo_ghost_steps },
            BuiltinPolicy::Mq => Self::Mq { queues: cfg.mq_queues, lifetime: cfg.mq_lifetime },
            BuiltinPolicy::Score => Self::Score,
            BuiltinPolicy::ScoreLru => Self::ScoreLru,
            BuiltinPolicy::Belady => Self::Belady,
        }
    }

    /// Its registry entry and the shared tunables it stands for (defaults where it reads none).
    pub fn parts(&self) -> (PolicyChoice, PolicyConfig) {
        let d = PolicyConfig::default();
        let (b, cfg) = match self {
            Self::Registered { policy, config } => return (*policy, config.clone()),
            Self::Lru => (BuiltinPolicy::Lru, d),
            Self::Fifo => (BuiltinPolicy::Fifo, d),
            Self::Random { seed } => (BuiltinPolicy::Random, PolicyConfig { seed: *seed, ..d }),
            Self::Clock { bits } => (BuiltinPolicy::Clock, PolicyConfig { clock_bits: *bits, ..d }),
            Self::ClockCold { bits } => (BuiltinPolicy::ClockCold, PolicyConfig { clock_bits: *bits, ..d }),
            Self::S3fifo { ghost_steps } => {
                (BuiltinPolicy::S3fifo, PolicyConfig { s3fifo_ghost_steps: *ghost_steps, ..d })
            }
            Self::Mq { queues, lifetime } => {
                (BuiltinPolicy::Mq, PolicyConfig { mq_queues: *queues, mq_lifetime: *lifetime, ..d })
            }
            Self::Score => (BuiltinPolicy::Score, d),
            Self::ScoreLru => (BuiltinPolicy::ScoreLru, d),
            Self::Belady => (BuiltinPolicy::Belady, d),
        };
        (b.into(), cfg)
    }

    /// The built-in `b` with its default settings.
    pub fn builtin(b: BuiltinPolicy) -> Self {
        Self::from_parts(b.into(), &PolicyConfig::default())
    }

    /// The registered policy named `name` with its default settings.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(Self::from_parts(PolicyChoice::parse(name)?, &PolicyConfig::default()))
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.parts().0.name()
    }

    /// The same policy with `seed` for whatever it randomises (the `random` policy's and a
    /// registered policy's seed; the others read none).
    pub fn with_seed(self, seed: u64) -> Self {
        match self {
            Self::Random { .. } => Self::Random { seed },
            Self::Registered { policy, config } => Self::Registered { policy, config: PolicyConfig { seed, ..config } },
            other => other,
        }
    }

    /// The policy made (its settings checked first; an error names the field at fault).
    pub fn make(&self) -> Result<Arc<dyn EvictionPolicy>> {
        let (policy, cfg) = self.parts();
        policy.make(&cfg)
    }

    /// The policy made, refused if it needs the future.
    pub fn make_online(&self) -> Result<OnlinePolicy> {
        OnlinePolicy::described(self.make()?, self)
    }
}

impl From<BuiltinPolicy> for Eviction {
    fn from(b: BuiltinPolicy) -> Self {
        Self::builtin(b)
    }
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Eviction {
    type Err = PolicyError;
    /// A registered name, with the default settings.
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// The JSON form: the name and the shared tunables, flat.
#[derive(Serialize, Deserialize)]
struct RawEviction {
    policy: PolicyChoice,
    #[serde(flatten)]
    config: PolicyConfig,
}

impl Serialize for Eviction {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let (policy, config) = self.parts();
        RawEviction { policy, config }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Eviction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let r = RawEviction::deserialize(d)?;
        Ok(Self::from_parts(r.policy, &r.config))
    }
}

/// A made eviction policy that runs online (it does not need the future): what a swap-in runs,
/// with the [`Eviction`] it was made from where it was made from one.
#[derive(Clone, Debug)]
pub struct OnlinePolicy {
    policy: Arc<dyn EvictionPolicy>,
    described: Option<Eviction>,
}

impl OnlinePolicy {
    /// `policy` (an object made by the caller), refused if it needs the future (Belady's
    /// optimum: the simulator's bound).
    pub fn new(policy: Arc<dyn EvictionPolicy>) -> Result<Self> {
        if policy.needs_future() {
            return Err(PolicyError::Invalid {
                field: "eviction_policy",
                value: policy.name().to_owned(),
                reason: "an offline policy (it needs the future): use it in `hisparse simulate`".into(),
            });
        }
        Ok(Self { policy, described: None })
    }

    /// `policy`, made from `eviction` (see [`Eviction::make_online`]).
    pub(crate) fn described(policy: Arc<dyn EvictionPolicy>, eviction: &Eviction) -> Result<Self> {
        Ok(Self { described: Some(eviction.clone()), ..Self::new(policy)? })
    }

    /// The policy.
    pub fn get(&self) -> &Arc<dyn EvictionPolicy> {
        &self.policy
    }

    /// What it was made from (`None` for an object the caller made).
    pub fn eviction(&self) -> Option<&Eviction> {
        self.described.as_ref()
    }
}

impl std::ops::Deref for OnlinePolicy {
    type Target = dyn EvictionPolicy;
    fn deref(&self) -> &Self::Target {
        self.policy.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_goes_to_its_parts_and_back_with_what_it_reads() {
        let cfg = PolicyConfig { seed: 9, clock_bits: 3, s3fifo_ghost_steps: 5, mq_queues: 6, mq_lifetime: 7 };
        for b in BuiltinPolicy::ALL {
            let e = Eviction::from_parts(b.into(), &cfg);
            assert!(!matches!(e, Eviction::Registered { .. }), "{b:?} is a built-in");
            assert_eq!(e.name(), b.name());
            let (policy, back) = e.parts();
            assert_eq!(Eviction::from_parts(policy, &back), e);
            // What the policy is made from is what it reads of `cfg`: the same behaviour.
            assert_eq!(policy.make(&back).unwrap().name(), b.name());
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<Eviction>(&json).unwrap(), e, "{json}");
        }
        assert_eq!(Eviction::from_parts(BuiltinPolicy::Mq.into(), &cfg), Eviction::Mq { queues: 6, lifetime: 7 });
        assert_eq!(Eviction::Lru.with_seed(4), Eviction::Lru);
        assert_eq!(Eviction::Random { seed: 1 }.with_seed(4), Eviction::Random { seed: 4 });
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        for (e, field) in [
            (Eviction::Clock { bits: 0 }, "clock_bits"),
            (Eviction::ClockCold { bits: 9 }, "clock_bits"),
            (Eviction::S3fifo { ghost_steps: 0 }, "s3fifo_ghost_steps"),
            (Eviction::Mq { queues: 17, lifetime: 1 }, "mq_queues"),
            (Eviction::Mq { queues: 4, lifetime: 0 }, "mq_lifetime"),
        ] {
            let err = e.make().unwrap_err().to_string();
            assert!(err.contains(field), "{e:?}: {err}");
        }
        assert!(Eviction::parse("lfu-9000").is_err());
    }
}
