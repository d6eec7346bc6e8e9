//! Kernel-argument forms of the policy types: `#[repr(transparent)]` wrappers of the
//! `#[repr(C)]` structs of `hisparse_policy`, so they can be passed to kernels by value or in
//! device buffers with the same layout as the CUDA prelude's structs; and the prefetch prelude's
//! `PrefetchSource` and `Nomination`.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use hisparse_policy::{PolicyEnv, PolicyScalars, SlotRecord, StepCtx, VictimKey};

macro_rules! device_repr {
    ($($(#[$doc:meta])* $name:ident($inner:ty);)*) => {$(
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name(pub $inner);
        // SAFETY: a transparent wrapper of a #[repr(C)] struct of plain integers (and bools),
        // laid out as the CUDA prelude's struct of the same name.
        unsafe impl DeviceRepr for $name {}
        // SAFETY: all-zero bytes are a valid value of every field.
        unsafe impl ValidAsZeroBits for $name {}
    )*};
}

device_repr! {
    /// `SlotRecord` as a kernel sees it.
    GpuSlotRecord(SlotRecord);
    /// `PolicyScalars` as a kernel sees it.
    GpuPolicyScalars(PolicyScalars);
    /// `StepCtx` as a kernel sees it.
    GpuStepCtx(StepCtx);
    /// `VictimKey` as a kernel sees it.
    GpuVictimKey(VictimKey);
}

/// `PolicyEnv` as a kernel sees it (f32 `score`: not `Eq`, hence outside the macro).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuPolicyEnv(pub PolicyEnv);
// SAFETY: a transparent wrapper of a #[repr(C)] struct of plain numbers (and bools), laid out as
// the CUDA prelude's `PolicyEnv`.
unsafe impl DeviceRepr for GpuPolicyEnv {}
// SAFETY: all-zero bytes are a valid value of every field.
unsafe impl ValidAsZeroBits for GpuPolicyEnv {}

/// The prefetch prelude's `PrefetchSource`: a [`LayerSelection`] without its arrays.
///
/// [`LayerSelection`]: hisparse_policy::prefetch::LayerSelection
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuPrefetchSource {
    /// The layer whose selection is known.
    pub layer: u32,
    /// Layers of the model.
    pub layers: u32,
    /// The request's step.
    pub step: u32,
    /// Tokens in the sequence.
    pub seq_len: u32,
    /// Positions a full selection holds.
    pub top_k: u32,
    /// Positions selected.
    pub n_selected: u32,
    /// Near-cut candidates known.
    pub n_near: u32,
}

/// The prefetch prelude's `Nomination` (`when`: 0 this step, 1 next step; `candidates`: 0 the
/// selection, 1 the near-cut candidates).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuNomination {
    /// The layer whose buffer receives the rows.
    pub target: u32,
    /// When: 0 this step, 1 next step.
    pub when: u32,
    /// Which positions: 0 the selection, 1 the near-cut candidates.
    pub candidates: u32,
    /// Most rows brought in.
    pub budget: u32,
}

// SAFETY: #[repr(C)] structs of u32, laid out as the prefetch prelude's structs.
unsafe impl DeviceRepr for GpuPrefetchSource {}
// SAFETY: all-zero bytes are a valid value of every field.
unsafe impl ValidAsZeroBits for GpuPrefetchSource {}
// SAFETY: as above.
unsafe impl DeviceRepr for GpuNomination {}
// SAFETY: all-zero bytes are a valid value of every field.
unsafe impl ValidAsZeroBits for GpuNomination {}

impl GpuNomination {
    /// The nomination in its Rust form.
    pub fn to_nomination(self) -> Option<hisparse_policy::prefetch::Nomination> {
        use hisparse_policy::prefetch::{Candidates, Nomination, When};
        Some(Nomination {
            target: self.target,
            when: match self.when {
                0 => When::ThisStep,
                1 => When::NextStep,
                _ => return None,
            },
            candidates: match self.candidates {
                0 => Candidates::Selection,
                1 => Candidates::Near,
                _ => return None,
            },
            budget: self.budget as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_cuda_prelude() {
        // C++: struct StepCtx { unsigned step; unsigned layer; unsigned long long request;
        //                       unsigned buffer_slots; unsigned long long seed; } -> 32 bytes.
        assert_eq!(size_of::<GpuStepCtx>(), 32);
        assert_eq!(std::mem::offset_of!(StepCtx, request), 8);
        assert_eq!(std::mem::offset_of!(StepCtx, seed), 24);
        // struct VictimKey { bool any; bool occupied; unsigned long long priority; unsigned slot; } -> 24.
        assert_eq!(size_of::<GpuVictimKey>(), 24);
        assert_eq!(std::mem::offset_of!(VictimKey, priority), 8);
        assert_eq!(std::mem::offset_of!(VictimKey, slot), 16);
        assert_eq!(size_of::<GpuSlotRecord>(), 8);
        assert_eq!(size_of::<GpuPolicyScalars>(), 8);
        // struct PolicyEnv { StepCtx ctx; PolicyScalars scalars; VictimKey victim; unsigned slot,
        // token, next_use; float score; unsigned prefetched, token_word; } -> 88 bytes.
        assert_eq!(size_of::<GpuPolicyEnv>(), 88);
        assert_eq!(std::mem::offset_of!(PolicyEnv, scalars), 32);
        assert_eq!(std::mem::offset_of!(PolicyEnv, victim), 40);
        assert_eq!(std::mem::offset_of!(PolicyEnv, slot), 64);
        assert_eq!(std::mem::offset_of!(PolicyEnv, score), 76);
        assert_eq!(std::mem::offset_of!(PolicyEnv, token_word), 84);
        // The prefetch prelude: seven and four unsigned.
        assert_eq!(size_of::<GpuPrefetchSource>(), 28);
        assert_eq!(size_of::<GpuNomination>(), 16);
    }
}
