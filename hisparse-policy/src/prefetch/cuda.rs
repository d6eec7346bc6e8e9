//! The CUDA C contract of a prefetcher. [`Prefetcher::cuda`] returns
//! C++ (a `.cuh` of the prefetcher's own) defining, for the types and helpers of [`PRELUDE`],
//!
//! ```text
//! __device__ unsigned prefetch_nominate(const PrefetchSource& s, const unsigned* index_source,
//!                                       Nomination* out, unsigned cap);
//! ```
//!
//! which writes at most `cap` nominations for the layer `s.layer` whose selection is known and
//! returns how many — the same nominations, in the same order, as
//! [`Prefetcher::nominate`]. `index_source` holds `s.layers`
//! entries, or is null when every layer is full.

use super::Prefetcher;

/// Helpers every prefetcher's CUDA form is compiled with. The types it reads and writes —
/// `PrefetchSource` ([`LayerSelection`](super::LayerSelection) without its arrays) and
/// `Nomination` ([`Nomination`](super::Nomination): `when` 0 = this step, 1 = next step;
/// `candidates` 0 = the selection, 1 = the near-cut candidates) — are declared before it by the
/// kernels' generated prelude (from their Rust definitions in `hisparse-kernels`).
pub const PRELUDE: &str = r#"
__device__ unsigned prefetch_source_of(const unsigned* index_source, unsigned layers, unsigned layer) {
    return (index_source != nullptr && layer < layers) ? index_source[layer] : layer;
}
__device__ unsigned prefetch_budget_rows(unsigned budget, unsigned top_k) {
    unsigned q = top_k / 4u;
    return budget == 0u ? (q > 0u ? q : 1u) : budget;
}
"#;

/// The code a kernel template splices in for `prefetcher`: the prelude and its rule; `None`
/// for one without a GPU form.
pub fn program(prefetcher: &dyn Prefetcher) -> Option<String> {
    let rule = prefetcher.cuda()?;
    Some(format!("{PRELUDE}\n{rule}\n"))
}
