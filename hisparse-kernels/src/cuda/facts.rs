//! What the CUDA kernels and their Rust launches share, written once, here: the constants (tile
//! and block sizes, shared-memory sizes, the swap-in's counters) emitted as `#define`s, the
//! argument structs (each a `hisparse_memory::c_struct!` beside the launch that fills it), the
//! hot-buffer address (`hisparse_memory::device_tier::hot_seat_base`), and the generated
//! prelude each kernel module's source starts with ([`prelude`]). The `.cu` files declare none
//! of these; the prelude's `static_assert`s fail the NVRTC compile, naming the struct and field,
//! if C ever lays an argument struct out otherwise than Rust.
//!
//! Invariant: every struct passed to a kernel by value or in a device buffer is a `c_struct!`
//! listed in its module's prelude below; every constant both sides use is a `const` here.

use hisparse_memory::c_layout::{ALIGN16_C, define, part};
use hisparse_memory::device_tier::HOT_SEAT_BASE_C;

use super::attention_launch::AttnParams;
use super::decode_launch::{GpuIndexerReq, GpuSpan};
use super::step_launch::{LocateReq, NewRowsArgs};
use super::topk_launch::SplitArgs;
use crate::swap_in::cuda::{FusedSwapArgs, GpuNomination, GpuPrefetchSource, PrefetchArgs, SwapArgs, SwapParams};
use crate::swap_in::{DeviceSwapReq, SWAP_COUNTS};

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

/// Swap-in: selected positions per block of `locate_in_hot` and `gather_misses`.
pub(crate) const LOCATE_CHUNK: usize = 256;
/// Swap-in: threads per block of `gather_misses`.
pub(crate) const GATHER_THREADS: u32 = 128;

hisparse_memory::c_fn! {
    /// Swap-in: where the decision kernel's shared arrays after the selection start, for `k`
    /// selected positions (the selection's u32s, rounded up to 16 bytes).
    pub(crate) SWAP_SMEM_AFTER_SEL_C: fn swap_smem_after_sel(k) = align16(4 * k);
}

hisparse_memory::c_fn! {
    /// Swap-in: dynamic shared memory of the decision kernel for `b` slots and `k` selected
    /// positions: the selection, then priorities (u64) and staged records (two u32) per slot,
    /// victim slots per position, the slot table per slot, flags per slot and per position, and
    /// prefetched flags per slot.
    pub(crate) SWAP_SMEM_BYTES_C: fn swap_smem_bytes(b, k) = align16(4 * k) + 8 * b + 8 * b + 4 * k + 4 * b + b + k + b;
}

hisparse_memory::c_fn! {
    /// Prefetch: where the prefetch kernel's arrays after its sort keys start, for `kp` (the
    /// candidates rounded up to a power of two) and `k` candidates.
    pub(crate) PREFETCH_SMEM_AFTER_KEYS_C: fn prefetch_smem_after_keys(kp, k) = align16(4 * (2 * kp + 2 * k));
}

hisparse_memory::c_fn! {
    /// Prefetch: dynamic shared memory of the prefetch kernel for `b` slots and `k` candidates
    /// (`kp`: `k` rounded up to a power of two): the sort keys, priorities per slot, flags per
    /// slot and per candidate.
    pub(crate) PREFETCH_SMEM_BYTES_C: fn prefetch_smem_bytes(b, kp, k) = align16(4 * (2 * kp + 2 * k)) + 8 * b + b + k;
}

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
    /// `swap_in/*.cu` (after the policy's program: its argument structs point to the policy's
    /// records).
    SwapIn,
    /// `swap_in/prefetch_harness.cu` (before the prefetcher's program).
    PrefetchHarness,
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
        Module::SwapIn => {
            let formulas = [
                ALIGN16_C.to_owned(),
                HOT_SEAT_BASE_C.to_owned(),
                SWAP_SMEM_AFTER_SEL_C.to_owned(),
                SWAP_SMEM_BYTES_C.to_owned(),
                PREFETCH_SMEM_AFTER_KEYS_C.to_owned(),
                PREFETCH_SMEM_BYTES_C.to_owned(),
            ];
            let mut defines = vec![
                define("COUNTS", SWAP_COUNTS),
                define("LOCATE_CHUNK", LOCATE_CHUNK),
                define("GATHER_THREADS", GATHER_THREADS),
            ];
            defines.extend(formulas);
            make(
                &defines,
                &[
                    part::<DeviceSwapReq>(),
                    part::<SwapParams>(),
                    part::<GpuSpan>(),
                    part::<SwapArgs>(),
                    part::<FusedSwapArgs>(),
                    part::<PrefetchArgs>(),
                ],
            )
        }
        Module::PrefetchHarness => make(&[], &[part::<GpuPrefetchSource>(), part::<GpuNomination>()]),
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
        for (b, k) in [(512usize, 256usize), (4096, 2048), (8192, 2049), (1, 1)] {
            let (b64, k64) = (b as u64, k as u64);
            assert_eq!(
                swap_smem_bytes(b64, k64) as usize,
                ((4 * k + 15) & !15) + 8 * b + 8 * b + 4 * k + 4 * b + b + k + b
            );
            let kp = k.next_power_of_two();
            assert_eq!(
                prefetch_smem_bytes(b64, kp as u64, k64) as usize,
                ((4 * (2 * kp + 2 * k) + 15) & !15) + 8 * b + b + k
            );
        }
        assert!(prelude(Module::SwapIn).contains("unsigned long long hot_seat_base(unsigned long long seat"));
        assert!(prelude(Module::Attention).contains("static_assert(sizeof(AttnParams)"));
    }
}
