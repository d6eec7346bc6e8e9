//! The warpgroup MMA probes (`kernels/wgmma_probe.cu`) against their CPU twin, a plain product of
//! the same bf16 matrices: both operands K-major in shared memory (S = Q K^T), A in registers
//! with B MN-major (O = P V), and A and a 256-column MN-major B both in shared memory (O = P V
//! for the second warpgroup), each unswizzled and with the 128-byte swizzle — the shared-memory
//! descriptor encodings that the wgmma sparse MLA decode builds on, checked before that kernel
//! relies on them.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;
use hisparse_kernels::cuda::CudaDevice;
use hisparse_kernels::random;

/// D = A . B^T for A of 64 rows and B of `n` rows, both of `k` columns, in f64 of the bf16
/// values, and each entry's sum of magnitudes (the bound of fp32 accumulation's error).
fn product(a: &[bf16], b: &[bf16], k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut d = vec![0f64; 64 * n];
    let mut mag = vec![0f64; 64 * n];
    for r in 0..64 {
        for c in 0..n {
            for j in 0..k {
                let p = f64::from(a[r * k + j].to_f32()) * f64::from(b[c * k + j].to_f32());
                d[r * n + c] += p;
                mag[r * n + c] += p.abs();
            }
        }
    }
    (d, mag)
}

/// `b` ([n][k]) transposed: [k][n].
fn transposed(b: &[bf16], k: usize, n: usize) -> Vec<bf16> {
    (0..k * n).map(|e| b[(e % n) * k + e / n]).collect()
}

/// A probe layout, as the kernel's `ProbeLayout`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Layout {
    step_o: u32,
    step_i: u32,
    lbo: u32,
    sbo: u32,
    swizzle: u32,
}

// SAFETY: #[repr(C)] struct of plain numbers, laid out as the kernel's `ProbeLayout`.
unsafe impl cudarc::driver::DeviceRepr for Layout {}

impl Layout {
    /// The same placement with the descriptor's two offsets exchanged.
    fn swapped(self) -> Self {
        Self { lbo: self.sbo, sbo: self.lbo, ..self }
    }
}

/// Runs `kernel` of the probe module on `a` and `b` (B as [N][K] for `ss`, [K][N] for the
/// others; N = 256 for `ss_t256`, else 64).
fn probe(dev: &CudaDevice, kernel: &str, a: &[bf16], b: &[bf16], k: usize, la: Layout, lb: Layout) -> Vec<f32> {
    let n = if kernel == "wgmma_probe_ss_t256" { 256 } else { 64 };
    let s = dev.stream();
    let (ad, bd) = (s.clone_htod(a).unwrap(), s.clone_htod(b).unwrap());
    let mut dd = s.alloc_zeros::<f32>(64 * n).unwrap();
    let f = dev.function("wgmma_probe", kernel).unwrap();
    // The operands need (64 + n) * k * 2 bytes; every probe gets the most a block may have, so
    // that a launch with the offsets swapped (the test's second try) reads inside the block's
    // shared memory however far the wrong offsets reach (both offsets at most 4096 B, stepped
    // at most 31 and 15 times: under 190 KB past B's start, 206 KB with A's share, at k = 128).
    let smem = MAX_SHARED.max(((64 + n) * k * 2) as u32);
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .unwrap();
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem };
    let ku = k as u32;
    let mut l = s.launch_builder(&f);
    l.arg(&ad).arg(&bd).arg(&mut dd).arg(&ku);
    if kernel != "wgmma_probe_rs" {
        l.arg(&la);
    }
    l.arg(&lb);
    // SAFETY: a holds 64 x k bf16, b n x k and d 64 x n f32; the layouts (`layout` below) place
    // every element of an operand inside its share (64 * k * 2 and n * k * 2 bytes) of the
    // shared memory asked for; wgmma's reads under wrong offsets stay inside the block's
    // MAX_SHARED bytes (see above).
    unsafe { l.launch(cfg) }.unwrap();
    s.clone_dtoh(&dd).unwrap()
}

/// The dynamic shared memory one block may have on sm_90 (227 KB).
const MAX_SHARED: u32 = 232_448;

