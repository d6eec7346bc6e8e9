//! The swap-in: HiSparse's heart, in one place. Each decode step, per request and layer, the
//! selected tokens already in the request's hot buffer are hits; the others are misses that
//! take the slots the eviction policy gives up (never a slot of a selected token), and their
//! rows come from the host tier; prefetchers bring rows in ahead of the layer that will ask.
//!
//! * `interface.rs` — [`DeviceSwapIn`], what every backend's swap-in offers the cache (begin a
//!   step, one call per layer, end the step with the counts), its config and requests;
//! * `hot_locate.rs` — [`locate_in_hot`]: where each selected token is before the swap-in
//!   decides (the twin of the CUDA `locate_in_hot` kernel).
//!
//! Each backend's half lives beside its backend: [`crate::cpu::CpuSwapIn`] (`cpu/swap_in.rs`)
//! and, with the feature `cuda`, the CUDA swap-in (`cuda/swap_in/`: its device state, its
//! kernels' sources (`kernels/swap_in/*.cu`) and launches, the miss-fill forms and prefetch on
//! the transfer stream). This module knows neither backend.
//!
//! Invariant: this module and the two backend halves are the only parts of `hisparse-kernels`
//! that know eviction policies and prefetchers (`hisparse_policy`): the CPU swap-in runs the
//! policy crate's own reference step, and the CUDA swap-in splices a policy's hook source
//! (`hisparse_policy::policy::cuda::program`) and a prefetcher's into its kernel templates and
//! passes their per-slot records and scalars.

mod hot_locate;
mod interface;
mod miss_fill;

pub use hisparse_policy::SwapCounts;
pub use hot_locate::{HotLocation, locate_in_hot};
pub use interface::{AttentionQuery, DeviceSwapIn, DeviceSwapInConfig, DeviceSwapReq, SWAP_COUNTS};
pub use miss_fill::{MissFill, MissFillMode};
