//! `KeyBlock`: a block of positions of one request with the queries that score them, and the
//! pool rows of its keys: what the oracle's logit paths (`oracle_keys.rs`, `oracle_channels.rs`)
//! read.

use super::index_keys::key_row;
use crate::batch::{IndexerBatch, IndexerRequest};
use hisparse_memory::EmulatedDevice;

/// A block of positions of one request, and the queries that score them.
#[derive(Clone, Copy)]
pub(super) struct KeyBlock<'a, 'b> {
    pub batch: &'a IndexerBatch<'b, EmulatedDevice>,
    pub r: &'a IndexerRequest,
    /// The block's first position.
    pub first: usize,
    pub q: &'a [f32],
    pub w: &'a [f32],
    /// Each head's non-zero span of its query.
    pub spans: &'a [(usize, usize)],
}

/// The pool rows of the block's first `n` positions: a page's positions are consecutive rows,
/// so the page table is read once per page.
pub(super) fn key_rows(kb: KeyBlock<'_, '_>, n: usize) -> impl Iterator<Item = usize> {
    let p = kb.batch.page_tokens;
    let (mut row, mut left_in_page) = (0, 0);
    (kb.first..kb.first + n).map(move |t| {
        if left_in_page == 0 {
            row = key_row(kb.batch, kb.r, t);
            left_in_page = p - t % p;
        }
        (row, left_in_page) = (row + 1, left_in_page - 1);
        row - 1
    })
}
