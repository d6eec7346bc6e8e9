//! Unit tests of the built-in policies' semantics, through the CPU swap-in step.

use super::*;
use crate::swap_in::{SwapInPlan, SwapInState, SwapInputs};

/// Runs `steps` (each a selection; the sequence grows by one per step from 100) and returns the
/// plans.
fn run(policy: &dyn EvictionPolicy, slots: usize, steps: &[&[u32]]) -> (SwapInState, Vec<SwapInPlan>) {
    let mut st = SwapInState::new(slots).unwrap();
    let mut plans = Vec::new();
    for (i, sel) in steps.iter().enumerate() {
        let mut p = SwapInPlan::default();
        let ctx =
            StepCtx { step: i as u32 + 1, layer: 0, request: 9, device_buffer_size: slots as u32, seed: policy.seed() };
        st.step(policy, sel, 100 + i, &ctx, SwapInputs::default(), &mut p).unwrap();
        plans.push(p);
    }
    (st, plans)
}

#[test]
fn lru_keeps_hits_and_ranks_fresh_misses_below_them() {
    let (st, plans) = run(&Lru, 4, &[&[1, 2, 3], &[2, 4], &[5], &[6, 7]]);
    // Step 1: cold buffer, misses fill empty slots in slot order.
    assert_eq!(plans[0].misses, vec![(1, 0), (2, 1), (3, 2)]);
    // Step 2: 2 hits in slot 1; 4 takes the empty slot 3.
    assert_eq!((plans[1].hits.clone(), plans[1].misses.clone()), (vec![(2, 1)], vec![(4, 3)]));
    // Step 3: slots 0 (token 1) and 2 (token 3) were last used at step 1; slot 0 goes first.
    assert_eq!(plans[2].evictions, vec![(1, 0)]);
    // Step 4: token 3 (step 1) and token 4 (filled at step 2, ranked below step 2's hit on 2) go.
    assert_eq!(plans[3].evictions, vec![(3, 2), (4, 3)]);
    assert_eq!(plans[3].misses, vec![(6, 2), (7, 3)]);
    assert_eq!(st.table().slot_of(2), Some(1), "the hit of step 2 survives");
}

#[test]
fn fifo_ignores_hits() {
    let (_, plans) = run(&Fifo, 3, &[&[1, 2, 3], &[1], &[4]]);
    // Token 1 was filled first; a later hit does not save it.
    assert_eq!(plans[2].evictions, vec![(1, 0)]);
    let (_, plans) = run(&Lru, 3, &[&[1, 2, 3], &[1], &[4]]);
    assert_eq!(plans[2].evictions, vec![(2, 1)], "LRU keeps the hit");
}

#[test]
fn random_is_reproducible_and_seed_dependent() {
    let steps: Vec<Vec<u32>> = (0..30).map(|i| vec![i, i + 40, i + 70]).collect();
    let refs: Vec<&[u32]> = steps.iter().map(Vec::as_slice).collect();
    let victims = |seed| {
        let (_, plans) = run(&Random::new(seed), 8, &refs);
        plans.iter().flat_map(|p| p.evictions.clone()).collect::<Vec<_>>()
    };
    assert_eq!(victims(1), victims(1));
    assert_ne!(victims(1), victims(2));
    assert!(!victims(1).is_empty());
}

/// Sequential CLOCK (GCLOCK for counters above 1), one miss at a time: empties first, hits and
/// just-filled slots pinned; the hand takes one off a counter above zero and passes.
fn sequential_clock(
    refbits: &mut [u32],
    hand: &mut u32,
    occupied: &[bool],
    pinned: &[bool],
    misses: usize,
) -> Vec<u32> {
    let b = refbits.len() as u32;
    let mut taken = vec![false; refbits.len()];
    let mut victims = Vec::new();
    for s in 0..b {
        if victims.len() < misses && !occupied[s as usize] && !pinned[s as usize] {
            victims.push(s);
            taken[s as usize] = true;
        }
    }
    while victims.len() < misses {
        let s = *hand;
        *hand = (*hand + 1) % b;
        if pinned[s as usize] || taken[s as usize] {
            continue;
        }
        if refbits[s as usize] > 0 {
            refbits[s as usize] -= 1;
            continue;
        }
        victims.push(s);
        taken[s as usize] = true;
    }
    victims.sort_unstable();
    victims
}

