//! The GPU swap-in against the CPU swap-in (`SwapInState::step`), for every policy with a GPU
//! form, over random multi-step traces of a batch of requests of different lengths (fast path,
//! the crossing into policy management, cold buffers): the same hits, misses, slots, evictions
//! and locations every step, the same slot tables, records and scalars at the end, and every
//! resident slot holding its token's row byte for byte, read from the mapped host tier.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::Arc;

use hisparse_kernels::cuda::{CudaDevice, GpuSwapIn, SwapOutputs, SwapReq};
use hisparse_memory::{HostTier, HostTierConfig, RequestId};
use hisparse_policy::policy::builtin;
use hisparse_policy::{StepCtx, SwapInPlan, SwapInState};
use rand::{Rng, SeedableRng};

const B: usize = 256;
const K: usize = 96;
const LAYERS: usize = 2;
const ROW: usize = 656;
const PAGE: usize = 16;
const STEPS: usize = 40;

fn row_of(req: usize, layer: usize, pos: usize) -> Vec<u8> {
    (0..ROW).map(|i| (i as u32 * 7 + pos as u32 * 131 + layer as u32 * 17 + req as u32 * 29) as u8).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_swap_in_matches_the_cpu_swap_in_for_every_gpu_policy() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream().clone();
    let prompts = [100usize, 250, 600, 1500];
    let mut host = HostTier::new(&HostTierConfig {
        bytes: 64 << 20,
        layers: LAYERS,
        row_bytes: ROW,
        page_tokens: PAGE,
        path: None,
    })
    .unwrap();
    for (r, &p) in prompts.iter().enumerate() {
        host.register(RequestId(r as u64)).unwrap();
        host.grow(RequestId(r as u64), p + STEPS + 1).unwrap();
        for l in 0..LAYERS {
            for t in 0..p + STEPS + 1 {
                host.write_row(RequestId(r as u64), l, t, &row_of(r, l, t)).unwrap();
            }
        }
    }
    let host_base = host.register_cuda(dev.context()).unwrap();
    let pages: Vec<u32> = (0..prompts.len()).flat_map(|r| host.pages(RequestId(r as u64)).unwrap().to_vec()).collect();
    let page_offsets: Vec<u32> = (0..prompts.len())
        .scan(0u32, |acc, r| {
            let here = *acc;
            *acc += host.pages(RequestId(r as u64)).unwrap().len() as u32;
            Some(here)
        })
        .collect();
    let pages_d = s.clone_htod(&pages).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for policy in builtin(77).into_iter().filter(|p| p.cuda().is_some()) {
        let mut gpu = GpuSwapIn::new(&dev, Arc::clone(&policy), prompts.len(), LAYERS, B, 128, K + 1).unwrap();
        let mut cpu: Vec<Vec<SwapInState>> =
            prompts.iter().map(|_| (0..LAYERS).map(|_| SwapInState::new(B).unwrap()).collect()).collect();
        let mut hot: Vec<_> =
            (0..LAYERS).map(|_| s.alloc_zeros::<u8>(prompts.len() * (B + 1) * ROW).unwrap()).collect();
        for (r, &p) in prompts.iter().enumerate() {
            let preload = if p < B { p } else { 0 };
            gpu.reset_seat(r, preload).unwrap();
            for l in 0..LAYERS {
                if preload > 0 {
                    cpu[r][l].preload(preload).unwrap();
                    for t in 0..preload {
                        s.memcpy_htod(
                            &row_of(r, l, t),
                            &mut hot[l].slice_mut((r * (B + 1) + t) * ROW..(r * (B + 1) + t + 1) * ROW),
                        )
                        .unwrap();
                    }
                }
            }
        }
        for step in 1..=STEPS {
            for l in 0..LAYERS {
                let mut reqs = Vec::new();
                let mut sels: Vec<u32> = Vec::new();
                let mut plans = Vec::new();
                for (r, &p) in prompts.iter().enumerate() {
                    let seq_len = p + step;
                    let newest = seq_len - 1;
                    // The engine writes the newest row into its slot (fast path) or the reserved slot.
                    let slot = if seq_len <= B { newest } else { B };
                    s.memcpy_htod(
                        &row_of(r, l, newest),
                        &mut hot[l].slice_mut((r * (B + 1) + slot) * ROW..(r * (B + 1) + slot + 1) * ROW),
                    )
                    .unwrap();
                    // A hot set that drifts, plus random positions, plus the newest half the time.
                    let mut sel: Vec<u32> = (0..K)
                        .map(|_| {
                            if rng.random_bool(0.7) {
                                ((step * 3 + rng.random_range(0..150)) % seq_len) as u32
                            } else {
                                rng.random_range(0..seq_len as u32)
                            }
                        })
                        .collect();
                    if rng.random_bool(0.5) {
                        sel.push(newest as u32);
                    }
                    sel.sort_unstable();
                    sel.dedup();
                    sel.truncate(K);
                    let ctx = StepCtx {
                        step: step as u32,
                        layer: l as u32,
                        request: r as u64 + 1000,
                        buffer_slots: B as u32,
                        seed: policy.seed(),
                    };
                    let mut plan = SwapInPlan::default();
                    cpu[r][l].step(policy.as_ref(), &sel, seq_len, &ctx, None, &mut plan).unwrap();
                    plans.push(plan);
                    reqs.push(SwapReq {
                        seat: r as u32,
                        seq_len: seq_len as u32,
                        step: step as u32,
                        sel_offset: sels.len() as u32,
                        sel_len: sel.len() as u32,
                        page_offset: page_offsets[r],
                        request: r as u64 + 1000,
                    });
                    sels.extend(sel);
                }
                let sels_d = s.clone_htod(&sels).unwrap();
                let mut out = SwapOutputs::new(&s, reqs.len(), sels.len()).unwrap();
                let reqs_d = gpu.upload_requests(&reqs).unwrap();
                gpu.launch(
                    l,
                    &reqs,
                    &reqs_d,
                    &sels_d.as_view(),
                    &pages_d,
                    (host_base, host.total_pages(), ROW, PAGE),
                    &mut hot[l],
                    &mut out,
                )
                .unwrap();
                let (locs, counts) = (s.clone_dtoh(&out.locations).unwrap(), s.clone_dtoh(&out.counts).unwrap());
                let (mt, ms, ev) = (
                    s.clone_dtoh(&out.miss_tokens).unwrap(),
                    s.clone_dtoh(&out.miss_slots).unwrap(),
                    s.clone_dtoh(&out.evicted).unwrap(),
                );
                for (r, (req, plan)) in reqs.iter().zip(&plans).enumerate() {
                    let what = format!("{} step {step} layer {l} request {r}", policy.name());
                    let (o, n) = (req.sel_offset as usize, req.sel_len as usize);
                    assert_eq!(
                        counts[3 * r..3 * r + 3],
                        [plan.hits.len() as u32, plan.misses.len() as u32, plan.evictions.len() as u32],
                        "{what}: counts"
                    );
                    let base = (r * (B + 1)) as i32;
                    let gpu_locs: Vec<u32> = locs[o..o + n].iter().map(|&x| (x - base) as u32).collect();
                    assert_eq!(gpu_locs, plan.locations, "{what}: locations");
                    if !plan.fast_path {
                        let m = plan.misses.len();
                        let gm: Vec<(u32, u32)> = (0..m).map(|i| (mt[o + i], ms[o + i])).collect();
                        assert_eq!(gm, plan.misses, "{what}: misses");
                        let ge: Vec<(u32, u32)> =
                            (0..m).filter(|&i| ev[o + i] >= 0).map(|i| (ev[o + i] as u32, ms[o + i])).collect();
                        assert_eq!(ge, plan.evictions, "{what}: evictions");
                    }
                }
            }
        }
        // Final state and rows.
        for (r, &p) in prompts.iter().enumerate() {
            for l in 0..LAYERS {
                let (tokens, records, scalars) = gpu.read_state(r, l).unwrap();
                let c = &cpu[r][l];
                let want: Vec<i32> = c.table().slots().map(|t| t.map_or(-1, |t| t as i32)).collect();
                assert_eq!(tokens, want, "{} request {r} layer {l}: slot tables", policy.name());
                if p + STEPS > B {
                    assert_eq!(records, c.records(), "{} request {r} layer {l}: records", policy.name());
                    assert_eq!(scalars, c.scalars(), "{} request {r} layer {l}: scalars", policy.name());
                }
                let rows = s.clone_dtoh(&hot[l]).unwrap();
                for (slot, t) in tokens.iter().enumerate() {
                    if *t >= 0 {
                        let at = (r * (B + 1) + slot) * ROW;
                        assert_eq!(
                            &rows[at..at + ROW],
                            row_of(r, l, *t as usize).as_slice(),
                            "{} request {r} layer {l} slot {slot}: row",
                            policy.name()
                        );
                    }
                }
            }
        }
        eprintln!(
            "{}: {} steps x {} layers x {} requests match the CPU swap-in",
            policy.name(),
            STEPS,
            LAYERS,
            prompts.len()
        );
    }
}
