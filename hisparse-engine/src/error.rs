//! The one error type of `hisparse-engine`.

use hisparse_kernels::KernelError;
use hisparse_memory::MemoryError;
use hisparse_policy::PolicyError;

/// What went wrong while serving requests.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A memory-level error.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A policy, config or swap-in error.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A kernel error.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// A configuration value the engine cannot use.
    #[error("invalid {field} = {value}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// The value, printed.
        value: String,
        /// Why.
        reason: String,
    },
    /// candle failed reading or making a tensor (feature `candle`).
    #[error("tensor: {0}")]
    Tensor(String),
    /// An input handed to the cache with the wrong shape or at the wrong time.
    #[error("invalid {field} = {value}: {reason}")]
    Input {
        /// The input, e.g. `prompt.kv_rows[3]`.
        field: String,
        /// The value, printed.
        value: String,
        /// Why.
        reason: String,
    },
    /// A request the engine cannot take (duplicate id, zero tokens).
    #[error("request {id}: {reason}")]
    Request {
        /// The request id.
        id: u64,
        /// Why.
        reason: String,
    },
    /// The waiting queue is full: the request was not taken (submit it again later).
    #[error("the waiting queue is full ({capacity} requests wait already)")]
    QueueFull {
        /// The queue's bound.
        capacity: usize,
    },
    /// The caller asked for a stop ([`crate::StopFlag`]); nothing was left half-done.
    #[error("stopped at the caller's request")]
    Stopped,
    /// The backup worker failed.
    #[error("backup worker: {0}")]
    Worker(String),
    /// The model the engine drives failed ([`crate::engine::DecodeModel`]): its own error.
    #[error(transparent)]
    Model(ModelFailure),
}

/// A model's own error, carried by the engine (shared, so that [`EngineError`] stays `Clone`;
/// two are equal when they are the same error).
#[derive(Clone, Debug)]
pub struct ModelFailure(pub std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl ModelFailure {
    /// `e` as the engine carries it.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(e))
    }
}

impl PartialEq for ModelFailure {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Display for ModelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ModelFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Result alias of this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
