//! How requests reach an engine in `hisparse run`: all at once, or one by one by a Poisson
//! process (exponential gaps at a given rate, seeded), each submitted with its arrival time so
//! that its time to first decode counts from when it arrived, not from when the loop noticed it.
//! A request that finds the waiting queue full is refused (counted, not retried).

use std::time::{Duration, Instant};

use hisparse_engine::{DecodeEngine, EngineError, RequestSpec, StepReport};
use rand::{Rng, SeedableRng};

use crate::error::Result;
use crate::interrupt;

/// Longest expected span of a run's arrivals, in seconds (`--arrival-rate` is refused beyond).
pub const LONGEST_ARRIVALS_S: f64 = 86_400.0;

/// When each request arrives, in seconds from the start (ascending).
pub fn poisson_times(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xa771_7a1e);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            // Inverse transform of a uniform in (0, 1]: an exponential gap of mean 1 / rate.
            let u: f64 = 1.0 - rng.random::<f64>();
            t += -u.ln() / rate;
            t
        })
        .collect()
}

/// Drives `e` until every request of `specs` arrived and nothing is left: submits those due
/// (`times[i]` seconds after the start; all at once without times), steps while anything is
/// queued or running, and sleeps until the next arrival while idle. `on_step` sees every
/// report (and may stop the run with an error). Returns the requests refused by a full queue.
///
/// As a rank of a group (`vote`), it steps while any rank has work, even with nothing of its
/// own to decode (an idle step, which still meets the others' collectives), and ends with the
/// last rank to finish.
pub fn drive(
    e: &mut dyn DecodeEngine,
    specs: &[RequestSpec],
    times: Option<&[f64]>,
    vote: Option<&super::rank_vote::RankVote>,
    mut on_step: impl FnMut(StepReport) -> Result<()>,
) -> Result<Vec<u64>> {
    let start = Instant::now();
    let (mut next, mut refused) = (0, Vec::new());
    loop {
        let now = start.elapsed().as_secs_f64();
        while next < specs.len() && times.is_none_or(|t| t[next] <= now) {
            let at = times.map_or(start, |t| start + Duration::from_secs_f64(t[next]));
            match e.submit_arrived(specs[next], at) {
                Ok(()) => {}
                Err(EngineError::QueueFull { .. }) => refused.push(specs[next].id.0),
                Err(err) => return Err(err.into()),
            }
            next += 1;
        }
        let (pending, active) = (next < specs.len() || !e.is_idle(), !e.is_idle());
        let (pending, active) = vote.map_or((pending, active), |v| v.any(pending, active));
        if !pending {
            break;
        }
        if !active {
            if let Some(t) = times.and_then(|t| t.get(next)) {
                // Nothing to decode until the next arrival (Ctrl-C still heard).
                interrupt::sleep(Duration::from_secs_f64((t - now).clamp(0.0, 0.05)), || {
                    format!("waiting for request {} to arrive", next + 1)
                })?;
            } else if vote.is_some() {
                // Another rank's request arrives next.
                interrupt::sleep(Duration::from_millis(1), || "waiting for the other ranks".into())?;
            }
            continue;
        }
        on_step(e.step()?)?;
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_have_the_asked_mean_and_are_seeded() {
        let t = poisson_times(20_000, 50.0, 3);
        assert!(t.windows(2).all(|w| w[1] > w[0]));
        let mean_gap = t[t.len() - 1] / t.len() as f64;
        assert!((mean_gap - 0.02).abs() < 0.001, "{mean_gap}");
        assert_eq!(t, poisson_times(20_000, 50.0, 3));
        assert_ne!(t, poisson_times(20_000, 50.0, 4));
    }
}
