//! The policy registry: one list defines every policy — its name (the value configs and the
//! command line use), what it is, whether it runs online, and how it is made from the typed
//! [`PolicyConfig`]; its CUDA source comes from the policy itself. The built-ins are
//! [`BuiltinPolicy`] (a clap `ValueEnum` under the `clap` feature); embedding code adds its own
//! with [`register`], after which [`by_name`] and the engine find it like a built-in.

use std::sync::{Arc, LazyLock, RwLock};

use serde::{Deserialize, Serialize};

use super::{Belady, Clock, EvictionPolicy, Fifo, Lru, Mq, Random, S3Fifo, ScoreAware, ScoreMix};
use crate::error::{PolicyError, Result};

/// The tunables of every policy, in one typed, serde-readable struct (missing keys take their
/// defaults; unknown keys are errors). Each policy reads the fields it needs.
///
/// ```
/// use hisparse_policy::PolicyConfig;
/// let c: PolicyConfig = serde_json::from_str(r#"{"clock_bits": 2, "mq_queues": 8}"#)?;
/// assert_eq!((c.clock_bits, c.mq_queues, c.mq_lifetime), (2, 8, PolicyConfig::default().mq_lifetime));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Seed of randomised policies (`random`).
    pub seed: u64,
    /// CLOCK's reference counter width in bits, 1..=8 (1: classic CLOCK).
    pub clock_bits: u32,
    /// S3-FIFO: steps a token dropped from probation is remembered (its ghost queue), >= 1.
    pub s3fifo_ghost_steps: u32,
    /// MQ: queues, 1..=16.
    pub mq_queues: u32,
    /// MQ: steps without a selection after which an entry drops one queue, >= 1.
    pub mq_lifetime: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self { seed: 0, clock_bits: 1, s3fifo_ghost_steps: 16, mq_queues: 4, mq_lifetime: 8 }
    }
}

impl PolicyConfig {
    /// The default config with `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self { seed, ..Self::default() }
    }

    /// Checks every field; the error names the first at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, v: u32, reason: &str| {
            Err(PolicyError::Invalid { field, value: v.to_string(), reason: reason.into() })
        };
        if !(1..=8).contains(&self.clock_bits) {
            return bad("clock_bits", self.clock_bits, "must be in 1..=8");
        }
        if self.s3fifo_ghost_steps == 0 {
            return bad("s3fifo_ghost_steps", 0, "must be at least 1");
        }
        if !(1..=16).contains(&self.mq_queues) {
            return bad("mq_queues", self.mq_queues, "must be in 1..=16");
        }
        if self.mq_lifetime == 0 {
            return bad("mq_lifetime", 0, "must be at least 1");
        }
        Ok(())
    }
}

/// How a registry entry makes its policy.
pub type MakePolicy = fn(&PolicyConfig) -> Arc<dyn EvictionPolicy>;

/// A registered policy.
#[derive(Clone, Copy, Debug)]
pub struct PolicySpec {
    /// The name configs and the command line use.
    pub name: &'static str,
    /// One line saying what it does.
    pub about: &'static str,
    /// Whether it runs without knowing the future (everything but offline bounds).
    pub online: bool,
    /// Makes the policy from the config.
    pub make: MakePolicy,
}

/// The built-in policies (in this order in reports; online ones first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum BuiltinPolicy {
    /// Least recently used (HiSparse's own).
    Lru,
    /// First in, first out.
    Fifo,
    /// Seeded uniform random victims.
    Random,
    /// Step-batched CLOCK; fills set the reference bit.
    Clock,
    /// CLOCK with the reference bit left clear on fill.
    ClockCold,
    /// S3-FIFO, batch form (probation, main, ghost).
    S3fifo,
    /// Multi-queue, batch form.
    Mq,
    /// Evict the lowest indexer score this step (needs scores).
    Score,
    /// LRU where ranking just below the cut counts as a use (needs scores).
    ScoreLru,
    /// Belady's offline optimum (simulator only).
    Belady,
}

impl BuiltinPolicy {
    /// Every built-in.
    pub const ALL: [BuiltinPolicy; 10] = [
        Self::Lru,
        Self::Fifo,
        Self::Random,
        Self::Clock,
        Self::ClockCold,
        Self::S3fifo,
        Self::Mq,
        Self::Score,
        Self::ScoreLru,
        Self::Belady,
    ];

