//! GPU twins of the eviction policies: every hook of each policy's CUDA form, run on the GPU,
//! against the policy's Rust form on random records, scalars, contexts and victim keys.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use cudarc::driver::{LaunchConfig, PushKernelArg};
use hisparse_kernels::cuda::{self, CudaDevice, GpuPolicyScalars, GpuSlotRecord, GpuStepCtx, GpuVictimKey};
use hisparse_policy::policy::builtin;
use hisparse_policy::{PolicyScalars, SlotRecord, StepCtx, VictimKey};
use rand::{Rng, SeedableRng};

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_gpu_policy_hook_matches_its_rust_form() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for policy in builtin(12345).into_iter().filter(|p| p.cuda().is_some()) {
        let name = format!("policy_{}", policy.name());
        let f = dev.function_of(&name, "policy_hooks", || cuda::policy_harness(policy.as_ref())).unwrap();
        for round in 0..20 {
            let n = 4096u32;
            let b = n;
            let clock = policy.name() == "clock";
            let recs: Vec<SlotRecord> = (0..n)
                .map(|_| SlotRecord { a: if clock { rng.random_range(0..2) } else { rng.random() }, b: rng.random() })
                .collect();
            let tokens: Vec<u32> = (0..n).map(|_| rng.random()).collect();
            let scalars = PolicyScalars { a: rng.random_range(0..b), b: rng.random() };
            let ctx = StepCtx {
                step: rng.random_range(1..1_000_000),
                layer: rng.random_range(0..80),
                request: rng.random(),
                buffer_slots: b,
                seed: policy.seed(),
            };
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
            let recs_dev = s.clone_htod(&recs.iter().map(|r| GpuSlotRecord(*r)).collect::<Vec<_>>()).unwrap();
            let tok_dev = s.clone_htod(&tokens).unwrap();
            let mut prio = s.alloc_zeros::<u64>(n as usize).unwrap();
            let mut hit = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut ins = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut keep = s.alloc_zeros::<GpuSlotRecord>(n as usize).unwrap();
            let mut fin = s.alloc_zeros::<GpuPolicyScalars>(1).unwrap();
            let (gs, gc, gv) = (GpuPolicyScalars(scalars), GpuStepCtx(ctx), GpuVictimKey(victim));
            // SAFETY: every buffer holds n elements (fin: 1); argument types match the harness.
            unsafe {
                s.launch_builder(&f)
                    .arg(&recs_dev)
                    .arg(&tok_dev)
                    .arg(&n)
                    .arg(&gs)
                    .arg(&gc)
                    .arg(&gv)
                    .arg(&mut prio)
                    .arg(&mut hit)
                    .arg(&mut ins)
                    .arg(&mut keep)
                    .arg(&mut fin)
                    .launch(LaunchConfig::for_num_elems(n))
            }
            .unwrap();
            let (prio, hit, ins, keep, fin) = (
                s.clone_dtoh(&prio).unwrap(),
                s.clone_dtoh(&hit).unwrap(),
                s.clone_dtoh(&ins).unwrap(),
                s.clone_dtoh(&keep).unwrap(),
                s.clone_dtoh(&fin).unwrap(),
            );
            for i in 0..n as usize {
                let p = policy.priority(&recs[i], i as u32, tokens[i], &scalars, &ctx, u32::MAX);
                assert_eq!(prio[i], p, "{name} priority of slot {i}");
                let mut r = recs[i];
                policy.on_hit(&mut r, &ctx);
                assert_eq!(hit[i].0, r, "{name} on_hit of slot {i}");
                let mut r = recs[i];
                policy.on_insert(&mut r, &ctx);
                assert_eq!(ins[i].0, r, "{name} on_insert of slot {i}");
                let mut r = recs[i];
                policy.on_keep(&mut r, i as u32, &scalars, &victim, &ctx);
                assert_eq!(keep[i].0, r, "{name} on_keep of slot {i}");
            }
            let mut sc = scalars;
            policy.finish_step(&mut sc, &victim, &ctx);
            assert_eq!(fin[0].0, sc, "{name} finish_step");
        }
    }
}
