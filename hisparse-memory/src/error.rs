//! The one error type of `hisparse-memory`: every failure names the field and the value at fault.

/// What went wrong in `hisparse-memory`.
///
/// Every variant names the field (or buffer) at fault and the offending value, so that a
/// user-facing program can print it as one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A configuration or geometry field has a value that cannot be used.
    #[error("invalid {field} = {value}: {reason}")]
    InvalidField {
        /// The field, as the user spells it (e.g. `q_heads`, `device_buffer_size`).
        field: &'static str,
        /// The value given, printed.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A named preset does not exist.
    #[error("unknown preset {name:?} (known presets: {known})")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The known names, comma separated.
        known: String,
    },
    /// A buffer has the wrong length.
    #[error("{field}: length {actual} does not match the expected {expected}")]
    LengthMismatch {
        /// The buffer.
        field: &'static str,
        /// The length the geometry asks for.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A value that must be finite is not (NaN or infinite).
    #[error("{field}[{index}] = {value} is not finite")]
    NonFinite {
        /// The buffer or field.
        field: &'static str,
        /// Index of the value in that buffer.
        index: usize,
        /// The value (NaN or ±inf).
        value: f32,
    },
    /// A scale stored in a row is not a finite positive number.
    #[error("{field}: scale {index} = {value} is not finite and positive")]
    BadScale {
        /// The row kind (`kv_row`, `index_key`).
        field: &'static str,
        /// Which scale of the row.
        index: usize,
        /// The value read.
        value: f32,
    },
    /// An access reaches outside a buffer.
    #[error("{field}: range {start}..{end} is outside the buffer of length {len}")]
    OutOfBounds {
        /// The buffer.
        field: &'static str,
        /// First element of the access.
        start: usize,
        /// One past the last element of the access.
        end: usize,
        /// Length of the buffer.
        len: usize,
    },
    /// A pool has too few free units for an allocation; nothing was allocated.
    #[error("{pool}: {needed} more {unit} needed, {free} free")]
    CapacityExhausted {
        /// The pool (`host tier`, `device index pages`, ...).
        pool: &'static str,
        /// Units asked for.
        needed: usize,
        /// Units free.
        free: usize,
        /// What a unit is (`pages`, `seats`).
        unit: &'static str,
    },
    /// A request id the pool does not know.
    #[error("{pool}: unknown request {request}")]
    UnknownRequest {
        /// The pool.
        pool: &'static str,
        /// The request id.
        request: u64,
    },
    /// A request id that is already registered.
    #[error("{pool}: request {request} is already registered")]
    DuplicateRequest {
        /// The pool.
        pool: &'static str,
        /// The request id.
        request: u64,
    },
    /// A position a request has no room for (beyond what was grown).
    #[error("{pool}: position {position} of request {request} is beyond its {capacity} allocated positions")]
    PositionOutOfRange {
        /// The pool.
        pool: &'static str,
        /// The request id.
        request: u64,
        /// The position asked for.
        position: usize,
        /// Positions allocated.
        capacity: usize,
    },
    /// The operating system refused a mapping or a file operation.
    #[error("{what}: {message}")]
    Io {
        /// What we were doing (with the path, if any).
        what: String,
        /// The system's message.
        message: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = MemoryError> = std::result::Result<T, E>;

impl MemoryError {
    /// Shorthand for [`MemoryError::InvalidField`].
    pub fn invalid(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Self::InvalidField { field, value: value.to_string(), reason: reason.into() }
    }
}

/// Checks that `actual == expected`, naming `field` otherwise.
pub fn check_len(field: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual { Ok(()) } else { Err(MemoryError::LengthMismatch { field, expected, actual }) }
}
