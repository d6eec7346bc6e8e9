//! The one error type of `hisparse-kernels`: bad arguments name the field and value; CUDA
//! problems say what was missing or what the driver or compiler answered.

use hisparse_memory::MemoryError;
use hisparse_policy::PolicyError;

/// What went wrong in a kernel call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A memory-level error (buffer bounds, row codecs, geometry).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A policy-level error (the CPU swap-in's decisions, a prefetcher's configuration).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A background worker (the CPU backup thread) stopped or failed a copy.
    #[error("worker: {0}")]
    Worker(String),
    /// An argument has a value the kernel cannot use.
    #[error("invalid {field} = {value}: {reason}")]
    InvalidArgument {
        /// The argument, as the API spells it.
        field: &'static str,
        /// The value given, printed.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A top-k larger than the sequence it selects from.
    #[error("top_k = {top_k} is larger than seq_len = {seq_len} of request {request}")]
    TopKExceedsLength {
        /// Index of the request in the batch.
        request: usize,
        /// The k asked for.
        top_k: usize,
        /// The request's sequence length.
        seq_len: usize,
    },
    /// No CUDA driver or NVRTC library could be loaded on this machine.
    #[error("CUDA unavailable: {reason}")]
    CudaUnavailable {
        /// What was missing.
        reason: String,
    },
    /// The CUDA driver returned an error.
    #[error("CUDA driver error in {context}: {message}")]
    Cuda {
        /// What we were doing.
        context: String,
        /// The driver's message.
        message: String,
    },
    /// NVRTC failed to compile a kernel source.
    #[error("NVRTC could not compile kernel {kernel}:\n{log}")]
    Compile {
        /// The kernel source's name.
        kernel: String,
        /// The compiler's log.
        log: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

impl KernelError {
    /// Shorthand for [`KernelError::InvalidArgument`].
    pub fn invalid(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Self::InvalidArgument { field, value: value.to_string(), reason: reason.into() }
    }
}

/// Checks that a buffer has exactly `expected` elements, naming `field` otherwise.
pub(crate) fn check_len(field: &'static str, expected: usize, actual: usize) -> Result<()> {
    Ok(hisparse_memory::error::check_len(field, expected, actual)?)
}
