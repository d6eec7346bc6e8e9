//! # hisparse-engine
//!
//! Owns time: the KV hierarchy as a per-layer API that another engine's model loop calls
//! ([`KvCache`], [`DecodeStep`]), and our own engine on top of it ([`Engine`]: requests and
//! their lifecycle, continuous batching, admission in the resident and hisparse modes, latency,
//! metrics). The crate's root is the embedding API; the engine's inputs live under modules: the
//! synthetic workload ([`workload`]) and its calibration ([`calibrate`]), the emulated model
//! ([`emulated`]), the ranks of a multi-GPU run ([`ranks`]). With the `candle` feature, a layer's inputs and outputs may be candle
//! tensors (`DecodeStep::layer_tensors`).

pub mod cache;
pub mod calibrate;
pub mod emulated;
pub mod engine;
pub mod error;
pub mod latency;
pub mod metrics;
pub mod ranks;
pub mod request;
pub mod runtime;
pub mod stop;
#[cfg(feature = "candle")]
pub mod tensors;
pub mod workload;

pub use cache::{CacheConfig, Captured, DecodeStep, DemotionOrder, KvCache, LayerInputs, LayerView, Prompt, Rows};
pub use engine::{DEFAULT_MAX_QUEUED, DecodeEngine, Engine, EngineConfig, LayerDump, StepReport};
pub use error::{EngineError, Result};
pub use latency::{LatencySummary, Percentiles, TokenLatency};
pub use metrics::{PlacementCounters, RunSummary, StageTimes, StepMetrics};
pub use request::{Outcome, RequestSpec};
pub use runtime::{RuntimeConfig, RuntimeHandle};
pub use stop::StopFlag;
#[cfg(feature = "candle")]
pub use tensors::{TensorInputs, TensorOutputs};

// What an embedder holds to run the hierarchy from its own model, from this crate alone.
pub use hisparse_kernels::{
    Backend, CpuBackend, HeadCombine, IndexScore, KernelStage, MissFill, MissFillMode, OracleScore, SwapCounts,
    dense_attention,
};
pub use hisparse_memory::{
    Admission, DeviceMemory, EmulatedDevice, IndexKeyFormat, IndexKeyLayout, KvGeometry, KvRowFormat, KvRowLayout,
    MemoryError, Mode, RequestId, StorageFormats, available_memory,
};
pub use hisparse_policy::{
    BuiltinPolicy, BuiltinPrefetcher, Eviction, EvictionPolicy, HiSparseConfig, OnlinePolicy, PolicyChoice,
    PolicyConfig, Prefetch, Prefetcher, PrefetcherChoice, PrefetcherConfig,
};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
