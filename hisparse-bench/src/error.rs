//! The one error type of the `hisparse` program: everything a command can fail with, printed
//! as one line before exiting with status 2.

use hisparse_kernels::KernelError;
use hisparse_memory::MemoryError;

/// What went wrong in a `hisparse` command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Bad geometry, config or buffers.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A kernel refused its input or CUDA failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// An engine error.
    #[error(transparent)]
    Engine(hisparse_engine::EngineError),
    /// A policy, trace or simulator error.
    #[error(transparent)]
    Policy(#[from] hisparse_policy::PolicyError),
    /// A command-line value that cannot be used.
    #[error("invalid --{flag} = {value}: {reason}")]
    Flag {
        /// The flag, without dashes.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A flag the chosen path does not read.
    #[error("--{flag} does nothing {when}; leave it out")]
    Unread {
        /// The flag, without dashes.
        flag: &'static str,
        /// When it is not read (e.g. "with --model or --gguf").
        when: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// A self-check found a result out of tolerance.
    #[error("self-check failed: {0}")]
    Check(String),
    /// A rank of a multi-GPU run failed (`--gpus`).
    #[error("rank {rank}: {source}")]
    Rank {
        /// The rank.
        rank: usize,
        /// What failed there.
        source: Box<BenchError>,
    },
    /// SIGINT or SIGTERM arrived; the command stopped between steps, writing nothing half-done.
    #[error("interrupted while {0}; stopped cleanly, no partial output written")]
    Interrupted(String),
    /// Standard output could not be written (its reader went away, or it is full).
    #[error("standard output: {0}")]
    Stdout(std::io::Error),
    /// The real model failed to load or run.
    #[cfg(feature = "model")]
    #[error(transparent)]
    Model(hisparse_model::ModelError),
    /// A GPU benchmark could not run or measure (CUDA, cuBLAS, a kernel's error).
    #[error("GPU benchmark: {0}")]
    // The GPU benchmarks exist only with `cuda`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Gpu(String),
}

impl From<hisparse_engine::EngineError> for BenchError {
    fn from(e: hisparse_engine::EngineError) -> Self {
        match e {
            // The engine saw our Ctrl-C (inside a step: a prefill, between admissions).
            hisparse_engine::EngineError::Stopped => Self::Interrupted("the engine ran a step".into()),
            e => Self::Engine(e),
        }
    }
}

#[cfg(feature = "model")]
impl From<hisparse_model::ModelError> for BenchError {
    fn from(e: hisparse_model::ModelError) -> Self {
        match e {
            // Our Ctrl-C, seen by the model between layers of a prefill or before a step.
            hisparse_model::ModelError::Engine(hisparse_engine::EngineError::Stopped) => {
                Self::Interrupted("the model ran".into())
            }
            hisparse_model::ModelError::Stopped(what) => Self::Interrupted(what),
            e => Self::Model(e),
        }
    }
}

/// Result alias of the program.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

impl BenchError {
    /// Shorthand for [`BenchError::Flag`].
    pub fn flag(flag: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Self::Flag { flag, value: value.to_string(), reason: reason.into() }
    }
}
