//! The CUDA swap-in (feature `cuda`): [`GpuSwapInState`] — slot tables, records and scalars on the
//! device, one decision and one copy launch per layer (or one fused launch for small batches)
//! (`state.rs`, `launch.rs`, `module.rs`: the kernel template with the policy's hooks spliced
//! in) — behind [`CudaSwapIn`], the backend's [`DeviceSwapIn`](crate::swap_in::DeviceSwapIn)
//! (`backend.rs`), which picks the miss-fill form per layer: the swap-in's copy, the
//! attention's fill (`crate::cuda::attention_launch`), the deferred swap-in (`deferred.rs`,
//! with staging rows in `staging.rs`), hits-first (`hits_first.rs`,
//! `hits_first_attention.rs`) or the copy engine (`copy_engine.rs`, `pinned_host.rs`); and
//! prefetch on the transfer stream (`prefetch.rs`). `policy.rs` holds the kernel-argument
//! forms of the policy crate's records.

pub(crate) mod args;
mod backend;
mod copy_engine;
mod deferred;
pub(crate) mod facts;
mod hits_first;
mod hits_first_attention;
mod io;
mod launch;
mod module;
mod pinned_host;
mod policy;
mod prefetch;
mod staging;
mod state;

pub use backend::CudaSwapIn;
pub use copy_engine::CopyEngineStaging;
pub use io::{LayerLaunch, LocateTargets, MissSource, Nominations, ProtectSpans, Selections, SwapTargets};
pub(crate) use module::sources;
pub use module::{FUSED_MAX_REQUESTS, policy_harness, prefetcher_harness, swap_in_source};
pub use policy::{
    GpuNomination, GpuPolicyEnv, GpuPolicyScalars, GpuPrefetchSource, GpuSlotRecord, GpuStepCtx, GpuVictimKey,
};
pub use state::{GpuSwapInState, GpuSwapInStateShape, SwapBatch, SwapOutputs, SwapParams, SwapReq};
