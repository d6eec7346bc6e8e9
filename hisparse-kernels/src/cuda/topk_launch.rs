//! Top-k over several blocks per request (`kernels/topk_split.cu`), for batches too small to
//! fill the GPU with one block per request: a histogram of the top 11 bits merged in global
//! memory, the keys of the k-th largest's bin kept as candidates, their radix selection, and the
//! positions placed chunk by chunk — the same selection as the one-block kernel (ascending,
//! ties to the lower positions). [`TopKSplitChoice::choose`] picks the chunk count; the launches
//! and their scratch live here.

use super::facts::SplitArgs;
use std::sync::Mutex;

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::buffers::lock;
use super::device::CudaDevice;
use super::driver_error;
use super::facts::GpuSpan;
use super::printed_launch::{PrintedLaunch, addr};
use crate::error::{KernelError, Result};

use super::facts::{SPLIT_THREADS, TOPK_BINS as BINS};
/// Positions of one round of the placing kernel (`SPLIT_THREADS * V`): chunks are multiples.
const ROUND: usize = 2048;
/// Most chunks per request (the resolving kernel's per-chunk shared arrays).
const MAX_CHUNKS: usize = 1024;
/// Automatic choice: split only requests of at least this many rounds (64k positions) ...
const MIN_SPLIT_ROUNDS: usize = 32;
/// ... into at least this many chunks. Measured on the H200 (BENCHMARKS.md): 2048 of
/// 128k in 33 us with 64 chunks against 112 us in one block, 50 against 112 us with 17 chunks at
/// 8 requests, but 130 against 114 us with 3 chunks at 64 requests and 29 against 27 us at 32k:
/// four launches and the candidates' pass cost more than a few chunks or a short span gain.
/// With the one-block kernel's candidates in shared memory (same entry, later) the choice holds:
/// 33 against 62 us at one request, 48 against 79 at 8, one block (81 us) at 64, and 25 us in
/// one block at 32k against 30 split.
const MIN_SPLIT_CHUNKS: usize = 8;

/// Reused buffers: the merged histograms (and candidate counts), the candidates, per chunk and
/// per request words.
struct SplitScratch {
    hist: CudaSlice<u32>,
    cand_pos: CudaSlice<u32>,
    cand_key: CudaSlice<u32>,
    chunk_words: CudaSlice<u32>,
    req_words: CudaSlice<u32>,
}

/// How many chunks a request's top-k takes.
#[derive(Debug)]
pub(crate) struct TopKSplitChoice {
    sms: usize,
    /// Chunks per request: 0 chooses per call; 1 never splits; more: at most that many.
    pub(crate) blocks: std::sync::atomic::AtomicUsize,
}

impl TopKSplitChoice {
    /// `(chunk, chunks)` for `requests` requests of at most `longest` positions, or `None` for
    /// the one-block kernel. Chosen per call (`blocks` 0): about one block per SM in all, chunks
    /// of whole rounds, and only where that gives long requests at least `MIN_SPLIT_CHUNKS`
    /// chunks; a fixed count splits whenever the span has more than one round.
    pub(crate) fn choose(&self, requests: usize, longest: usize) -> Option<(usize, usize)> {
        let rounds = longest.div_ceil(ROUND).max(1);
        let g = match self.blocks.load(std::sync::atomic::Ordering::Relaxed) {
            0 => {
                let g = (self.sms / requests.max(1)).min(rounds);
                if rounds < MIN_SPLIT_ROUNDS || g < MIN_SPLIT_CHUNKS {
                    return None;
                }
                g
            }
            n => n.min(rounds),
        }
        .min(MAX_CHUNKS);
        if g <= 1 {
            return None;
        }
        let chunk = rounds.div_ceil(g) * ROUND;
        Some((chunk, longest.div_ceil(chunk)))
    }
}

/// The multi-block top-k's kernels, scratch and chunk choice.
pub(crate) struct TopKSplit {
    hist: CudaFunction,
    filter: CudaFunction,
    resolve: CudaFunction,
    place: CudaFunction,
    scratch: Mutex<SplitScratch>,
    pub(crate) choice: TopKSplitChoice,
}

impl TopKSplit {
    /// The kernels of `dev`'s top-k module.
    pub(crate) fn load(dev: &CudaDevice, sms: usize) -> Result<Self> {
        let s = dev.stream();
        let a = |e| driver_error("top-k scratch")(e);
        let scratch = SplitScratch {
            hist: s.alloc_zeros(1).map_err(a)?,
            cand_pos: s.alloc_zeros(1).map_err(a)?,
            cand_key: s.alloc_zeros(1).map_err(a)?,
            chunk_words: s.alloc_zeros(1).map_err(a)?,
            req_words: s.alloc_zeros(1).map_err(a)?,
        };
        Ok(Self {
            hist: dev.function("topk", "topk_hist")?,
            filter: dev.function("topk", "topk_filter")?,
            resolve: dev.function("topk", "topk_resolve")?,
            place: dev.function("topk", "topk_place")?,
            scratch: Mutex::new(scratch),
            // One block per request by default (`CudaBackend::with_top_k_blocks` chooses the
            // split form; its GPU test and `kernel-bench` set the choice explicitly).
            choice: TopKSplitChoice { sms, blocks: 0.into() },
        })
    }

