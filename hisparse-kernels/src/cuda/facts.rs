//! What the decode kernels (attention, indexer, top-k, rows) and their Rust launches share,
//! written once, here: the constants (tile and block sizes, shared-memory sizes) emitted as
//! `#define`s, the argument structs (`hisparse_memory::c_struct!`s), and the generated prelude
//! each of those kernel modules' source starts with ([`prelude`]). The swap-in's are in
//! `crate::cuda::swap_in::facts`. The `.cu` files declare none
//! of these; the prelude's `static_assert`s fail the NVRTC compile, naming the struct and field,
//! if C ever lays an argument struct out otherwise than Rust.
//!
//! Invariant: every struct passed to a decode kernel by value or in a device buffer is a
//! `c_struct!` here, listed in its module's prelude; every constant both sides use is a `const`
//! here.

use hisparse_memory::c_layout::{define, part};

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct GpuIndexerReq as IndexerReq {
        pub(crate) first_page: u32,
        pub(crate) seq_len: u32,
        pub(crate) score_offset: u32,
        pub(crate) pad: u32,
    }
}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct GpuSpan as Span {
        pub(crate) offset: u64,
        pub(crate) len: u64,
    }
}

// SAFETY: #[repr(C)] structs of plain numbers, whose C declarations are generated from them (the compile checks the layouts).
unsafe impl DeviceRepr for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl DeviceRepr for GpuSpan {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuSpan {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct LocateReq {
        pub(crate) sel_offset: u64,
        pub(crate) sel_len: u64,
        pub(crate) first_page: u64,
        pub(crate) pages: u64,
    }
}

hisparse_memory::c_struct! {
    /// The arguments of `fill_new_rows` (the kernel's `NewRowsArgs`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct NewRowsArgs {
        pub(crate) n: u32,
        pub(crate) fp8: u32,
        pub(crate) d_latent: u32,
        pub(crate) d_rope: u32,
        pub(crate) row_bytes: u32,
        pub(crate) key_dim: u32,
        pub(crate) key_c: f32,
        pub(crate) key_b: f32,
        pub(crate) step: f32,
        pub(crate) half_width: f32,
    }
}

// SAFETY: a #[repr(C)] struct of plain numbers, whose C declaration is generated from it (`NewRowsArgs`).
unsafe impl DeviceRepr for NewRowsArgs {}

