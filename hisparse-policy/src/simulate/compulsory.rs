//! The compulsory misses of a stream (an infinite buffer): the bound every policy's misses are
//! read against.

use super::Stream;

/// Compulsory misses of one stream: the first selection of each token while it is not the
/// newest.
pub(super) struct Compulsory {
    /// A byte per token, not a bit: consecutive positions then never read a word the last one
    /// wrote, and the loop runs without waiting on its own stores.
    seen: Vec<bool>,
}

impl Compulsory {
    /// For a stream whose sequences reach `max_len` tokens.
    pub(super) fn new(max_len: usize) -> Self {
        Self { seen: vec![false; max_len] }
    }

    /// The compulsory misses of one record (`selected` ascending, below `seq_len` <= max_len).
    pub(super) fn record(&mut self, selected: &[u32], seq_len: u32) -> u32 {
        // The newest token (the largest position, so last if selected) is never a miss and
        // stays unseen.
        let newest = seq_len.wrapping_sub(1);
        let sel = match selected.split_last() {
            Some((&last, rest)) if last == newest => rest,
            _ => selected,
        };
        let mut first = 0u32;
        for &t in sel {
            let seen = &mut self.seen[t as usize];
            first += u32::from(!*seen);
            *seen = true;
        }
        first
    }
}

/// Compulsory misses of every record of `s`.
pub(super) fn compulsory(s: &Stream<'_>) -> Vec<u32> {
    let mut c = Compulsory::new(s.max_len());
    s.records.iter().map(|r| c.record(&r.selected, r.seq_len)).collect()
}
