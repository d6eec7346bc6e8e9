//! GPU twin of the e4m3 codec: CUDA's `__nv_fp8_e4m3` against `hisparse_memory::fp8` on random
//! and edge-case values, both directions.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use hisparse_kernels::cuda::CudaDevice;
use hisparse_memory::fp8::{decode_e4m3, encode_e4m3};
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn e4m3_encode_and_decode_match_cuda_bit_for_bit() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut xs: Vec<f32> = (0..1 << 20).map(|_| f32::from_bits(rng.random::<u32>())).collect();
    // Edge cases: every e4m3 value, its midpoints and neighbours, saturation, NaN, infinities.
    for b in 0u8..=255 {
        let v = decode_e4m3(b);
        let w = decode_e4m3(b.wrapping_add(1));
        xs.push(v);
        if v.is_finite() && w.is_finite() {
            let m = (v + w) / 2.0;
            xs.extend([m, f32::from_bits(m.to_bits() + 1), f32::from_bits(m.to_bits().wrapping_sub(1))]);
        }
    }
    xs.extend([448.0, 464.0, 465.0, -464.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-30, -1e-30]);
    for _ in 0..100_000 {
        xs.push(rng.random_range(-600.0f32..600.0));
    }
    let n = xs.len() as u32;
    let x_dev = s.clone_htod(&xs).unwrap();
    let mut codes_dev = s.alloc_zeros::<u8>(xs.len()).unwrap();
    let f = dev.function("fp8_convert", "e4m3_encode").unwrap();
    let cfg = LaunchConfig::for_num_elems(n);
    // SAFETY: buffers hold n elements; the kernel reads x[i] and writes out[i] for i < n.
    unsafe { s.launch_builder(&f).arg(&x_dev).arg(&mut codes_dev).arg(&n).launch(cfg) }.unwrap();
    let codes = s.clone_dtoh(&codes_dev).unwrap();
    let mismatches: Vec<_> = xs
        .iter()
        .zip(&codes)
        .filter(|(x, c)| encode_e4m3(**x) != **c)
        .map(|(x, c)| (*x, *c, encode_e4m3(*x)))
        .take(10)
        .collect();
    assert!(mismatches.is_empty(), "(x, cuda, ours): {mismatches:?}");

    let all: Vec<u8> = (0..=255).collect();
    let in_dev = s.clone_htod(&all).unwrap();
    let mut out_dev = s.alloc_zeros::<f32>(256).unwrap();
    let f = dev.function("fp8_convert", "e4m3_decode").unwrap();
    let n = 256u32;
    // SAFETY: both buffers hold 256 elements.
    unsafe { s.launch_builder(&f).arg(&in_dev).arg(&mut out_dev).arg(&n).launch(LaunchConfig::for_num_elems(n)) }
        .unwrap();
    let back = s.clone_dtoh(&out_dev).unwrap();
    for (b, got) in back.iter().enumerate() {
        let ours = decode_e4m3(b as u8);
        assert!(ours.to_bits() == got.to_bits() || (ours.is_nan() && got.is_nan()), "code {b:#x}: {ours} vs {got}");
    }
}
