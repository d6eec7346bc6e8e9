//! # hisparse-policy
//!
//! Owns the decisions of the hierarchy: which resident token gives its slot to a missing one
//! (eviction policies, each with a Rust and a CUDA C form: [`policy`]), the CPU swap-in step
//! that the GPU kernel must match exactly ([`swap_in`]), the configuration with SGLang's keys
//! ([`HiSparseConfig`]; the policy, prefetcher and miss-fill form chosen once as typed values:
//! [`choice`]), the trace format ([`trace`]), synthetic traces ([`synth`]) and the
//! trace-driven simulator ([`mod@simulate`]).
//!
//! Invariant: after every swap-in step the slot table is a bijection, every selected token is
//! resident, no selected token was evicted, and the newest token sits in the reserved slot
//! (property-tested for every policy in `tests/`).

pub mod choice;
pub mod config;
pub mod counts;
pub mod error;
pub mod eviction;
pub mod policy;
pub mod prefetch;
pub mod prefetching;
pub mod simulate;
pub mod swap_in;
pub mod synth;
pub mod trace;

pub use choice::{PolicyChoice, PrefetcherChoice};
pub use config::{HiSparseConfig, compared_device_buffer_sizes, default_device_buffer_size};
pub use counts::SwapCounts;
pub use error::{PolicyError, Result};
pub use eviction::{Eviction, OnlinePolicy};
pub use policy::BuiltinPolicy;
pub use policy::{EvictionPolicy, PolicyConfig, PolicyEnv, PolicyScalars, SlotRecord, StampRule, StepCtx, VictimKey};
pub use prefetch::BuiltinPrefetcher;
pub use prefetch::{Prefetcher, PrefetcherConfig};
pub use prefetching::Prefetch;
pub use simulate::{
    SimConfig, SimReport, SimResult, memory_estimate, memory_estimate_encoded, replays, replays_in_one_pass, simulate,
    simulate_encoded, simulate_encoded_policies, simulate_policies, simulate_with,
};
pub use swap_in::{Nominated, PrefetchPlan, SwapInPlan, SwapInState, SwapInputs, copy_missing_rows, copy_rows};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
