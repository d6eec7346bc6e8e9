//! Who brings a layer's missed rows into its hot buffer ([`MissFill`]): an option of the backend
//! (`CudaBackend::with_miss_fill`, [`crate::CpuBackend::with_miss_fill`]), not of the cache or
//! its policy — one enum, its parameters inside its variants, chosen once at the command-line
//! edge. The CPU backend copies the misses whatever the choice but `no-copies`; the CUDA swap-in
//! follows it.

use hisparse_policy::OnlinePolicy;

use crate::error::{KernelError, Result};

/// The name of a miss-fill form, as configs and the command line write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum MissFillMode {
    /// Deferred in small batches (at most `miss_fill_max_batch` requests), the swap-in's copy
    /// above.
    Auto,
    /// The swap-in's copy kernel, before the attention.
    SwapIn,
    /// The attention reads the misses from the host tier as it goes and writes them back.
    Attention,
    /// The attention reads the misses; the swap-in runs after it on a stream of its own.
    Deferred,
    /// As deferred, the misses gathered into device staging rows first.
    DeferredGather,
    /// As deferred, the attention over the hits while the misses are gathered, then over the
    /// misses and an LSE merge (equal within the attention's bf16 tolerance).
    HitsFirst,
    /// As deferred-gather, the misses gathered by host threads into pinned rows and copied by
    /// the copy engine.
    CopyEngine,
    /// Timing only: the misses are never copied (the step without the swap-in's copies; its
    /// outputs are wrong), the decisions placed as `auto` places them.
    NoCopies,
}

/// Who brings a layer's missed rows into its hot buffer (CUDA; results are bit-identical in
/// every form but [`MissFill::HitsFirst`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum MissFill {
    /// The swap-in's own copy kernel, before the attention starts (the default).
    #[default]
    SwapIn,
    /// The attention reads them from the host tier as it goes and writes them back.
    Attention,
    /// The attention only reads them from the host tier; the swap-in's decisions and copies run
    /// after it on a stream of their own, off the critical path (not with a policy that reads
    /// scores, which the next layer overwrites first).
    Deferred,
    /// As [`MissFill::Deferred`], but the misses are first gathered into device staging rows
    /// where the attention reads them, so each crosses PCIe once.
    DeferredGather,
    /// As [`MissFill::Deferred`], but the misses are gathered into staging rows while the
    /// attention runs over the hits alone; then the attention over the misses and the LSE
    /// merge: equal to the other forms within the attention's bf16 tolerance, not bit for bit
    /// (warpgroup-MMA attention only).
    HitsFirst,
    /// As [`MissFill::DeferredGather`], but host threads gather the misses into pinned landing
    /// rows, the copy engine copies them and a kernel scatters them into the staging rows.
    CopyEngine {
        /// Of a step's selection entries, the share the landing rows hold per layer (a fixed
        /// size, as a graph's copy has one); misses past it are read by the scatter kernel. In
        /// (0, 1].
        share: f64,
        /// Host threads of the gather (0: the machine's cores less two), at most 256.
        host_threads: usize,
    },
    /// [`MissFill::Deferred`] for batches of at most `max_batch` requests, where the swap-in's
    /// latency dominates (with a policy that reads scores, the attention fills them there);
    /// [`MissFill::SwapIn`] above.
    Auto {
        /// The largest batch whose swap-in is deferred.
        max_batch: usize,
    },
    /// Nobody: the swap-in decides as always but copies no row, neither miss nor prefetch, so
    /// attention reads whatever the slots held. A timing bound (the step with the swap-in's
    /// copies taken out), on both backends; its outputs are wrong. Its decisions run where
    /// [`MissFill::Auto`] with the same `max_batch` runs them (CUDA): for batches of at most
    /// `max_batch` requests after a locate, on the deferred swap-in's stream, the attention
    /// reading hot rows only (a miss's placeholder slot, never the host tier); on the main
    /// stream above. So it bounds `auto`'s step at every batch.
    NoCopies {
        /// The largest batch whose decisions are deferred (0: never, the bound of `swap-in`).
        max_batch: usize,
    },
}

impl MissFill {
    /// `Auto`'s default largest deferred batch.
    pub const DEFAULT_MAX_BATCH: usize = 8;
    /// `CopyEngine`'s default share of the selection entries.
    pub const DEFAULT_SHARE: f64 = 0.125;
    /// `CopyEngine`'s default host threads (0: the cores less two, [`MissFill::gather_threads`]).
    pub const DEFAULT_HOST_THREADS: usize = 0;

