//! `ModelError`: everything loading, tokenizing and running a model can fail with.

use std::path::PathBuf;

/// What loading or running a model failed with.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The GGUF file (or a tensor in it) is not what a llama model needs.
    #[error("{field} = {value}: {reason}")]
    Invalid {
        /// The metadata key, tensor or argument at fault.
        field: String,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// candle failed reading or computing a tensor.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The tokenizer could not be built or failed on the text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The KV cache refused a call.
    #[error(transparent)]
    Engine(#[from] hisparse_engine::EngineError),
    /// The model file could not be fetched or failed its checksum.
    #[error("model file: {0}")]
    Fetch(String),
    /// A stop was asked for (the caller's [`StopFlag`](hisparse_engine::StopFlag)) while the
    /// named work was under way; nothing half-done was left behind.
    #[error("stopped while {0}")]
    Stopped(String),
}

impl ModelError {
    /// An [`ModelError::Invalid`] naming `field`.
    pub fn invalid(field: impl Into<String>, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), value: value.to_string(), reason: reason.into() }
    }
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, ModelError>;
