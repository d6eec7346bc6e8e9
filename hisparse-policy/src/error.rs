//! The one error type of `hisparse-policy`.

use hisparse_memory::MemoryError;

/// What went wrong in a policy, the swap-in step, a trace or the simulator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A memory-level error (geometry, slot tables, tiers).
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// An argument or config field has a value that cannot be used.
    #[error("invalid {field} = {value}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value, printed.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A policy name no built-in policy has.
    #[error("invalid eviction_policy = {name}: known policies: {known}")]
    UnknownPolicy {
        /// The name asked for.
        name: String,
        /// The known names, comma separated.
        known: String,
    },
    /// A trace file that cannot be read: truncated, corrupt, or of another version.
    #[error("trace {what} at byte {offset}: {message}")]
    Trace {
        /// What was wrong (`truncated`, `corrupt`, `unsupported version`, ...).
        what: &'static str,
        /// Byte offset (from the start of the file) where the problem was found.
        offset: u64,
        /// Details.
        message: String,
    },
    /// An input larger than the memory the caller allows for it.
    #[error("{} of input, more than the {limit} bytes this machine's available memory allows", bytes.map_or_else(|| "more".to_string(), |b| format!("{b} bytes")))]
    TooLarge {
        /// Its size, where known.
        bytes: Option<u64>,
        /// The most it may hold.
        limit: u64,
    },
    /// The caller asked the simulator to stop; nothing was reported.
    #[error("cancelled")]
    Cancelled,
    /// Reading or writing a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The system's message.
        message: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = PolicyError> = std::result::Result<T, E>;