    /// The form named `mode`, with the parameters its variant takes.
    pub fn new(mode: MissFillMode, max_batch: usize, share: f64, host_threads: usize) -> Self {
        match mode {
            MissFillMode::Auto => Self::Auto { max_batch },
            MissFillMode::SwapIn => Self::SwapIn,
            MissFillMode::Attention => Self::Attention,
            MissFillMode::Deferred => Self::Deferred,
            MissFillMode::DeferredGather => Self::DeferredGather,
            MissFillMode::HitsFirst => Self::HitsFirst,
            MissFillMode::CopyEngine => Self::CopyEngine { share, host_threads },
            MissFillMode::NoCopies => Self::NoCopies { max_batch },
        }
    }

    /// Its name.
    pub fn mode(&self) -> MissFillMode {
        match self {
            Self::Auto { .. } => MissFillMode::Auto,
            Self::SwapIn => MissFillMode::SwapIn,
            Self::Attention => MissFillMode::Attention,
            Self::Deferred => MissFillMode::Deferred,
            Self::DeferredGather => MissFillMode::DeferredGather,
            Self::HitsFirst => MissFillMode::HitsFirst,
            Self::CopyEngine { .. } => MissFillMode::CopyEngine,
            Self::NoCopies { .. } => MissFillMode::NoCopies,
        }
    }

    /// The largest batch whose misses the attention takes (0: none, `usize::MAX`: every batch).
    pub fn fill_max_batch(&self) -> usize {
        match self {
            Self::SwapIn => 0,
            Self::Auto { max_batch } | Self::NoCopies { max_batch } => *max_batch,
            _ => usize::MAX,
        }
    }

    /// Whether, where the attention takes the misses, it only reads them and the swap-in runs
    /// after it.
    pub fn deferred(&self) -> bool {
        !matches!(self, Self::SwapIn | Self::Attention | Self::NoCopies { .. })
    }

    /// Whether rows are copied into the hot buffers at all (all but [`MissFill::NoCopies`]).
    pub fn copies(&self) -> bool {
        !matches!(self, Self::NoCopies { .. })
    }

    /// The timing bound of this form: [`MissFill::NoCopies`] with its decisions placed where
    /// this form places them (deferred at the batches `auto` defers, else on the main stream).
    pub fn bound(&self) -> Self {
        match *self {
            Self::Auto { max_batch } | Self::NoCopies { max_batch } => Self::NoCopies { max_batch },
            _ => Self::NoCopies { max_batch: 0 },
        }
    }

    /// Whether the misses are gathered into staging rows by the locate (`deferred-gather`).
    pub fn gathers(&self) -> bool {
        matches!(self, Self::DeferredGather)
    }

    /// Whether the attention runs over the hits first (`hits-first`).
    pub fn hits_first(&self) -> bool {
        matches!(self, Self::HitsFirst)
    }

    /// The copy engine's share and host threads (`copy-engine`).
    pub fn copy_engine(&self) -> Option<(f64, usize)> {
        match self {
            Self::CopyEngine { share, host_threads } => Some((*share, *host_threads)),
            _ => None,
        }
    }

    /// The host threads a gather of `host_threads` (0: the cores less two, at least one) uses.
    pub fn gather_threads(host_threads: usize) -> usize {
        match host_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(2).max(1)),
            t => t,
        }
    }

    /// Checks that `policy` can run under this form: one that reads each layer's scores cannot
    /// where the swap-in is always deferred (the next layer overwrites the scores first).
    pub fn check_policy(&self, policy: &OnlinePolicy) -> Result<()> {
        let always_deferred = self.deferred() && !matches!(self, Self::Auto { .. });
        if always_deferred && policy.needs_scores() {
            return Err(KernelError::invalid(
                "miss_fill",
                self.mode(),
                format!(
                    "the {} policy reads each layer's scores, which the next layer overwrites before a deferred \
                     swap-in decides; use auto, swap-in or attention with it",
                    policy.name()
                ),
            ));
        }
        Ok(())
    }

    /// Checks the parameters; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if let Self::CopyEngine { share, host_threads } = *self {
            if !(share > 0.0 && share <= 1.0) {
                return Err(KernelError::invalid(
                    "copy_engine_share",
                    format!("{share:?}"),
                    "must be in (0, 1] (a share of the selection entries)",
                ));
            }
            if host_threads > 256 {
                return Err(KernelError::invalid("host_gather_threads", host_threads, "must be at most 256"));
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for MissFillMode {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self> {
        // The serde name (kebab-case) is the name everywhere.
        serde_json::from_value(serde_json::Value::String(s.to_owned()))
            .map_err(|e| KernelError::invalid("miss_fill", s, e.to_string()))
    }
}

impl From<MissFillMode> for MissFill {
    /// The form with its default parameters.
    fn from(mode: MissFillMode) -> Self {
        Self::new(mode, Self::DEFAULT_MAX_BATCH, Self::DEFAULT_SHARE, Self::DEFAULT_HOST_THREADS)
    }
}

impl std::fmt::Display for MissFillMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The serde name (kebab-case) is the name everywhere.
        let v = serde_json::to_value(self).map_err(|_| std::fmt::Error)?;
        f.write_str(v.as_str().unwrap_or("?"))
    }
}

