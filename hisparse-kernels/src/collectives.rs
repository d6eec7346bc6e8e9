//! `Collectives`: the exchange between the ranks (GPUs) of a data-parallel-attention deployment
//! around the model's FFN and expert layers — an all-gather and a reduce-scatter of bf16 rows —
//! as one rank sees it, with a CPU twin ([`CpuRank`], the ranks as threads of one process) and,
//! on CUDA, NCCL (`cuda::NcclRank`). The sizes come from one plan shared by the group
//! (`hisparse_engine::ranks::collectives`).
//!
//! Invariant: every rank of a group makes the same calls in the same order with the same
//! lengths (a collective is a meeting); the CPU twin checks that every rank agrees before any
//! rank writes, so a disagreement fails on every rank alike and leaves every output untouched.

use std::sync::{Arc, Barrier, Mutex};

use half::bf16;
use hisparse_memory::{DeviceMemory, EmulatedDevice};

use crate::error::{KernelError, Result};

/// One rank's side of a group's collectives over memory `M`. Not `Send`: an NCCL rank is made
/// in the thread that uses it.
pub trait Collectives<M: DeviceMemory> {
    /// This rank (0-based).
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn ranks(&self) -> usize;

    /// Every rank's `send` (the same length on each) into `recv` in rank order: `recv` holds
    /// `ranks() * send.len()` elements.
    fn all_gather(&mut self, send: &M::Buffer<bf16>, recv: &mut M::Buffer<bf16>) -> Result<()>;

    /// The element-wise sum over the ranks of `send` (`ranks() * recv.len()` elements on each),
    /// this rank's block of it (`rank() * recv.len()..`) into `recv`.
    fn reduce_scatter(&mut self, send: &M::Buffer<bf16>, recv: &mut M::Buffer<bf16>) -> Result<()>;

    /// The largest `value` of any rank, on every rank (the step's padded batch: what the ranks
    /// agree on before sizing the step's exchanges). Waits for the device (a host value).
    fn max(&mut self, value: u32) -> Result<u32>;
}

/// An NCCL group's identity, made once (`NcclId::new`, on the CUDA side) and handed to every
/// rank.
#[cfg(feature = "nccl")]
#[derive(Clone, Copy)]
pub struct NcclId(pub(crate) [core::ffi::c_char; 128]);

/// One rank's ticket to a group, for [`crate::ModelKernels::join_group`].
pub enum RankMember {
    /// A rank of a CPU group ([`CpuRank::group`]).
    Cpu(CpuRank),
    /// Rank `rank` of `ranks` of the NCCL group `id` (the backend's GPU).
    #[cfg(feature = "nccl")]
    Nccl {
        /// The group.
        id: NcclId,
        /// This rank.
        rank: usize,
        /// Ranks in the group.
        ranks: usize,
    },
}

impl RankMember {
    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        match self {
            Self::Cpu(r) => r.shared.ranks,
            #[cfg(feature = "nccl")]
            Self::Nccl { ranks, .. } => *ranks,
        }
    }
}

/// What every rank of a CPU group posts before the exchange: its input and its output's length.
#[derive(Default, Clone)]
struct Post {
    send: Vec<bf16>,
    recv_len: usize,
    value: u32,
}

struct Shared {
    ranks: usize,
    barrier: Barrier,
    posts: Mutex<Vec<Post>>,
}

/// One rank of a CPU group: [`CpuRank::group`] makes them, one per thread.
pub struct CpuRank {
    rank: usize,
    shared: Arc<Shared>,
}

