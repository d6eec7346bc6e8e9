//! The CUDA C contract of a policy. [`EvictionPolicy::cuda`]
//! returns C++ (a `.cuh` of the policy's own) defining, for the types of [`prelude`], any of:
//!
//! ```text
//! #define POLICY_PRIORITY  __device__ unsigned long long policy_priority(const SlotRecord&, const PolicyEnv&);
//! #define POLICY_ON_HIT    __device__ void policy_on_hit(SlotRecord&, const PolicyEnv&);
//! #define POLICY_ON_INSERT __device__ void policy_on_insert(SlotRecord&, const PolicyEnv&);
//! #define POLICY_ON_KEEP   __device__ void policy_on_keep(SlotRecord&, const PolicyEnv&);
//! #define POLICY_ON_EVICT  __device__ unsigned policy_on_evict(const SlotRecord&, const PolicyEnv&);
//! #define POLICY_FINISH    __device__ void policy_finish(PolicyScalars&, const PolicyEnv&);
//! ```
//!
//! each defined hook preceded by its `#define` (a policy writes only the hooks it needs; the
//! others take the defaults of [`DEFAULTS`], which match the trait's defaults: nothing, and
//! `on_evict` keeping the token's word). `policy_priority` and `policy_on_insert` have no
//! default, as in the trait.

use super::EvictionPolicy;

/// Types every policy's CUDA hooks are compiled with: generated from the `#[repr(C)]` Rust
/// types, with checks that C lays them out as Rust does.
pub fn prelude() -> String {
    use super::{PolicyEnv, PolicyScalars, SlotRecord, StepCtx, VictimKey};
    use hisparse_memory::c_layout::part;
    hisparse_memory::c_layout::prelude(
        &[],
        &[part::<SlotRecord>(), part::<PolicyScalars>(), part::<StepCtx>(), part::<VictimKey>(), part::<PolicyEnv>()],
    )
}

/// The hooks a policy did not define.
pub const DEFAULTS: &str = r#"
#ifndef POLICY_ON_HIT
__device__ void policy_on_hit(SlotRecord&, const PolicyEnv&) {}
#endif
#ifndef POLICY_ON_KEEP
__device__ void policy_on_keep(SlotRecord&, const PolicyEnv&) {}
#endif
#ifndef POLICY_ON_EVICT
__device__ unsigned policy_on_evict(const SlotRecord&, const PolicyEnv& e) { return e.token_word; }
#endif
#ifndef POLICY_FINISH
__device__ void policy_finish(PolicyScalars&, const PolicyEnv&) {}
#endif
"#;

/// The code spliced into a kernel template for `policy`: the prelude, its hooks, the defaults;
/// `None` for a policy without a GPU form.
pub fn program(policy: &dyn EvictionPolicy) -> Option<String> {
    let hooks = policy.cuda()?;
    Some(format!("{}\n{hooks}\n{DEFAULTS}", prelude()))
}
