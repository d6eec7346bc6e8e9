//! How much two selections share: the locality figure `hisparse trace info` and the workload's
//! calibration report (consecutive steps of a stream, adjacent layers of a step).

use super::TraceRecord;

impl TraceRecord {
    /// The share of this record's selected positions that `other` selected too, its newest
    /// position (`seq_len - 1`, always selected) left out; `None` when it selected nothing else.
    /// Both selections are ascending (as [`TraceRecord::check`] requires): one merge pass.
    pub fn overlap_with(&self, other: &TraceRecord) -> Option<f64> {
        selection_overlap(&self.selected, self.seq_len, &other.selected)
    }
}

/// [`TraceRecord::overlap_with`] of selections as slices: the share of `selected` (of a
/// sequence of `seq_len`, its newest position left out) that `other` holds too.
pub fn selection_overlap(selected: &[u32], seq_len: u32, other: &[u32]) -> Option<f64> {
    let newest = seq_len.wrapping_sub(1);
    let b = other;
    let (mut n, mut common, mut j) = (0usize, 0usize, 0usize);
    for &t in selected.iter().filter(|&&t| t != newest) {
        n += 1;
        while j < b.len() && b[j] < t {
            j += 1;
        }
        common += usize::from(j < b.len() && b[j] == t);
    }
    (n > 0).then(|| common as f64 / n as f64)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use crate::trace::TraceRecord;

    fn record(selected: Vec<u32>, seq_len: u32) -> TraceRecord {
        TraceRecord { step: 1, request: 0, layer: 0, seq_len, selected, scores: None, near: None }
    }

    /// Ascending distinct positions below `n`, each kept with probability `p`.
    fn set(rng: &mut rand::rngs::StdRng, n: u32, p: f64) -> Vec<u32> {
        (0..n).filter(|_| rng.random_bool(p)).collect()
    }

    #[test]
    fn the_merged_overlap_counts_what_a_lookup_per_position_counts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..300 {
            let n = rng.random_range(1..400u32);
            let (pa, pb): (f64, f64) = (rng.random(), rng.random());
            let (a, b) = (set(&mut rng, n, pa), set(&mut rng, n, pb));
            // The newest position: the last one, or one the selection may not hold.
            let seq_len = if case % 3 == 0 { n } else { rng.random_range(1..=n) };
            let kept: Vec<u32> = a.iter().copied().filter(|&t| t != seq_len - 1).collect();
            let want = (!kept.is_empty())
                .then(|| kept.iter().filter(|t| b.binary_search(t).is_ok()).count() as f64 / kept.len() as f64);
            assert_eq!(record(a.clone(), seq_len).overlap_with(&record(b.clone(), n)), want, "{a:?} {b:?} {seq_len}");
        }
        assert_eq!(record(vec![3], 4).overlap_with(&record(vec![3], 4)), None);
        assert_eq!(record(vec![1, 2, 3, 4], 10).overlap_with(&record(vec![2, 4, 9], 10)), Some(0.5));
    }
}
