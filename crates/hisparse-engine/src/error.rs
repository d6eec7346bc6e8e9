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
    /// A policy or swap-in error.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A kernel error.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// Result alias of this crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
