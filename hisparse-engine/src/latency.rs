//! Serving latency: when each request's tokens came out. Every decoded token yields one
//! [`TokenLatency`]: its request's first token measures the time from the request's arrival to
//! its first decode step's end (time to first decode, which includes waiting for capacity and
//! admission), every later one the time since the request's previous token (per-token latency).
//! [`LatencySummary`] gives their percentiles.

use serde::Serialize;

use hisparse_memory::RequestId;

/// One decoded token's latency.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TokenLatency {
    /// The request.
    pub request: RequestId,
    /// The token's index among the request's generated tokens (0: its first).
    pub token: u32,
    /// Seconds since the request arrived (first token) or since its previous token.
    pub seconds: f64,
}

/// Percentiles of a set of latencies, in seconds (nearest rank; all zero when empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// The percentiles of `samples` (any order).
    pub fn of(samples: &[f64]) -> Self {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        // Nearest rank: the smallest sample with at least p% of the samples at or below it.
        let at = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Self { count: v.len(), p50: at(50.0), p90: at(90.0), p99: at(99.0), max: v[v.len() - 1] }
    }
}

/// Time to first decode and per-token latency over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// From a request's arrival to the end of its first decode step.
    pub first_decode: Percentiles,
    /// Between consecutive tokens of a request.
    pub per_token: Percentiles,
}

impl LatencySummary {
    /// The summary of `tokens`.
    pub fn of(tokens: &[TokenLatency]) -> Self {
        let (first, rest): (Vec<&TokenLatency>, Vec<&TokenLatency>) = tokens.iter().partition(|t| t.token == 0);
        Self {
            first_decode: Percentiles::of(&first.iter().map(|t| t.seconds).collect::<Vec<_>>()),
            per_token: Percentiles::of(&rest.iter().map(|t| t.seconds).collect::<Vec<_>>()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!((p.count, p.p50, p.p90, p.p99, p.max), (200, 100.0, 180.0, 198.0, 200.0));
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
        assert_eq!(Percentiles::of(&[3.0]).p99, 3.0);
    }

    #[test]
    fn first_tokens_and_later_ones_are_kept_apart() {
        let t = |token, seconds| TokenLatency { request: RequestId(1), token, seconds };
        let s = LatencySummary::of(&[t(0, 5.0), t(1, 1.0), t(2, 3.0), t(0, 7.0)]);
        assert_eq!((s.first_decode.count, s.first_decode.max, s.first_decode.p50), (2, 7.0, 5.0));
        assert_eq!((s.per_token.count, s.per_token.p50, s.per_token.max), (2, 1.0, 3.0));
    }
}
