//! GPU twins of the eviction policies: every hook of each policy's CUDA form (its program: the
//! prelude, its `.cuh`, the defaults), run on the GPU, against the policy's Rust form on random
//! records and random environments (scores, some NaN; prefetched flags; token words; victims).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use hisparse_kernels::cuda::{self, CudaDevice, GpuPolicyEnv, GpuPolicyScalars, GpuSlotRecord};
use hisparse_policy::policy::registered;
use hisparse_policy::{PolicyEnv, PolicyScalars, SlotRecord, StepCtx, VictimKey};
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gpu_policy_hook_matches_its_rust_form() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut checked = 0;
    for policy in registered(12345).into_iter().filter(|p| p.cuda().is_some()) {
        let src = cuda::policy_harness(policy.as_ref()).unwrap();
        let name = src.name.clone();
        let f = dev.function_of(&name, "policy_hooks", || Some(src)).unwrap();
        let clock = policy.name().starts_with("clock");
        for round in 0..20 {
            let n = 4096u32;
            let b = n;
            let recs: Vec<SlotRecord> = (0..n)
                .map(|_| SlotRecord { a: if clock { rng.random_range(0..2) } else { rng.random() }, b: rng.random() })
                .collect();
            let ctx = StepCtx {
                step: rng.random_range(1..1_000_000),
                layer: rng.random_range(0..80),
                request: rng.random(),
                device_buffer_size: b,
                seed: policy.seed(),
            };
            let scalars = PolicyScalars { a: rng.random_range(0..b), b: rng.random() };
            let victim = VictimKey {
                any: round % 5 != 0,
                occupied: round % 3 != 0,
                priority: if clock {
                    u64::from(rng.random_range(0..2u32)) << 32 | u64::from(rng.random_range(0..b))
                } else {
                    rng.random()
                },
                slot: rng.random_range(0..b),
            };
            let envs: Vec<PolicyEnv> = (0..n)
                .map(|i| PolicyEnv {
                    ctx,
                    scalars,
                    victim,
                    slot: i,
                    token: rng.random(),
                    next_use: u32::MAX,
                    score: if rng.random_bool(0.1) { f32::NAN } else { rng.random_range(-10.0..10.0) },
                    prefetched: u32::from(rng.random_bool(0.3)),
                    token_word: if rng.random_bool(0.5) { 0 } else { rng.random_range(0..ctx.step) },
                })
                .collect();
            let recs_dev = s.clone_htod(&recs.iter().map(|r| GpuSlotRecord(*r)).collect::<Vec<_>>()).unwrap();
            let envs_dev = s.clone_htod(&envs.iter().map(|e| GpuPolicyEnv(*e)).collect::<Vec<_>>()).unwrap();
            let mut prio = s.alloc_zeros::<u64>(n as usize).unwrap();
            let mut hit = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut ins = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut keep = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut word = s.alloc_zeros::<u32>(n as usize).unwrap();
            let mut fin = s.alloc_zeros::<GpuPolicyScalars>(1).unwrap();
            // SAFETY: every buffer holds n elements (fin: 1); argument types match the harness.
            unsafe {
                s.launch_builder(&f)
                    .arg(&recs_dev)
                    .arg(&envs_dev)
                    .arg(&n)
                    .arg(&mut prio)
                    .arg(&mut hit)
                    .arg(&mut ins)
                    .arg(&mut keep)
                    .arg(&mut word)
                    .arg(&mut fin)
                    .launch(LaunchConfig::for_num_elems(n))
            }
            .unwrap();
            let (prio, hit, ins, keep, word, fin) = (
                s.clone_dtoh(&prio).unwrap(),
                s.clone_dtoh(&hit).unwrap(),
                s.clone_dtoh(&ins).unwrap(),
                s.clone_dtoh(&keep).unwrap(),
                s.clone_dtoh(&word).unwrap(),
                s.clone_dtoh(&fin).unwrap(),
            );
            let what = policy.name();
            for i in 0..n as usize {
                let e = &envs[i];
                assert_eq!(prio[i], policy.priority(&recs[i], e), "{what} priority of slot {i}");
                let mut r = recs[i];
                policy.on_hit(&mut r, e);
                assert_eq!(hit[i].0, r, "{what} on_hit of slot {i}");
                let mut r = recs[i];
                policy.on_insert(&mut r, e);
                assert_eq!(ins[i].0, r, "{what} on_insert of slot {i}");
                let mut r = recs[i];
                policy.on_keep(&mut r, e);
                assert_eq!(keep[i].0, r, "{what} on_keep of slot {i}");
                assert_eq!(word[i], policy.on_evict(&recs[i], e), "{what} on_evict of slot {i}");
            }
            let mut sc = scalars;
            policy.finish_step(&mut sc, &envs[0]);
            assert_eq!(fin[0].0, sc, "{what} finish_step");
        }
        checked += 1;
    }
    assert!(checked >= 5, "{checked} GPU policies checked");
}