#[test]
fn batched_clock_equals_sequential_clock() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for i in 0..1500 {
        let width = 1 + i % 3;
        let clock = Clock { clear_on_insert: false, bits: width };
        let b = rng.random_range(2..24u32);
        let occupied: Vec<bool> = (0..b).map(|_| rng.random_bool(0.9)).collect();
        let pinned: Vec<bool> = (0..b).map(|_| rng.random_bool(0.3)).collect();
        let mut refbits: Vec<u32> = (0..b).map(|_| rng.random_range(0..1u32 << width)).collect();
        let free = (0..b as usize).filter(|&s| !pinned[s]).count();
        let misses = rng.random_range(0..=free);
        let hand0 = rng.random_range(0..b);
        // Batched form.
        let ctx = StepCtx { step: 3, layer: 0, request: 0, device_buffer_size: b, seed: 0 };
        let scalars = PolicyScalars { a: hand0, b: 0 };
        let mut keys: Vec<(bool, u64, u32)> = (0..b)
            .filter(|&s| !pinned[s as usize])
            .map(|s| {
                let rec = SlotRecord { a: refbits[s as usize], b: 0 };
                (
                    occupied[s as usize],
                    if occupied[s as usize] {
                        let env = PolicyEnv { slot: s, ..PolicyEnv::of(&ctx, scalars) };
                        clock.priority(&rec, &env)
                    } else {
                        0
                    },
                    s,
                )
            })
            .collect();
        keys.sort_unstable();
        let victims = &keys[..misses];
        let v = victims.last().map_or(VictimKey::default(), |&(o, p, s)| VictimKey {
            any: true,
            occupied: o,
            priority: p,
            slot: s,
        });
        let mut batched: Vec<u32> = victims.iter().map(|k| k.2).collect();
        batched.sort_unstable();
        let mut bits = refbits.clone();
        for s in 0..b {
            let kept = occupied[s as usize] && !pinned[s as usize] && !batched.contains(&s);
            if kept {
                let mut rec = SlotRecord { a: bits[s as usize], b: 0 };
                let env = PolicyEnv { slot: s, victim: v, ..PolicyEnv::of(&ctx, scalars) };
                clock.on_keep(&mut rec, &env);
                bits[s as usize] = rec.a;
            }
        }
        let mut sc = scalars;
        clock.finish_step(&mut sc, &PolicyEnv { victim: v, ..PolicyEnv::of(&ctx, scalars) });
        // Sequential form.
        let mut hand = hand0;
        let seq = sequential_clock(&mut refbits, &mut hand, &occupied, &pinned, misses);
        assert_eq!(batched, seq, "victims, b = {b}, width = {width}");
        for s in 0..b as usize {
            if occupied[s] && !pinned[s] && !seq.contains(&(s as u32)) {
                assert_eq!(bits[s], refbits[s], "counter of kept slot {s}, width = {width}");
            }
        }
        if v.occupied {
            assert_eq!(sc.a, hand, "hand");
        }
    }
}

#[test]
fn names_and_gpu_forms() {
    for name in POLICY_NAMES {
        let p = by_name(name, 3).unwrap();
        assert_eq!(p.name(), name);
        assert_eq!(p.cuda().is_some(), name != "belady", "{name}");
        assert_eq!(p.needs_future(), name == "belady");
        if p.cuda().is_some() {
            // The program (prelude, hooks, defaults) defines every hook exactly once.
            let prog = cuda::program(p.as_ref()).unwrap();
            for hook in [
                "policy_priority(",
                "policy_on_hit(",
                "policy_on_insert(",
                "policy_on_keep(",
                "policy_on_evict(",
                "policy_finish(",
            ] {
                let defined = prog.matches(&format!("__device__ void {hook}")).count()
                    + prog.matches(&format!("__device__ unsigned long long {hook}")).count()
                    + prog.matches(&format!("__device__ unsigned {hook}")).count();
                assert!(defined >= 1, "{name} lacks {hook}");
            }
        }
    }
    // The registry: built-ins in order, a policy of one's own, a name taken refused.
    let names: Vec<&str> = registry::specs().iter().map(|s| s.name).collect();
    assert_eq!(&names[..POLICY_NAMES.len()], POLICY_NAMES);
    assert_eq!(BuiltinPolicy::ALL.map(BuiltinPolicy::name), POLICY_NAMES);
    let mine = PolicySpec {
        name: "test-mine",
        about: "LRU under another name",
        online: true,
        make: |_| std::sync::Arc::new(Lru),
    };
    register(mine).unwrap();
    assert_eq!(by_name("test-mine", 0).unwrap().name(), "lru");
    assert!(register(mine).is_err(), "a name can be registered once");
    let e = by_name("arc", 0).unwrap_err();
    assert!(e.to_string().contains("eviction_policy = arc") && e.to_string().contains("clock"), "{e}");
    assert_eq!(builtin(0).len(), POLICY_NAMES.len());
}

#[test]
fn belady_refuses_to_run_without_the_future() {
    let mut st = SwapInState::new(4).unwrap();
    let ctx = StepCtx { step: 1, layer: 0, request: 0, device_buffer_size: 4, seed: 0 };
    let e = st.step(&Belady, &[1, 2], 50, &ctx, SwapInputs::default(), &mut SwapInPlan::default()).unwrap_err();
    assert!(e.to_string().contains("simulator only"), "{e}");
}
