//! Criterion bench: the CPU swap-in step per (request, layer) at top_k 2048 with a 4096-slot
//! buffer and 13% misses per step (throughput in steps: divide the time by 200 for one step).
#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use hisparse_policy::policy::by_name;
use hisparse_policy::{StepCtx, SwapInPlan, SwapInState};
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

const K: usize = 2048;
const B: usize = 4096;
const STEPS: usize = 200;
const PROMPT: usize = 32_768;

/// A warmed-up state and `STEPS` selections that each miss 13% under LRU from that state.
fn workload() -> (SwapInState, Vec<Vec<u32>>) {
    let lru = by_name("lru", 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut st = SwapInState::new(B).unwrap();
    let mut plan = SwapInPlan::default();
    let ctx = |step: usize| StepCtx { step: step as u32, layer: 0, request: 0, device_buffer_size: B as u32, seed: 0 };
    let mut steps = Vec::new();
    let mut warm = Vec::new();
    for step in 1..=STEPS + 50 {
        let seq_len = PROMPT + step;
        let resident: Vec<u32> = st.table().slots().flatten().collect();
        let hits = if resident.len() < K { resident.len() } else { K * 87 / 100 };
        let mut sel: Vec<u32> = resident.choose_multiple(&mut rng, hits).copied().collect();
        while sel.len() < K {
            let t = rng.random_range(0..seq_len as u32 - 1);
            if st.table().slot_of(t).is_none() && !sel.contains(&t) {
                sel.push(t);
            }
        }
        sel.shuffle(&mut rng);
        sel.sort_unstable();
        st.step(lru.as_ref(), &sel, seq_len, &ctx(step), hisparse_policy::SwapInputs::default(), &mut plan).unwrap();
        if step == 50 {
            warm.push(st.clone());
        }
        if step > 50 {
            steps.push(sel);
        }
    }
    (warm.remove(0), steps)
}

fn swap_in(c: &mut Criterion) {
    let (state, steps) = workload();
    let mut g = c.benchmark_group("swap_in_step_k2048_b4096_13pct");
    g.throughput(Throughput::Elements(STEPS as u64));
    for name in ["lru", "clock", "fifo"] {
        let p = by_name(name, 0).unwrap();
        g.bench_function(name, |b| {
            b.iter_batched(
                || state.clone(),
                |mut st| {
                    let mut plan = SwapInPlan::default();
                    let mut misses = 0;
                    for (i, sel) in steps.iter().enumerate() {
                        let step = 51 + i;
                        let ctx =
                            StepCtx { step: step as u32, layer: 0, request: 0, device_buffer_size: B as u32, seed: 0 };
                        st.step(
                            p.as_ref(),
                            sel,
                            PROMPT + step,
                            &ctx,
                            hisparse_policy::SwapInputs::default(),
                            &mut plan,
                        )
                        .unwrap();
                        misses += plan.misses.len();
                    }
                    misses
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, swap_in);
criterion_main!(benches);
