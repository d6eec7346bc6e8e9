//! The CUDA backend's GEMMs (cuBLAS, row-major batches mapped onto column-major strided
//! batches) against the CPU twin on random data: single and batched, thin (decode) and square
//! shapes, within bf16 rounding; and the same GEMMs captured into a launch graph and replayed.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use half::bf16;
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::{GemmShape, gemm, random};
use hisparse_kernels::{Kernels, ModelKernels, StepControl};
use hisparse_memory::DeviceMemory;

fn close(gpu: &[bf16], cpu: &[bf16], what: &str) {
    let scale = cpu.iter().map(|x| x.to_f32().abs()).fold(0f32, f32::max).max(1e-3);
    let mut worst = 0f32;
    for (g, c) in gpu.iter().zip(cpu) {
        let d = (g.to_f32() - c.to_f32()).abs();
        // One bf16 rounding each way (2^-8 relative) plus f32 reassociation over k terms.
        assert!(d <= 8e-3 * c.to_f32().abs() + 2e-3 * scale, "{what}: {g} vs {c} (scale {scale})");
        worst = worst.max(d / scale);
    }
    assert!(gpu.iter().any(|x| x.to_f32() != 0.0), "{what}: all zeros");
    eprintln!("{what}: worst difference {worst:.2e} of the largest output");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_gemm_matches_the_cpu_twin() {
    let gpu = CudaBackend::new(0).expect("a CUDA GPU");
    let mem = gpu.memory().clone();
    let shapes = [
        GemmShape { m: 1, n: 256, k: 6144, batch: 1 },
        GemmShape { m: 37, n: 512, k: 2048, batch: 1 },
        GemmShape { m: 5, n: 384, k: 640, batch: 7 },
        GemmShape { m: 128, n: 96, k: 192, batch: 64 },
        GemmShape { m: 300, n: 300, k: 300, batch: 2 },
    ];
    for (i, s) in shapes.iter().enumerate() {
        let mut rng = random::rng(40 + i as u64);
        let a = random::normal_bf16(&mut rng, s.a_len(), 1.0);
        let b = random::normal_bf16(&mut rng, s.b_len(), 0.05);
        let mut want = vec![bf16::ZERO; s.c_len()];
        gemm::gemm_bf16(s, &a, &b, &mut want).unwrap();
        let (da, db) = (mem.upload(&a).unwrap(), mem.upload(&b).unwrap());
        let mut dc = mem.alloc_zeroed::<bf16>(s.c_len()).unwrap();
        gpu.gemm_bf16(s, &da, &db, &mut dc).unwrap();
        close(&mem.download(&dc).unwrap(), &want, &format!("{s:?}"));

        // The same call captured and replayed into a cleared output.
        mem.write(&mut dc, 0, &vec![bf16::ZERO; s.c_len()]).unwrap();
        assert!(gpu.begin_capture().unwrap());
        gpu.gemm_bf16(s, &da, &db, &mut dc).unwrap();
        gpu.end_capture(7).unwrap();
        assert!(mem.download(&dc).unwrap().iter().all(|x| x.to_f32() == 0.0), "the capture ran the GEMM");
        assert!(gpu.replay(7).unwrap());
        assert!(!gpu.replay(8).unwrap(), "a graph replayed under another key");
        close(&mem.download(&dc).unwrap(), &want, &format!("{s:?} replayed"));
    }
    let s = GemmShape { m: 4, n: 4, k: 4, batch: 2 };
    let small = mem.alloc_zeroed::<bf16>(31).unwrap();
    let mut c = mem.alloc_zeroed::<bf16>(32).unwrap();
    let e = gpu.gemm_bf16(&s, &small, &small, &mut c).unwrap_err();
    assert!(e.to_string().contains("32"), "{e}");
}