fn agrees(got: &[f32], want: &[f64], mag: &[f64]) -> Result<(), String> {
    for (i, ((g, w), m)) in got.iter().zip(want).zip(mag).enumerate() {
        if (f64::from(*g) - w).abs() > 1e-5 * m + 1e-30 {
            return Err(format!("D entry {i}: gpu {g} vs cpu {w}"));
        }
    }
    Ok(())
}

/// The placements and descriptor offsets PTX's documentation gives, for an operand of `outer`
/// rows of `inner` contiguous values: unswizzled, core matrices 16 B x 8 rows with those along the
/// contiguous index adjacent (128 B apart) and the next 8 rows `inner * 16` B on; with the
/// 128-byte swizzle, 8-row atoms 1024 B apart and 64-value column blocks `outer * 128` B apart.
/// K-major (`mn_major` false, the canonical `((8,m),(T,2k))`): leading offset = the step along
/// K, stride offset = the step between 8-row groups. MN-major (`mn_major`, rows along K): with
/// the swizzle (`((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))`) the leading offset is the step between
/// 64-value blocks along MN and the stride offset the step between 8-row groups along K;
/// unswizzled (`((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))`) the two exchange roles: the stride
/// offset steps between 8-value blocks along MN, the leading offset between 8-row groups along K.
fn layout(outer: usize, inner: usize, swizzle: bool, mn_major: bool) -> Layout {
    let (outer, inner) = (outer as u32, inner as u32);
    match (swizzle, mn_major) {
        (true, _) => Layout { step_o: 1024, step_i: outer * 128, lbo: outer * 128, sbo: 1024, swizzle: 1 },
        (false, false) => Layout { step_o: inner * 16, step_i: 128, lbo: 128, sbo: inner * 16, swizzle: 0 },
        (false, true) => Layout { step_o: inner * 16, step_i: 128, lbo: inner * 16, sbo: 128, swizzle: 0 },
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn wgmma_on_shared_memory_operands_multiplies_like_the_cpu() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let mut rng = random::rng(21);
    let mut failures = Vec::new();
    for swizzle in [false, true] {
        for k in [64usize, 128] {
            let a = random::normal_bf16(&mut rng, 64 * k, 1.0);
            let b = random::normal_bf16(&mut rng, 64 * k, 1.0);
            let (want, mag) = product(&a, &b, k, 64);
            assert!(want.iter().any(|x| x.abs() > 1.0), "the product is not trivial");
            // S = Q K^T: both K-major, B given as [N][K].
            let (la, lb) = (layout(64, k, swizzle, false), layout(64, k, swizzle, false));
            let ss = |la: Layout, lb: Layout| agrees(&probe(&dev, "wgmma_probe_ss", &a, &b, k, la, lb), &want, &mag);
            if let Err(e) = ss(la, lb) {
                let other = ss(la.swapped(), lb.swapped());
                failures.push(format!("ss, swizzle {swizzle}, k {k}: {e}; offsets swapped: {other:?}"));
            }
            // O = P V: A from registers, B MN-major, given as [K][N] (B^T of the same product).
            let bt = transposed(&b, k, 64);
            let lt = layout(k, 64, swizzle, true);
            let rs = |lt: Layout| agrees(&probe(&dev, "wgmma_probe_rs", &a, &bt, k, lt, lt), &want, &mag);
            if let Err(e) = rs(lt) {
                let other = rs(lt.swapped());
                failures.push(format!("rs, swizzle {swizzle}, k {k}: {e}; offsets swapped: {other:?}"));
            }
            // The same with 256 columns of B in shared memory (four swizzle atoms along N: the
            // leading offset is used).
            let b256 = random::normal_bf16(&mut rng, 256 * k, 1.0);
            let (want, mag) = product(&a, &b256, k, 256);
            let bt = transposed(&b256, k, 256);
            let lt = layout(k, 256, swizzle, true);
            let t256 = |lt: Layout| agrees(&probe(&dev, "wgmma_probe_ss_t256", &a, &bt, k, la, lt), &want, &mag);
            if let Err(e) = t256(lt) {
                let other = t256(lt.swapped());
                failures.push(format!("ss_t256, swizzle {swizzle}, k {k}: {e}; B's offsets swapped: {other:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
