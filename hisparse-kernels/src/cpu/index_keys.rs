//! Where a request's index keys lie in the key pool and what they hold as f32: what the
//! lightning indexer (`indexer.rs`) and the oracle (`oracle_index.rs`) both read.

use hisparse_memory::EmulatedDevice;

use crate::batch::{IndexerBatch, IndexerRequest};

/// Pool row of position `t` of request `r` (pages checked by `validate`; a page summary's row
/// is shared by its positions, and summaries divide the page).
#[inline]
pub(super) fn key_row(batch: &IndexerBatch<'_, EmulatedDevice>, r: &IndexerRequest, t: usize) -> usize {
    let p = batch.page_tokens;
    (batch.page_table[r.first_page + t / p] as usize * p + t % p) / batch.key_layout.positions_per_row()
}

/// The bounds of page summary `row` of the pool (`mins`, `maxs`: `dim` values; the batch's
/// summaries were checked by `validate`).
pub(super) fn key_bounds(batch: &IndexerBatch<'_, EmulatedDevice>, row: usize, mins: &mut [f32], maxs: &mut [f32]) {
    let key_bytes = batch.key_layout.row_bytes();
    batch.key_layout.bounds_checked(&batch.keys[row * key_bytes..(row + 1) * key_bytes], mins, maxs);
}
