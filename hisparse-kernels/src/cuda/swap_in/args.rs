//! The argument structs of the swap-in's three large kernels (`swap_in`, `swap_in_fused`,
//! `prefetch_in`): one struct per kernel, passed by value, its C declaration generated into
//! the module's prelude (`crate::cuda::facts`) with typed pointers, so a buffer given in the
//! wrong place of another element type fails the compile, and its layout is checked there.
//! Buffers become pointers through [`dev`] and [`cdev`] (typed handles of a live buffer); only
//! an `unsafe` launch gives them to a kernel.

use cudarc::driver::{CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use hisparse_memory::c_layout::{ConstPtr, DevPtr};

use super::policy::{GpuPolicyScalars, GpuSlotRecord};
use crate::cuda::printed_launch::addr;
use crate::swap_in::DeviceSwapReq;

/// `buf` as a pointer a kernel writes through.
pub(crate) fn dev<T>(buf: &impl DevicePtr<T>, stream: &CudaStream) -> DevPtr<T> {
    // SAFETY: the device address of a live buffer of `T`s; a kernel receives it only through an
    // `unsafe` launch whose caller checked that the buffer holds what the kernel indexes and
    // lives while it runs.
    unsafe { DevPtr::from_raw(addr(buf, stream)) }
}

/// `buf` as a pointer a kernel only reads.
pub(crate) fn cdev<T>(buf: &impl DevicePtr<T>, stream: &CudaStream) -> ConstPtr<T> {
    // SAFETY: as in `dev`.
    unsafe { ConstPtr::from_raw(addr(buf, stream)) }
}

hisparse_memory::c_struct! {
    /// The arguments of `swap_in` (the decisions of a layer for a batch; kernels/swap_in/swap_in.cu),
    /// which its `swap_decide` takes whole (the one-launch form's too).
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct SwapArgs {
        /// The batch's requests.
        pub(crate) reqs: ConstPtr<DeviceSwapReq>,
        /// Selected positions, per request from its `sel_offset`.
        pub(crate) selections: ConstPtr<u32>,
        /// Every (seat, layer)'s slot table.
        pub(crate) slot_tokens: DevPtr<i32>,
        /// Every slot's policy record.
        pub(crate) records: DevPtr<GpuSlotRecord>,
        /// Every (seat, layer)'s policy scalars.
        pub(crate) scalars: DevPtr<GpuPolicyScalars>,
        /// Every (seat, layer)'s records-ready flag.
        pub(crate) ready: DevPtr<u32>,
        /// Every slot's prefetched flag.
        pub(crate) prefetched: DevPtr<u8>,
        /// Every (seat, layer)'s token words (null: the policy keeps none).
        pub(crate) words: DevPtr<u32>,
        /// Scores by position, per request from its `score_offset` (null: none read).
        pub(crate) scores: ConstPtr<f32>,
        /// Out: each selected token's hot-buffer row.
        pub(crate) locations: DevPtr<i32>,
        /// Out: per request, the swap-in's counts.
        pub(crate) counts: DevPtr<u32>,
        /// Out: the missed tokens, per request from its `sel_offset`.
        pub(crate) miss_tokens: DevPtr<u32>,
        /// Out: the slots they take.
        pub(crate) miss_slots: DevPtr<u32>,
        /// Out: the tokens evicted.
        pub(crate) evicted: DevPtr<i32>,
        /// Host page ids, per request from its `page_offset`.
        pub(crate) host_pages: ConstPtr<u32>,
        /// Out: each selection's fill word (null: the misses are copied, not left to the attention).
        pub(crate) fills: DevPtr<u64>,
        /// Raised on a position or page id out of range.
        pub(crate) fault: DevPtr<u32>,
        /// The launch's parameters.
        pub(crate) p: SwapParams,
    }
}

hisparse_memory::c_struct! {
    /// The arguments of `swap_in_fused` (decisions and copies in one launch;
    /// kernels/swap_in/swap_fused.cu).
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct FusedSwapArgs {
        /// The decisions' arguments, `swap_decide`'s as in `swap_in` (`fills` null: the misses
        /// are copied by this launch).
        pub(crate) decide: SwapArgs,
        /// The layer's hot-buffer pool, where the missed rows go.
        pub(crate) hot_rows: DevPtr<u8>,
        /// Three words per request: the blocks' arrival ticket and hand-over.
        pub(crate) sync: DevPtr<u32>,
    }
}

hisparse_memory::c_struct! {
    /// The arguments of `prefetch_in` (nominated tokens brought in before their selection;
    /// kernels/swap_in/prefetch.cu).
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct PrefetchArgs {
        /// The batch's requests (`sel_offset`/`sel_len`: their candidates; `prefetch_budget`).
        pub(crate) reqs: ConstPtr<DeviceSwapReq>,
        /// Candidates in order of preference, per request from its `sel_offset`.
        pub(crate) candidates: ConstPtr<u32>,
        /// Protected positions (never evicted), ascending per request.
        pub(crate) protect: ConstPtr<u32>,
        /// Per request, the `(offset, len)` of its protected positions in `protect`.
        pub(crate) prot: ConstPtr<u32>,
        /// Every (seat, layer)'s slot table.
        pub(crate) slot_tokens: DevPtr<i32>,
        /// Every slot's policy record.
        pub(crate) records: DevPtr<GpuSlotRecord>,
        /// Every (seat, layer)'s policy scalars.
        pub(crate) scalars: DevPtr<GpuPolicyScalars>,
        /// Every (seat, layer)'s records-ready flag.
        pub(crate) ready: DevPtr<u32>,
        /// Every slot's prefetched flag.
        pub(crate) prefetched: DevPtr<u8>,
        /// Every (seat, layer)'s token words (null: the policy keeps none).
        pub(crate) words: DevPtr<u32>,
        /// Scores by position (null: none read).
        pub(crate) scores: ConstPtr<f32>,
        /// Out: per request, the counts.
        pub(crate) counts: DevPtr<u32>,
        /// Out: the tokens brought in.
        pub(crate) miss_tokens: DevPtr<u32>,
        /// Out: the slots they take.
        pub(crate) miss_slots: DevPtr<u32>,
        /// Out: the tokens evicted.
        pub(crate) evicted: DevPtr<i32>,
        /// Raised on a position or page id out of range.
        pub(crate) fault: DevPtr<u32>,
        /// The launch's parameters.
        pub(crate) p: SwapParams,
    }
}

// SAFETY: #[repr(C)] structs of device addresses and plain numbers whose C declarations are
// generated from them (the compile checks the layout); passed by value.
unsafe impl DeviceRepr for SwapArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for FusedSwapArgs {}
// SAFETY: as above.
unsafe impl DeviceRepr for PrefetchArgs {}

hisparse_memory::c_struct! {
    /// Where the host tier is, for the miss copies.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
    pub struct SwapParams {
        /// The layer of this launch.
        pub layer: u32,
        /// Layers of the state arrays.
        pub layers: u32,
        /// Regular slots per buffer.
        pub device_buffer_size: u32,
        /// Bytes of a KV row (a multiple of 16).
        pub row_bytes: u32,
        /// Positions per host page.
        pub page_tokens: u32,
        /// Pages per layer region of the host tier.
        pub host_pages_per_layer: u32,
        /// Entries of the host-page list (`host_pages`) the kernels may read.
        pub host_pages_len: u32,
        /// Positions of each state's token words (0: the policy keeps none).
        pub word_tokens: u32,
        /// The host tier's mapped device address.
        pub host_base: u64,
        /// The policy's seed.
        pub seed: u64,
    }
}

// SAFETY: #[repr(C)] structs of plain integers, whose C declarations are generated from them (`SwapReq`, `SwapParams`).
unsafe impl DeviceRepr for DeviceSwapReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for DeviceSwapReq {}
// SAFETY: as above.
unsafe impl DeviceRepr for SwapParams {}