    /// Top-`k` of every span of `scores` into `out` (`k` per span) in `chunks` chunks of `chunk`
    /// positions; the spans are on the device already, beside their host copy (each lies within
    /// `scores`, and `out` holds `host.len() * k`: checked by the caller).
    pub(crate) fn launch(
        &self,
        dev: &CudaDevice,
        scores: &CudaSlice<f32>,
        (spans, host): (&CudaSlice<GpuSpan>, &[GpuSpan]),
        k: usize,
        (chunk, chunks): (usize, usize),
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let n = host.len();
        let bad =
            |field: &'static str, v: usize| KernelError::invalid(field, v, "does not fit the kernel's 32-bit field");
        let args = SplitArgs {
            k: u32::try_from(k).map_err(|_| bad("k", k))?,
            chunk: u32::try_from(chunk).map_err(|_| bad("chunk", chunk))?,
            blocks: u32::try_from(chunks).map_err(|_| bad("chunks", chunks))?,
            pad: 0,
        };
        if chunks > MAX_CHUNKS || host.iter().any(|s| s.len as usize > chunk.saturating_mul(chunks)) {
            return Err(KernelError::invalid(
                "chunks",
                chunks,
                format!("{chunk}-position chunks do not cover the spans"),
            ));
        }
        let mut sc = lock(&self.scratch)?;
        let SplitScratch { hist, cand_pos, cand_key, chunk_words, req_words } = &mut *sc;
        let hist_len = n * (BINS + 1);
        super::buffers::room(dev, hist, hist_len)?;
        // Candidates sit at their request's own score offsets.
        super::buffers::room(dev, cand_pos, scores.len())?;
        super::buffers::room(dev, cand_key, scores.len())?;
        super::buffers::room(dev, chunk_words, n * chunks * 3)?;
        super::buffers::room(dev, req_words, n * 3)?;
        let s = dev.stream();
        let mut h = hist.slice_mut(..hist_len);
        s.memset_zeros(&mut h).map_err(driver_error("top-k histogram"))?;
        dev.print.fold(&[0x5e7, addr(hist, s), 4 * hist_len as u64]);
        let grid = (n as u32, chunks as u32, 1);
        let cfg = |grid_dim| LaunchConfig { grid_dim, block_dim: (SPLIT_THREADS as u32, 1, 1), shared_mem_bytes: 0 };
        let mut b = PrintedLaunch::new(&dev.print, s, &self.hist);
        b.arg(scores).arg(spans).params(&args).arg_mut(hist);
        // SAFETY: every span lies within `scores` (checked by the caller) and the histograms
        // hold BINS + 1 words per request (sized above).
        unsafe { b.launch(cfg(grid)) }.map_err(driver_error("top-k histogram launch"))?;
        let mut b = PrintedLaunch::new(&dev.print, s, &self.filter);
        b.arg(scores).arg(spans).params(&args).arg_mut(hist).arg_mut(cand_pos).arg_mut(cand_key).arg_mut(chunk_words);
        // SAFETY: as above; a request's candidates (at most its positions) are written from its
        // score offset, within `scores.len()` entries; three words per chunk.
        unsafe { b.launch(cfg(grid)) }.map_err(driver_error("top-k filter launch"))?;
        let mut b = PrintedLaunch::new(&dev.print, s, &self.resolve);
        b.arg(spans).params(&args).arg(hist).arg(cand_pos).arg(cand_key).arg_mut(chunk_words).arg_mut(req_words);
        // SAFETY: reads what the two launches before wrote; at most MAX_CHUNKS chunks (checked).
        unsafe { b.launch(cfg((n as u32, 1, 1))) }.map_err(driver_error("top-k resolve launch"))?;
        let mut b = PrintedLaunch::new(&dev.print, s, &self.place);
        b.arg(scores).arg(spans).params(&args).arg(chunk_words).arg(req_words).arg_mut(out);
        // SAFETY: every request writes exactly k positions from its own k-slot of `out`, which
        // holds n * k (checked by the caller).
        unsafe { b.launch(cfg(grid)) }.map_err(driver_error("top-k place launch"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The chunk plan of `kernels/topk_split.cu`, step by step in Rust (histogram, filter,
    //! resolve, place, with the kernels' bins, masks and per-chunk tie quotas), against the CPU
    //! top-k: a check of the design that the GPU test then checks on the kernels themselves.
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
    use super::*;
    use crate::cpu::top_k_positions;
    use rand::{Rng, SeedableRng};

    fn ordered(x: f32) -> u32 {
        let b = x.to_bits();
        if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
    }

    /// The bin holding the `k`-th largest of `hist` (from the top): (bin, above, in bin).
    fn find_bin(hist: &[u32], k: u32) -> (u32, u32, u32) {
        let mut above = 0;
        for b in (0..hist.len()).rev() {
            if above < k && above + hist[b] >= k {
                return (b as u32, above, hist[b]);
            }
            above += hist[b];
        }
        unreachable!("k is at most the keys counted")
    }

    fn split_top_k(s: &[f32], k: usize, chunk: usize) -> Vec<i32> {
        let keys: Vec<u32> = s.iter().map(|&x| ordered(x)).collect();
        let chunks = s.len().div_ceil(chunk);
        let mut hist = vec![0u32; BINS];
        for &key in &keys {
            hist[(key >> 21) as usize] += 1;
        }
        let (bin, above, in_bin) = find_bin(&hist, k as u32);
        let cand: Vec<(usize, u32)> = keys.iter().copied().enumerate().filter(|&(_, key)| key >> 21 == bin).collect();
        let mut gt: Vec<u32> = (0..chunks)
            .map(|g| {
                keys[g * chunk..((g + 1) * chunk).min(keys.len())].iter().filter(|&&key| key >> 21 > bin).count() as u32
            })
            .collect();
        let (mut prefix, mut mask, mut remaining) = (bin << 21, 0xffe0_0000u32, k as u32 - above);
        let mut whole = remaining == in_bin;
        for (shift, width) in [(10u32, 11u32), (0, 10)] {
            if whole {
                break;
            }
            let dm = (1u32 << width) - 1;
            let mut h = vec![0u32; BINS];
            for &(_, key) in &cand {
                if key & mask == prefix {
                    h[((key >> shift) & dm) as usize] += 1;
                }
            }
            let (b, above, in_b) = find_bin(&h, remaining);
            prefix |= b << shift;
            mask |= dm << shift;
            remaining -= above;
            whole = remaining == in_b;
        }
        let mut eq = vec![0u32; chunks];
        for &(pos, key) in &cand {
            if key & mask > prefix {
                gt[pos / chunk] += 1;
            } else if key & mask == prefix {
                eq[pos / chunk] += 1;
            }
        }
        let mut out = vec![-1i32; k];
        let (mut at, mut left) = (0usize, remaining);
        for g in 0..chunks {
            let take = eq[g].min(left);
            left -= take;
            let (mut w, mut ties) = (at, 0);
            for (pos, &key) in keys.iter().enumerate().take(((g + 1) * chunk).min(keys.len())).skip(g * chunk) {
                let m = key & mask;
                if m > prefix || (m == prefix && ties < take) {
                    ties += u32::from(m == prefix);
                    out[w] = pos as i32;
                    w += 1;
                }
            }
            at += (gt[g] + take) as usize;
            assert_eq!(w, at, "chunk {g} wrote what its counts said");
        }
        assert_eq!((at, left), (k, 0));
        out
    }

    #[test]
    fn the_chunk_plan_selects_what_the_cpu_selects() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for case in 0..60 {
            let n = rng.random_range(1..20_000);
            let k = rng.random_range(1..=n.min(3000));
            let coarse = case % 3;
            let s: Vec<f32> = (0..n)
                .map(|_| match coarse {
                    // Heavy ties, a few specials.
                    0 => match rng.random_range(0..100) {
                        0 => f32::NAN,
                        1 => f32::INFINITY,
                        2 => -0.0,
                        _ => (rng.random::<f32>() * 40.0).round() / 4.0,
                    },
                    1 => rng.random::<f32>() * 6.0 - 3.0,
                    // All equal: one bin, every pass.
                    _ => 1.5,
                })
                .collect();
            let mut want = vec![0i32; k];
            top_k_positions(&s, k, &mut want);
            for chunk in [ROUND, 3 * ROUND, 5000] {
                assert_eq!(split_top_k(&s, k, chunk), want, "case {case}: n {n}, k {k}, chunk {chunk}");
            }
        }
    }

    #[test]
    fn chunks_are_whole_rounds_and_only_for_small_batches() {
        let s = TopKSplitChoice { sms: 132, blocks: 0.into() };
        assert_eq!(s.choose(1, 131_072), Some((2048, 64)));
        assert_eq!(s.choose(8, 131_072), Some((8192, 16)), "16 blocks a request, whole rounds");
        assert_eq!(s.choose(16, 131_072), Some((16_384, 8)), "8 blocks a request");
        assert_eq!(s.choose(32, 131_072), None, "4 chunks a request measured slower");
        assert_eq!(s.choose(64, 131_072), None);
        assert_eq!(s.choose(1, 32_768), None, "a short span: one block");
        assert_eq!(s.choose(1, 65_536), Some((2048, 32)));
        assert_eq!(s.choose(1, 2048), None, "one round: one block");
        s.blocks.store(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.choose(1, 131_072), None);
        s.blocks.store(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(s.choose(1, 10_000), Some((2048, 5)));
    }
}