#[cfg(test)]
mod tests {
    use hisparse_policy::{BuiltinPolicy, Eviction};

    use super::*;

    fn field_of(e: KernelError) -> &'static str {
        match e {
            KernelError::InvalidArgument { field, .. } => field,
            e => panic!("not a field error: {e}"),
        }
    }

    /// Every form's name parses back to it; an unknown one is refused naming `miss_fill` and the
    /// known names.
    #[test]
    fn every_form_is_named_once() {
        for name in
            ["auto", "swap-in", "attention", "deferred", "deferred-gather", "hits-first", "copy-engine", "no-copies"]
        {
            let m = name.parse::<MissFillMode>().unwrap();
            assert_eq!((m.to_string(), MissFill::from(m).mode()), (name.to_owned(), m));
        }
        let e = "dma".parse::<MissFillMode>().unwrap_err().to_string();
        assert!(e.contains("miss_fill") && e.contains("dma") && e.contains("hits-first"), "{e}");
    }

    /// The parameters out of range, and a policy that reads scores under a form that always
    /// defers, are refused naming the field.
    #[test]
    fn bad_parameters_and_unrunnable_policies_are_named() {
        for (share, threads, field) in [
            (0.0, 0, "copy_engine_share"),
            (1.5, 0, "copy_engine_share"),
            (f64::NAN, 0, "copy_engine_share"),
            (0.125, 1000, "host_gather_threads"),
        ] {
            let e = MissFill::CopyEngine { share, host_threads: threads }.validate().unwrap_err();
            assert_eq!(field_of(e), field, "{share} / {threads}");
        }
        MissFill::CopyEngine { share: 0.125, host_threads: 256 }.validate().unwrap();
        let score = Eviction::from(BuiltinPolicy::Score).make_online().unwrap();
        let lru = Eviction::Lru.make_online().unwrap();
        let deferred =
            [MissFill::Deferred, MissFill::DeferredGather, MissFill::HitsFirst, MissFillMode::CopyEngine.into()];
        for fill in deferred {
            let e = fill.check_policy(&score).unwrap_err();
            assert!(e.to_string().contains("score"), "{e}");
            assert_eq!(field_of(e), "miss_fill");
            fill.check_policy(&lru).unwrap();
        }
        let taking = [
            MissFill::SwapIn,
            MissFill::Attention,
            MissFill::Auto { max_batch: 8 },
            MissFill::NoCopies { max_batch: 8 },
        ];
        for fill in taking {
            fill.check_policy(&score).unwrap();
        }
    }

    /// The bound of a form places its decisions where that form does: deferred at the batches
    /// `auto` defers, on the main stream for every other form; it never copies.
    #[test]
    fn the_bound_of_a_form_defers_where_it_defers_and_never_copies() {
        let share = MissFill::DEFAULT_SHARE;
        for (form, max_batch) in [
            (MissFill::Auto { max_batch: 6 }, 6),
            (MissFill::NoCopies { max_batch: 3 }, 3),
            (MissFill::SwapIn, 0),
            (MissFill::Deferred, 0),
            (MissFill::CopyEngine { share, host_threads: 2 }, 0),
        ] {
            let b = form.bound();
            assert_eq!(b, MissFill::NoCopies { max_batch }, "{form:?}");
            assert!(!b.copies() && !b.deferred() && form.copies() == (form != b), "{form:?}");
            assert_eq!(b.fill_max_batch(), max_batch);
        }
    }
}
