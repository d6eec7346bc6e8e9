//! # hisparse-engine
//!
//! Owns time: requests and their lifecycle, continuous batching, admission in the resident and
//! hisparse modes, the per-layer decode loop, background backup workers, the synthetic
//! workload ([`workload`]) and its calibration ([`calibrate`]), and metrics.

pub mod backup;
pub mod cache;
pub mod calibrate;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod model;
mod prefetch_queue;
pub mod request;
pub mod runtime;
pub mod workload;

pub use cache::{CacheConfig, DecodeStep, KvCache, LayerInputs, LayerView, Prompt, Rows};
pub use engine::{DEFAULT_MAX_QUEUED, DecodeEngine, Engine, EngineConfig, LayerDump, StepReport};
pub use error::{EngineError, Result};
pub use metrics::{RunSummary, StageTimes, StepMetrics};
pub use model::{ModelEmulation, ModelShape};
pub use request::{Outcome, RequestSpec};
pub use runtime::{RuntimeConfig, RuntimeHandle};
pub use workload::{LocalityParams, Workload};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
