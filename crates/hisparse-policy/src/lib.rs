//! # hisparse-policy
//!
//! Owns the decisions of the hierarchy: which resident token gives its slot to a missing one
//! (eviction policies, each with a Rust and a CUDA C form), what to fetch ahead (prefetchers),
//! the CPU swap-in step that the GPU kernel must match exactly, the trace format, and the
//! trace-driven simulator.

pub mod error;

pub use error::{PolicyError, Result};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
