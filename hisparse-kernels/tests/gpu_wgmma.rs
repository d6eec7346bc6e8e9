//! The warpgroup MMA probe (`kernels/wgmma_probe.cu`) against its CPU twin, a plain product of
//! the same bf16 matrices: the unswizzled shared-memory descriptor encoding that the wgmma
//! sparse MLA decode builds on, checked before that kernel relies on it.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;
use hisparse_kernels::cuda::CudaDevice;
use hisparse_kernels::random;

/// D = A . B^T for A and B of 64 rows and `k` columns, in f64 of the bf16 values, and each
/// entry's sum of magnitudes (the bound of fp32 accumulation's error).
fn product(a: &[bf16], b: &[bf16], k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut d = vec![0f64; 64 * 64];
    let mut mag = vec![0f64; 64 * 64];
    for r in 0..64 {
        for c in 0..64 {
            for j in 0..k {
                let p = f64::from(a[r * k + j].to_f32()) * f64::from(b[c * k + j].to_f32());
                d[r * 64 + c] += p;
                mag[r * 64 + c] += p.abs();
            }
        }
    }
    (d, mag)
}

/// The probe's D for the placement (`k_step`, `m_step`) and descriptor offsets (`lbo`, `sbo`).
fn probe(dev: &CudaDevice, a: &[bf16], b: &[bf16], k: usize, steps: (u32, u32), offsets: (u32, u32)) -> Vec<f32> {
    let s = dev.stream();
    let (ad, bd) = (s.clone_htod(a).unwrap(), s.clone_htod(b).unwrap());
    let mut dd = s.alloc_zeros::<f32>(64 * 64).unwrap();
    let f = dev.function("wgmma_probe", "wgmma_bf16_probe").unwrap();
    let smem = (2 * 64 * k * 2) as u32;
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .unwrap();
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem };
    let ku = k as u32;
    // SAFETY: a and b hold 64 x k bf16, d 64 x 64 f32; the steps place every core matrix of 64
    // rows and k columns inside the 64 * k * 2 bytes of its operand's shared memory (asserted by
    // the callers' choice of steps: the documented placement and its transpose).
    unsafe {
        s.launch_builder(&f)
            .arg(&ad)
            .arg(&bd)
            .arg(&mut dd)
            .arg(&ku)
            .arg(&steps.0)
            .arg(&steps.1)
            .arg(&offsets.0)
            .arg(&offsets.1)
            .launch(cfg)
    }
    .unwrap();
    s.clone_dtoh(&dd).unwrap()
}

fn agrees(got: &[f32], want: &[f64], mag: &[f64]) -> Result<(), String> {
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        if (f64::from(*g) - w).abs() > 1e-5 * m + 1e-30 {
            return Err(format!("D[{}][{}]: gpu {g} vs cpu {w}", i / 64, i % 64));
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wgmma_on_unswizzled_shared_memory_multiplies_like_the_cpu() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let mut rng = random::rng(21);
    for k in [16usize, 64, 128] {
        let a = random::normal_bf16(&mut rng, 64 * k, 1.0);
        let b = random::normal_bf16(&mut rng, 64 * k, 1.0);
        let (want, mag) = product(&a, &b, k);
        assert!(want.iter().any(|x| x.abs() > 1.0), "the product is not trivial");
        // Core matrices K-adjacent 128 B apart, M-adjacent k * 16 B apart; PTX: the leading
        // offset is the step along K, the stride offset the step along M or N.
        let (ks, ms) = (128u32, (k * 16) as u32);
        let documented = agrees(&probe(&dev, &a, &b, k, (ks, ms), (ks, ms)), &want, &mag);
        if let Err(e) = documented {
            // Name what does work, for whoever writes the next kernel on it.
            let swapped = agrees(&probe(&dev, &a, &b, k, (ks, ms), (ms, ks)), &want, &mag);
            panic!("k = {k}: the documented encoding fails ({e}); offsets swapped: {swapped:?}");
        }
    }
}