    /// Its registry entry.
    pub fn spec(self) -> PolicySpec {
        let (name, about, online, make): (_, _, _, MakePolicy) = match self {
            Self::Lru => ("lru", "least recently used (HiSparse's own)", true, |_| Arc::new(Lru)),
            Self::Fifo => ("fifo", "first in, first out", true, |_| Arc::new(Fifo)),
            Self::Random => ("random", "seeded uniform random victims", true, |c| Arc::new(Random::new(c.seed))),
            Self::Clock => ("clock", "step-batched CLOCK, fills referenced", true, |c| {
                Arc::new(Clock { clear_on_insert: false, bits: c.clock_bits })
            }),
            Self::ClockCold => ("clock-cold", "CLOCK, fills unreferenced", true, |c| {
                Arc::new(Clock { clear_on_insert: true, bits: c.clock_bits })
            }),
            Self::S3fifo => {
                ("s3fifo", "S3-FIFO, batch form", true, |c| Arc::new(S3Fifo { ghost_steps: c.s3fifo_ghost_steps }))
            }
            Self::Mq => ("mq", "multi-queue, batch form", true, |c| {
                Arc::new(Mq { queues: c.mq_queues, lifetime: c.mq_lifetime })
            }),
            Self::Score => ("score", "lowest indexer score first (needs scores)", true, |_| {
                Arc::new(ScoreAware { mix: ScoreMix::Score })
            }),
            Self::ScoreLru => ("score-lru", "LRU, near-cut candidates count as used (needs scores)", true, |_| {
                Arc::new(ScoreAware { mix: ScoreMix::Recency })
            }),
            Self::Belady => ("belady", "Belady's offline optimum (simulator only)", false, |_| Arc::new(Belady)),
        };
        PolicySpec { name, about, online, make }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

/// Names of the built-in policies, online ones first.
pub const POLICY_NAMES: [&str; 10] =
    ["lru", "fifo", "random", "clock", "clock-cold", "s3fifo", "mq", "score", "score-lru", "belady"];

static REGISTRY: LazyLock<RwLock<Vec<PolicySpec>>> =
    LazyLock::new(|| RwLock::new(BuiltinPolicy::ALL.iter().map(|b| b.spec()).collect()));

fn read() -> std::sync::RwLockReadGuard<'static, Vec<PolicySpec>> {
    // A writer that panicked mid-push leaves a consistent Vec: the data is still usable.
    REGISTRY.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Adds `spec` to the registry (embedding code's own policy); refuses a name already taken.
pub fn register(spec: PolicySpec) -> Result<()> {
    let mut all = REGISTRY.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if all.iter().any(|s| s.name == spec.name) {
        return Err(PolicyError::Invalid {
            field: "policy",
            value: spec.name.to_owned(),
            reason: "a policy of that name is registered already".into(),
        });
    }
    all.push(spec);
    Ok(())
}

/// Every registered policy's entry, built-ins first.
pub fn specs() -> Vec<PolicySpec> {
    read().clone()
}

/// The registered policy named `name`, made from `cfg` (checked first).
pub fn make(name: &str, cfg: &PolicyConfig) -> Result<Arc<dyn EvictionPolicy>> {
    cfg.validate()?;
    let all = read();
    match all.iter().find(|s| s.name == name) {
        Some(s) => Ok((s.make)(cfg)),
        None => Err(PolicyError::UnknownPolicy {
            name: name.to_owned(),
            known: all.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The registered policy named `name` with the default config but `seed`.
pub fn by_name(name: &str, seed: u64) -> Result<Arc<dyn EvictionPolicy>> {
    make(name, &PolicyConfig::seeded(seed))
}

/// Every built-in policy (`random` with `seed`).
pub fn builtin(seed: u64) -> Vec<Arc<dyn EvictionPolicy>> {
    let cfg = PolicyConfig::seeded(seed);
    BuiltinPolicy::ALL.iter().map(|b| (b.spec().make)(&cfg)).collect()
}

/// Every registered policy, built-ins first (`random` with `seed`).
pub fn registered(seed: u64) -> Vec<Arc<dyn EvictionPolicy>> {
    let cfg = PolicyConfig::seeded(seed);
    read().iter().map(|s| (s.make)(&cfg)).collect()
}