// SAFETY: a #[repr(C)] struct of plain numbers, whose C declaration is generated from it (`LocateReq`).
unsafe impl DeviceRepr for LocateReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for LocateReq {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct SplitArgs {
        pub(crate) k: u32,
        pub(crate) chunk: u32,
        pub(crate) blocks: u32,
        pub(crate) pad: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for SplitArgs {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct AttnParams {
        /// Query heads of a request.
        pub(crate) heads: u32,
        /// 1152 (bf16) or 656 (fp8).
        pub(crate) row_bytes: u32,
        /// 1: FlashMLA fp8 rows.
        pub(crate) fp8: u32,
        /// Blocks per (request, head group).
        pub(crate) splits: u32,
        /// Rows of the pool.
        pub(crate) pool_rows: u64,
        /// softmax_scale * log2(e).
        pub(crate) scale_log2: f32,
        /// Fills only: 1 writes each filled row to its location.
        pub(crate) write_back: u32,
        /// The mapped host tier (fills only).
        pub(crate) host_base: u64,
        /// Rows of the host tier (fills only).
        pub(crate) host_rows: u64,
        /// Warpgroup-MMA kernels: leave out (mask) rows whose fill word is set (`hits-first`).
        pub(crate) skip_filled: u32,
        /// With `part_stride`: the first partial of this launch per (request, head).
        pub(crate) part_base: u32,
        /// 0: partials as `splits` says; else always partials, this many per (request, head).
        pub(crate) part_stride: u32,
        /// Zero (keeps the size a multiple of 8).
        pub(crate) pad: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for AttnParams {}

/// Attention: query heads of one block (C `HB`).
pub(crate) const HEAD_BLOCK: usize = 64;
/// Attention (mma.sync): rows per tile.
pub(crate) const TILE: usize = 32;
/// Attention: threads per block.
pub(crate) const ATTN_THREADS: usize = 256;
/// Attention: padded bf16 stride of the Q and K rows in shared memory (1168 B).
const LDS: usize = 584;
/// Attention: padded bf16 stride of the P rows.
const LDP: usize = 40;
/// Attention: padded f32 stride of the partial-S rows.
const LDX: usize = 40;
/// Attention: bytes of a tile's raw rows (bf16 rows of 1152 B).
const RAW_BYTES: usize = TILE * 1152;
/// Shared memory of the mma.sync attention: Q and K tiles, P, two partial-S buffers, two tiles
/// of locations and of fill words, the raw rows.
pub(crate) const ATTN_SMEM: usize = HEAD_BLOCK * LDS * 2
    + TILE * LDS * 2
    + HEAD_BLOCK * LDP * 2
    + 2 * HEAD_BLOCK * LDX * 4
    + 2 * TILE * 4
    + 2 * TILE * 8
    + RAW_BYTES;
/// Attention (warpgroup MMA): rows per tile.
pub(crate) const WG_TILE: usize = 64;
/// Attention (warpgroup MMA): one 64-dim atom of a 64-row bf16 operand.
const WG_ATOM: usize = 8192;
/// Attention (warpgroup MMA): the fp8 form's raw staging tile (64 rows of 656 B).
const WG_RAW_FP8: usize = WG_TILE * 656;
/// Shared memory of the warpgroup-MMA attention over bf16 rows: Q and two K operands of nine
/// atoms, P, alpha, l and m, the skip flags.
pub(crate) const WG_SMEM: usize = 3 * 9 * WG_ATOM + WG_ATOM + 3 * WG_TILE * 4 + 128;
/// The fp8 form's: Q and one K operand, the raw fp8 tile, P, the statistics, the flags.
pub(crate) const WG_SMEM_FP8: usize = 2 * 9 * WG_ATOM + WG_RAW_FP8 + WG_ATOM + 3 * WG_TILE * 4 + 128;

/// Top-k: threads of the one-block kernel.
pub(crate) const TOPK_THREADS: usize = 1024;
/// Top-k: radix bins of a pass.
pub(crate) const TOPK_BINS: usize = 2048;
/// Top-k: copies of the histogram in shared memory.
const TOPK_COPIES: usize = 8;
/// Top-k: candidates kept in shared memory once a pass's threshold bin is this small.
const TOPK_CAP: usize = 8192;
/// Top-k: positions the candidates' bitmaps cover.
const TOPK_FAST_N: usize = 262_144;
/// Dynamic shared memory of the one-block top-k: the histograms, the candidates' keys and
/// positions, the bitmap.
pub(crate) const TOPK_SMEM: usize = (TOPK_COPIES * TOPK_BINS + 2 * TOPK_CAP + TOPK_FAST_N / 32) * 4;
/// Top-k (several blocks per request): threads per block.
pub(crate) const SPLIT_THREADS: usize = 512;

/// The kernel modules whose sources start with a generated prelude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// `attention.cu`, `attention_wgmma.cu`.
    Attention,
    /// `indexer.cu`, `indexer_wgmma.cu`.
    Indexer,
    /// `topk.cu`, `topk_split.cu`.
    TopK,
    /// `rows.cu`.
    Rows,
}

/// The generated head of `module`'s source: its constants, structs and formulas.
pub fn prelude(module: Module) -> String {
    use hisparse_memory::c_layout::prelude as make;
    match module {
        Module::Attention => make(
            &[
                define("HB", HEAD_BLOCK),
                define("TILE", TILE),
                define("THREADS", ATTN_THREADS),
                define("LDS", LDS),
                define("LDP", LDP),
                define("LDX", LDX),
                define("RAW_BYTES", RAW_BYTES),
                define("WG_TILE", WG_TILE),
                define("WG_ATOM", WG_ATOM),
                define("WG_RAW_FP8", WG_RAW_FP8),
                define("WG_SMEM", WG_SMEM),
                define("WG_SMEM_FP8", WG_SMEM_FP8),
            ],
            &[part::<GpuSpan>(), part::<AttnParams>()],
        ),
        Module::Indexer => make(&[], &[part::<GpuIndexerReq>()]),
        Module::TopK => make(
            &[
                define("THREADS", TOPK_THREADS),
                define("BINS", TOPK_BINS),
                define("COPIES", TOPK_COPIES),
                define("CAP", TOPK_CAP),
                define("FAST_N", TOPK_FAST_N),
                define("SPLIT_THREADS", SPLIT_THREADS),
            ],
            &[part::<GpuSpan>(), part::<SplitArgs>()],
        ),
        Module::Rows => make(&[], &[part::<LocateReq>(), part::<NewRowsArgs>()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_sizes_are_the_kernels_formulas() {
        // The values the kernels were written for.
        assert_eq!(
            ATTN_SMEM,
            64 * 584 * 2 + 32 * 584 * 2 + 64 * 40 * 2 + 2 * 64 * 40 * 4 + 2 * 32 * 4 + 2 * 32 * 8 + 32 * 1152
        );
        assert_eq!(WG_SMEM, 3 * 9 * 8192 + 8192 + 3 * 64 * 4 + 128);
        assert_eq!(WG_SMEM_FP8, 2 * 9 * 8192 + 64 * 656 + 8192 + 3 * 64 * 4 + 128);
        assert_eq!(TOPK_SMEM, (8 * 2048 + 2 * 8192 + 8192) * 4);
        assert!(prelude(Module::Attention).contains("static_assert(sizeof(AttnParams)"));
    }
}
