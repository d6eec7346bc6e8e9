//! What the swap-in's kernels (`kernels/swap_in/*.cu`) and their Rust launches share, written
//! once, here: the counters per request, block sizes, the hot-buffer address
//! (`hisparse_memory::device_tier::hot_seat_base`), the shared-memory formulas, and the
//! argument structs (`args.rs`, the policy's records), all generated into the prelude the
//! module's source holds after the policy's program ([`prelude`]); and the prefetch harness's.
//!
//! Invariant: every struct passed to a swap-in kernel is a `c_struct!` in `args.rs` (or the
//! policy crate's records), listed in [`prelude`]; every constant both sides use is here.

use hisparse_memory::c_layout::{ALIGN16_C, define, part, prelude as make};
use hisparse_memory::device_tier::{HOT_BUFFER_ROWS_C, HOT_SEAT_BASE_C};

use super::args::{FusedSwapArgs, PrefetchArgs, SwapArgs, SwapParams};
use super::policy::{GpuNomination, GpuPrefetchSource};
use crate::cuda::facts::GpuSpan;
use crate::swap_in::{DeviceSwapReq, SWAP_COUNTS};

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

/// The generated head of the swap-in module's source, after the policy's program: its
/// constants, formulas and argument structs.
pub fn prelude() -> String {
    let formulas = [
        ALIGN16_C,
        HOT_BUFFER_ROWS_C,
        HOT_SEAT_BASE_C,
        SWAP_SMEM_AFTER_SEL_C,
        SWAP_SMEM_BYTES_C,
        PREFETCH_SMEM_AFTER_KEYS_C,
        PREFETCH_SMEM_BYTES_C,
    ];
    let mut defines = vec![
        define("COUNTS", SWAP_COUNTS),
        define("LOCATE_CHUNK", LOCATE_CHUNK),
        define("GATHER_THREADS", GATHER_THREADS),
    ];
    defines.extend(formulas.iter().map(|f| (*f).to_owned()));
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

/// The generated head of the prefetch harness's source: the types a prefetcher's CUDA form
/// reads and writes.
pub fn harness_prelude() -> String {
    make(&[], &[part::<GpuPrefetchSource>(), part::<GpuNomination>()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_memory_formulas_are_the_kernels() {
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
        assert!(prelude().contains("unsigned long long hot_seat_base(unsigned long long seat"));
        assert!(prelude().contains("static_assert(sizeof(SwapArgs)"));
    }
}
