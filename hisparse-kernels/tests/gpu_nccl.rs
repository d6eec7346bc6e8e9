//! NCCL collectives on the GPUs of this machine against the CPU twin: every visible GPU a rank
//! (one thread each), random bf16 rows; the all-gather is exact, the reduce-scatter within bf16
//! rounding of the twin's single-rounded sum. With one GPU it is the one-rank group the issue's
//! single-H200 run uses.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use half::bf16;
use hisparse_kernels::Collectives;
use hisparse_kernels::CpuRank;
use hisparse_kernels::cuda::{CudaDevice, NcclId, NcclRank, nccl_available};
use rand::{Rng, SeedableRng};

fn random(seed: u64, n: usize) -> Vec<bf16> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| bf16::from_f32(rng.random_range(-4.0..4.0f32))).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nccl_collectives_match_the_cpu_twin_on_every_gpu() {
    assert!(nccl_available(), "libnccl.so.2 cannot be loaded on this GPU host");
    let gpus = cudarc::driver::CudaContext::device_count().unwrap() as usize;
    assert!(gpus >= 1);
    let len = 4096 + 7;
    let id = NcclId::new().unwrap();
    let run_cpu = |mut r: CpuRank| {
        let mut g = vec![bf16::ZERO; gpus * len];
        r.all_gather(&random(r.rank() as u64, len), &mut g).unwrap();
        let mut b = vec![bf16::ZERO; len];
        r.reduce_scatter(&random(50 + r.rank() as u64, gpus * len), &mut b).unwrap();
        (g, b)
    };
    let cpu: Vec<_> = std::thread::scope(|s| {
        let h: Vec<_> = CpuRank::group(gpus).unwrap().into_iter().map(|r| s.spawn(move || run_cpu(r))).collect();
        h.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let gpu: Vec<_> = std::thread::scope(|s| {
        let h: Vec<_> = (0..gpus)
            .map(|rank| {
                s.spawn(move || {
                    let dev = Arc::new(CudaDevice::with_own_stream(rank).unwrap());
                    let mut r = NcclRank::join(&dev, rank, gpus, &id).unwrap();
                    let st = dev.stream();
                    let send = st.clone_htod(&random(rank as u64, len)).unwrap();
                    let mut g = st.alloc_zeros::<bf16>(gpus * len).unwrap();
                    r.all_gather(&send, &mut g).unwrap();
                    let send = st.clone_htod(&random(50 + rank as u64, gpus * len)).unwrap();
                    let mut b = st.alloc_zeros::<bf16>(len).unwrap();
                    r.reduce_scatter(&send, &mut b).unwrap();
                    assert_eq!(r.max(3 * rank as u32 + 1).unwrap(), 3 * (gpus as u32 - 1) + 1, "the ranks' max");
                    // Wrong lengths are refused before NCCL is called (one element too many,
                    // whatever the rank count).
                    let one = st.clone_htod(&random(90 + rank as u64, len)).unwrap();
                    let mut long = st.alloc_zeros::<bf16>(gpus * len + 1).unwrap();
                    assert!(r.all_gather(&one, &mut long).unwrap_err().to_string().contains("recv"));
                    (st.clone_dtoh(&g).unwrap(), st.clone_dtoh(&b).unwrap())
                })
            })
            .collect();
        h.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, ((cg, cb), (gg, gb))) in cpu.iter().zip(&gpu).enumerate() {
        assert_eq!(cg, gg, "rank {rank}: all-gather");
        for (i, (c, g)) in cb.iter().zip(gb).enumerate() {
            let tol = 2f32.powi(-7) * (gpus as f32) * 4.0;
            assert!((c.to_f32() - g.to_f32()).abs() <= tol, "rank {rank} element {i}: {c} vs {g}");
        }
    }
    eprintln!("{gpus} rank(s): NCCL all-gather equals the CPU twin, reduce-scatter within bf16 rounding");
}
