//! [`SwapCounts`]: what swap-ins counted — one struct for a layer's launch, a step, a whole run
//! and a simulated replay, added up with `+=`.

use serde::{Deserialize, Serialize};

/// What swap-ins counted: selected tokens found in their hot buffer or brought in, the bytes
/// that moved, the prefetches and what became of them.
///
/// ```
/// use hisparse_policy::SwapCounts;
/// let mut step = SwapCounts { hits: 10, misses: 2, max_misses: 2, ..SwapCounts::default() };
/// step += SwapCounts { hits: 7, misses: 5, max_misses: 5, ..SwapCounts::default() };
/// assert_eq!((step.hits, step.misses, step.max_misses), (17, 7, 5)); // sums; the largest
/// assert!((step.miss_ratio() - 7.0 / 24.0).abs() < 1e-12);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwapCounts {
    /// Selected tokens found in the hot buffer (the newest included).
    pub hits: u64,
    /// Selected tokens brought in from the host tier after their selection was known (the
    /// critical path).
    pub misses: u64,
    /// The most misses of one (request, layer): what a batch's layer waits for.
    pub max_misses: u64,
    /// Bytes copied host → device (prefetches included).
    pub bytes_h2d: u64,
    /// Of those, the bytes of rows prefetched before their layer's selection was known.
    pub bytes_h2d_prefetch: u64,
    /// Rows prefetched.
    pub prefetched: u64,
    /// Prefetched rows a selection used.
    pub prefetch_useful: u64,
    /// Prefetched rows evicted before any selection used them.
    pub prefetch_wasted: u64,
    /// Of the misses, rows host threads gathered for the copy engine (`copy-engine`).
    pub copy_engine_rows: u64,
    /// Of the misses, rows past the copy engine's landing rows (read by the scatter kernel).
    pub copy_engine_overflow: u64,
}

impl SwapCounts {
    /// `misses / (hits + misses)` (0 when nothing was selected).
    pub fn miss_ratio(&self) -> f64 {
        let selected = self.hits + self.misses;
        if selected > 0 { self.misses as f64 / selected as f64 } else { 0.0 }
    }
}

impl std::ops::AddAssign for SwapCounts {
    /// Sums every count; `max_misses` keeps the larger.
    fn add_assign(&mut self, o: Self) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.max_misses = self.max_misses.max(o.max_misses);
        self.bytes_h2d += o.bytes_h2d;
        self.bytes_h2d_prefetch += o.bytes_h2d_prefetch;
        self.prefetched += o.prefetched;
        self.prefetch_useful += o.prefetch_useful;
        self.prefetch_wasted += o.prefetch_wasted;
        self.copy_engine_rows += o.copy_engine_rows;
        self.copy_engine_overflow += o.copy_engine_overflow;
    }
}
