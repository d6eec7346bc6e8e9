//! Timing helpers: the median of several runs after warm-up, and the host memcpy ceiling
//! measured in the same run.

use std::time::Instant;

/// Runs `f` `warmup` times untimed, then `runs` times, and returns the median seconds. After a
/// Ctrl-C no more warm-up runs start either.
pub fn median_secs<T>(warmup: usize, runs: usize, mut f: impl FnMut() -> T) -> f64 {
    for _ in 0..warmup {
        if crate::interrupt::requested() {
            break;
        }
        std::hint::black_box(f());
    }
    // After a Ctrl-C no more runs start (the caller reports the interruption at its next check).
    let mut times: Vec<f64> = (0..runs.max(1))
        .take_while(|&i| i == 0 || !crate::interrupt::requested())
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Host memcpy bandwidth (bytes read + written per second) over a buffer of `bytes`, median of
/// five copies after one warm-up: the ceiling for memory-bound CPU kernels.
pub fn memcpy_bandwidth(bytes: usize) -> f64 {
    let src: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; bytes];
    let t = median_secs(1, 5, || dst.copy_from_slice(&src));
    2.0 * bytes as f64 / t
}
