//! # hisparse-engine
//!
//! Owns time: requests and their lifecycle, continuous batching, admission in the resident and
//! hisparse modes, the per-layer decode loop, background backup and prefetch workers, the
//! synthetic workload, and metrics.

pub mod error;

pub use error::{EngineError, Result};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