impl CpuRank {
    /// A group of `ranks` ranks (at least 1); hand one to each thread.
    pub fn group(ranks: usize) -> Result<Vec<Self>> {
        if ranks == 0 {
            return Err(KernelError::invalid("ranks", ranks, "a group needs at least one rank"));
        }
        let shared =
            Arc::new(Shared { ranks, barrier: Barrier::new(ranks), posts: Mutex::new(vec![Post::default(); ranks]) });
        Ok((0..ranks).map(|rank| Self { rank, shared: Arc::clone(&shared) }).collect())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Vec<Post>>> {
        self.shared.posts.lock().map_err(|_| KernelError::invalid("ranks", self.rank, "a rank of the group panicked"))
    }

    /// Posts this rank's input, waits for every rank, checks that they agree (`agree` on every
    /// post, the same answer on every rank), lets `take` read the posts, and waits again so that
    /// no rank posts the next call's input before every rank has read this one's.
    fn meet<T>(
        &self,
        (send, recv_len, value): (&[bf16], usize, u32),
        agree: impl Fn(&[Post]) -> std::result::Result<(), String>,
        take: impl FnOnce(&[Post]) -> T,
    ) -> Result<T> {
        self.lock()?[self.rank] = Post { send: send.to_vec(), recv_len, value };
        self.shared.barrier.wait();
        let out = {
            let posts = self.lock()?;
            agree(&posts).map(|()| take(&posts))
        };
        self.shared.barrier.wait();
        out.map_err(|reason| KernelError::invalid("collective", self.rank, reason))
    }
}

impl Collectives<EmulatedDevice> for CpuRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.shared.ranks
    }

    fn all_gather(&mut self, send: &Vec<bf16>, recv: &mut Vec<bf16>) -> Result<()> {
        let n = self.ranks();
        let agree = |posts: &[Post]| {
            let len = posts[0].send.len();
            match posts.iter().position(|p| p.send.len() != len || p.recv_len != n * len) {
                Some(r) => Err(format!(
                    "all-gather: rank {r} sends {} and receives {} elements, rank 0 sends {len} of {n} ranks",
                    posts[r].send.len(),
                    posts[r].recv_len
                )),
                None => Ok(()),
            }
        };
        let gathered = self.meet((send, recv.len(), 0), agree, |posts| {
            posts.iter().flat_map(|p| p.send.iter().copied()).collect::<Vec<_>>()
        })?;
        recv.copy_from_slice(&gathered);
        Ok(())
    }

    fn reduce_scatter(&mut self, send: &Vec<bf16>, recv: &mut Vec<bf16>) -> Result<()> {
        let (n, rank) = (self.ranks(), self.rank);
        let agree = |posts: &[Post]| {
            let len = posts[0].recv_len;
            match posts.iter().position(|p| p.recv_len != len || p.send.len() != n * len) {
                Some(r) => Err(format!(
                    "reduce-scatter: rank {r} sends {} and receives {} elements, rank 0 receives {len} of {n} ranks",
                    posts[r].send.len(),
                    posts[r].recv_len
                )),
                None => Ok(()),
            }
        };
        let m = recv.len();
        // The sum in f32, in rank order, rounded once (NCCL may round after every hop: the GPU
        // test compares within bf16 rounding).
        let block = self.meet((send, m, 0), agree, |posts| {
            (0..m)
                .map(|i| bf16::from_f32(posts.iter().map(|p| p.send[rank * m + i].to_f32()).sum::<f32>()))
                .collect::<Vec<_>>()
        })?;
        recv.copy_from_slice(&block);
        Ok(())
    }

    fn max(&mut self, value: u32) -> Result<u32> {
        self.meet((&[], 0, value), |_| Ok(()), |posts| posts.iter().map(|p| p.value).max().unwrap_or(value))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use rand::{Rng, SeedableRng};

    use super::*;

    fn random(seed: u64, n: usize) -> Vec<bf16> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| bf16::from_f32(rng.random_range(-4.0..4.0f32))).collect()
    }

    /// Runs `f` on every rank of a group of `n`, one thread each; returns each rank's result.
    fn on_ranks<T: Send>(n: usize, f: impl Fn(&mut CpuRank) -> T + Sync) -> Vec<T> {
        let ranks = CpuRank::group(n).unwrap();
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks.into_iter().map(|mut r| s.spawn(move || f(&mut r))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_gather_concatenates_in_rank_order_and_reduce_scatter_sums_each_block() {
        for n in [1, 3, 8] {
            let len = 37;
            let out = on_ranks(n, |r| {
                let mut gathered = vec![bf16::ZERO; n * len];
                let mine = random(r.rank() as u64, len);
                r.all_gather(&mine, &mut gathered).unwrap();
                let mut block = vec![bf16::ZERO; len];
                r.reduce_scatter(&random(100 + r.rank() as u64, n * len), &mut block).unwrap();
                assert_eq!(r.max(10 + 7 * r.rank() as u32).unwrap(), 10 + 7 * (n as u32 - 1));
                (gathered, block)
            });
            let want_gather: Vec<bf16> = (0..n).flat_map(|r| random(r as u64, len)).collect();
            let full: Vec<Vec<bf16>> = (0..n).map(|r| random(100 + r as u64, n * len)).collect();
            for (rank, (g, b)) in out.iter().enumerate() {
                assert_eq!(g, &want_gather, "{n} ranks: rank {rank}'s gather");
                let want: Vec<bf16> = (0..len)
                    .map(|i| bf16::from_f32(full.iter().map(|s| s[rank * len + i].to_f32()).sum::<f32>()))
                    .collect();
                assert_eq!(b, &want, "{n} ranks: rank {rank}'s block");
                assert!(b.iter().any(|x| x.to_f32() != 0.0));
            }
        }
    }

    #[test]
    fn ranks_that_disagree_all_fail_alike_and_write_nothing() {
        let out = on_ranks(4, |r| {
            let len = if r.rank() == 2 { 5 } else { 4 };
            let mut recv = vec![bf16::ONE; 16];
            let e = r.all_gather(&random(1, len), &mut recv).unwrap_err().to_string();
            // The group stays usable: a consistent call after the failed one works.
            let mut ok = vec![bf16::ZERO; 16];
            r.all_gather(&random(r.rank() as u64, 4), &mut ok).unwrap();
            (e, recv, ok)
        });
        for (e, recv, ok) in &out {
            assert!(e.contains("rank 2 sends 5"), "{e}");
            assert!(recv.iter().all(|x| *x == bf16::ONE), "untouched output");
            assert_eq!(ok.len(), 16);
        }
        assert!(CpuRank::group(0).err().unwrap().to_string().contains("ranks"));
    }
}
