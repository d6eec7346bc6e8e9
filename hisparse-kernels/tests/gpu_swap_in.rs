//! The GPU swap-in against the CPU swap-in (`SwapInState::step`), for every policy with a GPU
//! form, over random multi-step traces of a batch of requests of different lengths (fast path,
//! the crossing into policy management, cold buffers): the same hits, misses, slots, evictions
//! and locations every step, the same slot tables, records and scalars at the end, and every
//! resident slot holding its token's row byte for byte, read from the mapped host tier. Once at
//! a small size and once at the production size (top_k 2048, 4096 slots, blocks of 512 threads,
//! 32 requests, 20 steps), each as one launch (decisions and copies fused) and as two; and the
//! kernels' range checks (fault flag) on hostile selections, in both forms.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::sync::Arc;

use hisparse_kernels::cuda::{
    CopyEngineStaging, CudaDevice, GpuSwapInState, GpuSwapInStateShape, LayerLaunch, LocateTargets, MissSource,
    Selections, SwapOutputs, SwapReq, SwapTargets,
};
use hisparse_kernels::{HotLocation, SWAP_COUNTS, locate_in_hot};
use hisparse_memory::{HostTier, HostTierConfig, RequestId};
use hisparse_policy::policy::registered;
use hisparse_policy::{StepCtx, SwapInPlan, SwapInState, SwapInputs};
use rand::{Rng, SeedableRng};

const ROW: usize = 656;
const PAGE: usize = 16;

/// One comparison's sizes.
struct Sizes {
    slots: usize,
    top_k: usize,
    block: usize,
    layers: usize,
    steps: usize,
    /// Width of the drifting window most selected positions come from.
    window: usize,
    prompts: Vec<usize>,
}

fn row_of(req: usize, layer: usize, pos: usize) -> Vec<u8> {
    (0..ROW).map(|i| (i as u32 * 7 + pos as u32 * 131 + layer as u32 * 17 + req as u32 * 29) as u8).collect()
}

/// A selection: mostly from a window that drifts with the step, some anywhere, the newest half
/// the time; strictly ascending, at most `k`.
fn selection(rng: &mut impl Rng, z: &Sizes, step: usize, seq_len: usize) -> Vec<u32> {
    let k = z.top_k.min(seq_len);
    let mut set = BTreeSet::new();
    if rng.random_bool(0.5) {
        set.insert((seq_len - 1) as u32);
    }
    while set.len() < k {
        let t = if rng.random_bool(0.8) {
            (step * z.window / 20 + rng.random_range(0..z.window)) % seq_len
        } else {
            rng.random_range(0..seq_len)
        };
        set.insert(t as u32);
    }
    set.into_iter().collect()
}

fn compare(z: &Sizes, seed: u64) {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream().clone();
    let (b, k, layers, steps) = (z.slots, z.top_k, z.layers, z.steps);
    let longest = z.prompts.iter().max().unwrap() + steps + 1;
    let mut host = HostTier::new(&HostTierConfig {
        bytes: (z.prompts.len() * (longest + PAGE) * ROW * layers).next_power_of_two(),
        layers,
        row_bytes: ROW,
        page_tokens: PAGE,
        file: None,
    })
    .unwrap();
    for (r, &p) in z.prompts.iter().enumerate() {
        host.register(RequestId(r as u64)).unwrap();
        host.grow(RequestId(r as u64), p + steps + 1).unwrap();
        for l in 0..layers {
            let rows: Vec<u8> = (0..p + steps + 1).flat_map(|t| row_of(r, l, t)).collect();
            host.write_rows(RequestId(r as u64), l, 0, &rows).unwrap();
        }
    }
    let mapped = host.register_cuda(dev.context()).unwrap();
    let n = z.prompts.len();
    let pages: Vec<u32> = (0..n).flat_map(|r| host.pages(RequestId(r as u64)).unwrap().to_vec()).collect();
    let page_offsets: Vec<u32> = (0..n)
        .scan(0u32, |acc, r| {
            let here = *acc;
            *acc += host.pages(RequestId(r as u64)).unwrap().len() as u32;
            Some(here)
        })
        .collect();
    let pages_d = s.clone_htod(&pages).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Every policy, as one launch (decisions and copies fused), as two, and deciding only (the
    // misses' host rows left for the attention: `fill`).
    let policies = registered(77).into_iter().filter(|p| p.cuda().is_some());
    let forms = |p: Arc<dyn hisparse_policy::EvictionPolicy>| {
        [(Arc::clone(&p), usize::MAX, false), (Arc::clone(&p), 0, false), (p, usize::MAX, true)]
    };
    let pages_per_layer = mapped.layout().pages_per_layer;
    for (policy, fused_max, fill) in policies.flat_map(forms) {
        let mut gpu =
            GpuSwapInState::new(&dev, Arc::clone(&policy), shape(n, layers, b, z.block, k + 1, longest + 1)).unwrap();
        gpu.set_fused_max(fused_max);
        gpu.set_fill_in_attention(fill);
        let mut cpu: Vec<Vec<SwapInState>> =
            z.prompts.iter().map(|_| (0..layers).map(|_| SwapInState::new(b).unwrap()).collect()).collect();
        let mut hot: Vec<_> = (0..layers).map(|_| s.alloc_zeros::<u8>(n * (b + 1) * ROW).unwrap()).collect();
        for (r, &p) in z.prompts.iter().enumerate() {
            let preload = if p < b { p } else { 0 };
            gpu.reset_seat(r, preload).unwrap();
            for (l, hot_l) in hot.iter_mut().enumerate() {
                if preload > 0 {
                    cpu[r][l].preload(preload).unwrap();
                    let rows: Vec<u8> = (0..preload).flat_map(|t| row_of(r, l, t)).collect();
                    s.memcpy_htod(&rows, &mut hot_l.slice_mut(r * (b + 1) * ROW..(r * (b + 1) + preload) * ROW))
                        .unwrap();
                }
            }
        }
        let mut batch = None;
        for step in 1..=steps {
            for (l, hot_l) in hot.iter_mut().enumerate() {
                let mut reqs = Vec::new();
                let mut sels: Vec<u32> = Vec::new();
                let mut scores: Vec<f32> = Vec::new();
                let mut plans = Vec::new();
                let mut twins = Vec::new();
                for (r, &p) in z.prompts.iter().enumerate() {
                    let seq_len = p + step;
                    let newest = seq_len - 1;
                    // The engine writes the newest row into its slot (fast path) or the reserved slot.
                    let slot = if seq_len <= b { newest } else { b };
                    s.memcpy_htod(
                        &row_of(r, l, newest),
                        &mut hot_l.slice_mut((r * (b + 1) + slot) * ROW..(r * (b + 1) + slot + 1) * ROW),
                    )
                    .unwrap();
                    let sel = selection(&mut rng, z, step, seq_len);
                    let ctx = StepCtx {
                        step: step as u32,
                        layer: l as u32,
                        request: r as u64 + 1000,
                        device_buffer_size: b as u32,
                        seed: policy.seed(),
                    };
                    // Scores of every position (some unknown), for policies that read them.
                    let score_offset = scores.len();
                    scores.extend(
                        (0..seq_len)
                            .map(|_| if rng.random_bool(0.05) { f32::NAN } else { rng.random_range(-4.0..4.0f32) }),
                    );
                    // Where each selected token is before the step decides (the deferred swap-in's
                    // locate), from the CPU's table, which equals the GPU's.
                    let table: Vec<i32> = cpu[r][l].table().slots().map(|t| t.map_or(-1, |t| t as i32)).collect();
                    twins.push(locate_in_hot(&table, &sel, seq_len).unwrap());
                    let mut plan = SwapInPlan::default();
                    let inputs = SwapInputs { next_use: None, scores: Some(&scores[score_offset..]) };
                    cpu[r][l].step(policy.as_ref(), &sel, seq_len, &ctx, inputs, &mut plan).unwrap();
                    plans.push(plan);
                    reqs.push(SwapReq {
                        seat: r as u32,
                        seq_len: seq_len as u32,
                        step: step as u32,
                        sel_offset: sels.len() as u32,
                        sel_len: sel.len() as u32,
                        page_offset: page_offsets[r],
                        score_offset: score_offset as u32,
                        prefetch_budget: 0,
                        request: r as u64 + 1000,
                    });
                    sels.extend(sel);
                }
                let sels_d = s.clone_htod(&sels).unwrap();
                let scores_d = s.clone_htod(&scores).unwrap();
                let mut out = SwapOutputs::new(&s, reqs.len(), sels.len()).unwrap();
                // The batch is updated in place from the second launch on (as the engine does).
                let bt = match batch.as_mut() {
                    None => batch.insert(gpu.upload_requests(&reqs).unwrap()),
                    Some(bt) => {
                        gpu.update_requests(bt, &reqs).unwrap();
                        bt
                    }
                };
                // The locate first (it changes nothing): the CPU twin's answer, in the kernel's
                // words, and the selection copied; then gathering the misses into staging rows
                // (`deferred-gather`): each at its selection index, its fill word naming it; and
                // the same rows through the host and the copy engine (`copy-engine`), with
                // landing rows for every miss and with 64 (the rest read by the scatter).
                for (gather, share) in [(false, None), (true, None), (true, Some(1.0)), (true, Some(1e-6))] {
                    let (mut loc_l, mut fill_l) =
                        (s.alloc_zeros::<i32>(sels.len()).unwrap(), s.alloc_zeros(sels.len()).unwrap());
                    let mut copy = s.alloc_zeros::<u32>(sels.len()).unwrap();
                    let mut staging = s.alloc_zeros::<u8>(sels.len() * ROW).unwrap();
                    let mut staging_view = staging.as_view_mut();
                    let located = LocateTargets {
                        locations: &mut loc_l,
                        fills: &mut fill_l,
                        sel_copy: &mut copy.as_view_mut(),
                        staging: (gather && share.is_none()).then_some(&mut staging_view),
                    };
                    let at = LayerLaunch { stream: &s, layer: l, batch: bt };
                    let src = MissSource { pages: &pages_d, host: &mapped };
                    gpu.locate(at, &sels_d.as_view(), src, located).unwrap();
                    if let Some(share) = share {
                        let mut ce = CopyEngineStaging::new(&s, &mapped, share, 3).unwrap();
                        ce.reserve(&s, reqs.len(), sels.len()).unwrap();
                        ce.stage(&mut gpu, at, src, &mut fill_l, &mut staging_view).unwrap();
                        s.synchronize().unwrap();
                        assert!(!ce.take_fault(), "copy-engine host gather fault");
                        let misses = twins.iter().flatten().filter(|w| matches!(w, HotLocation::Host)).count();
                        let (landed, overflow) = ce.take_rows();
                        assert_eq!(landed + overflow, misses as u64, "copy-engine rows");
                        if share < 0.5 {
                            assert_eq!(landed, (misses as u64).min(64), "landing rows in use");
                        } else {
                            assert_eq!(overflow, 0, "every miss landed");
                        }
                    }
                    let (loc_l, fill_l) = (s.clone_dtoh(&loc_l).unwrap(), s.clone_dtoh(&fill_l).unwrap());
                    let staged = s.clone_dtoh(&staging).unwrap();
                    let what =
                        format!("{} step {step} layer {l} (gather: {gather}, copy engine: {share:?})", policy.name());
                    assert_eq!(s.clone_dtoh(&copy).unwrap(), sels, "{what}: selection copy");
                    for (r, (req, twin)) in reqs.iter().zip(&twins).enumerate() {
                        let base = r * (b + 1);
                        for (j, (&tok, w)) in sels[req.sel_offset as usize..].iter().zip(twin).enumerate() {
                            let at = req.sel_offset as usize + j;
                            let want = match *w {
                                HotLocation::Slot(slot) => ((base + slot as usize) as i32, 0u64),
                                HotLocation::Host if gather => {
                                    let row = &staged[at * ROW..(at + 1) * ROW];
                                    assert_eq!(
                                        row,
                                        row_of(r, l, tok as usize).as_slice(),
                                        "{what}: staged row of {tok}"
                                    );
                                    ((base + b) as i32, at as u64 + 1)
                                }
                                HotLocation::Host => {
                                    let page = pages[page_offsets[r] as usize + tok as usize / PAGE] as usize;
                                    (
                                        (base + b) as i32,
                                        ((l * pages_per_layer + page) * PAGE + tok as usize % PAGE + 1) as u64,
                                    )
                                }
                            };
                            assert_eq!((loc_l[at], fill_l[at]), want, "{what} request {r}: located {tok}");
                        }
                    }
                }
                let sel = Selections { positions: &sels_d.as_view(), scores: Some(&scores_d.as_view()) };
                let src = MissSource { pages: &pages_d, host: &mapped };
                gpu.launch(l, bt, sel, src, SwapTargets { hot_rows: hot_l, out: &mut out, counts: None }).unwrap();
                let (locs, counts) = (s.clone_dtoh(&out.locations).unwrap(), s.clone_dtoh(&out.counts).unwrap());
                let (mt, ms, ev) = (
                    s.clone_dtoh(&out.miss_tokens).unwrap(),
                    s.clone_dtoh(&out.miss_slots).unwrap(),
                    s.clone_dtoh(&out.evicted).unwrap(),
                );
                let fills = s.clone_dtoh(&out.fills).unwrap();
                for (r, (req, plan)) in reqs.iter().zip(&plans).enumerate() {
                    let what = format!("{} step {step} layer {l} request {r}", policy.name());
                    let (o, n) = (req.sel_offset as usize, req.sel_len as usize);
                    assert_eq!(
                        counts[SWAP_COUNTS * r..SWAP_COUNTS * r + 5],
                        [
                            plan.hits.len() as u32,
                            plan.misses.len() as u32,
                            plan.evictions.len() as u32,
                            plan.prefetch_used as u32,
                            plan.prefetch_wasted as u32
                        ],
                        "{what}: counts"
                    );
                    // The twin's misses are the step's misses, its slots the hits' (and the newest's).
                    let twin = &twins[r];
                    let host_toks: Vec<u32> = sels[o..o + n]
                        .iter()
                        .zip(twin)
                        .filter(|(_, w)| **w == HotLocation::Host)
                        .map(|(&t, _)| t)
                        .collect();
                    assert_eq!(
                        host_toks,
                        plan.misses.iter().map(|m| m.0).collect::<Vec<_>>(),
                        "{what}: located misses"
                    );
                    for (j, w) in twin.iter().enumerate() {
                        if let HotLocation::Slot(slot) = *w {
                            assert_eq!(slot, plan.locations[j], "{what}: located hit {j}");
                        }
                    }
                    let base = (r * (b + 1)) as i32;
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
                    if fill {
                        // Each miss names its host row (plus one), each hit 0; the test then does
                        // what the attention would: the missed rows into their slots.
                        let missed: std::collections::HashMap<u32, u32> = plan.misses.iter().copied().collect();
                        let sel = &sels[o..o + n];
                        for (j, &tok) in sel.iter().enumerate() {
                            let want = match missed.get(&tok) {
                                None => 0,
                                Some(_) => {
                                    let page = pages[page_offsets[r] as usize + tok as usize / PAGE] as usize;
                                    ((l * pages_per_layer + page) * PAGE + tok as usize % PAGE + 1) as u64
                                }
                            };
                            assert_eq!(fills[o + j], want, "{what}: fill of position {tok}");
                        }
                        for &(tok, slot) in &plan.misses {
                            let at = (r * (b + 1) + slot as usize) * ROW;
                            s.memcpy_htod(&row_of(r, l, tok as usize), &mut hot_l.slice_mut(at..at + ROW)).unwrap();
                        }
                    }
                }
            }
        }
        assert!(!gpu.take_fault().unwrap(), "{}: no fault on valid input", policy.name());
        // Final state and rows.
        let mut managed = 0;
        for (r, &p) in z.prompts.iter().enumerate() {
            for (l, hot_l) in hot.iter().enumerate() {
                let (tokens, records, scalars) = gpu.read_state(r, l).unwrap();
                let c = &cpu[r][l];
                let want: Vec<i32> = c.table().slots().map(|t| t.map_or(-1, |t| t as i32)).collect();
                assert_eq!(tokens, want, "{} request {r} layer {l}: slot tables", policy.name());
                if p + steps > b {
                    managed += 1;
                    assert_eq!(records, c.records(), "{} request {r} layer {l}: records", policy.name());
                    assert_eq!(scalars, c.scalars(), "{} request {r} layer {l}: scalars", policy.name());
                }
                let rows = s.clone_dtoh(hot_l).unwrap();
                for (slot, t) in tokens.iter().enumerate() {
                    if *t >= 0 {
                        let at = (r * (b + 1) + slot) * ROW;
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
        assert!(managed > 0, "some buffers went through policy-managed steps");
        eprintln!(
            "{} ({}): {steps} steps x {layers} layers x {n} requests (top_k {k}, {b} slots, block {}) match the CPU \
             swap-in",
            policy.name(),
            if fill {
                "misses left to the attention"
            } else if fused_max > 0 {
                "one launch"
            } else {
                "two launches"
            },
            z.block
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_swap_in_matches_the_cpu_swap_in_for_every_gpu_policy() {
    let z = Sizes {
        slots: 256,
        top_k: 96,
        block: 128,
        layers: 2,
        steps: 40,
        window: 150,
        prompts: vec![100, 250, 600, 1500],
    };
    compare(&z, 3);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_swap_in_matches_the_cpu_swap_in_at_production_size() {
    // 32 requests: a few start on the fast path and cross into policy management, the rest are
    // long from the start (cold buffers, every first selection a miss).
    let prompts: Vec<usize> = (0..32).map(|i| if i < 4 { 4080 + i } else { 6000 + 700 * i }).collect();
    let z = Sizes { slots: 4096, top_k: 2048, block: 512, layers: 2, steps: 20, window: 3000, prompts };
    compare(&z, 11);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_range_selections_and_pages_raise_the_fault_flag() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let s = dev.stream().clone();
    let (b, layers) = (64usize, 1usize);
    let mut host =
        HostTier::new(&HostTierConfig { bytes: 4 << 20, layers, row_bytes: ROW, page_tokens: PAGE, file: None })
            .unwrap();
    host.register(RequestId(0)).unwrap();
    host.grow(RequestId(0), 300).unwrap();
    let mapped = host.register_cuda(dev.context()).unwrap();
    let lru = hisparse_policy::policy::by_name("lru", 0).unwrap();
    let mut gpu = GpuSwapInState::new(&dev, lru, shape(1, layers, b, 128, 32, 0)).unwrap();
    gpu.reset_seat(0, 0).unwrap();
    let mut hot = s.alloc_zeros::<u8>((b + 1) * ROW).unwrap();
    let run = |gpu: &mut GpuSwapInState, hot: &mut _, seq_len: u32, sel: &[u32], pages: &[u32]| {
        let req = SwapReq {
            seat: 0,
            seq_len,
            step: 1,
            sel_offset: 0,
            sel_len: sel.len() as u32,
            page_offset: 0,
            score_offset: 0,
            prefetch_budget: 0,
            request: 0,
        };
        let batch = gpu.upload_requests(&[req]).unwrap();
        let sels = s.clone_htod(sel).unwrap();
        let pages_d = s.clone_htod(pages).unwrap();
        let mut out = SwapOutputs::new(&s, 1, sel.len()).unwrap();
        let sel = Selections { positions: &sels.as_view(), scores: None };
        let src = MissSource { pages: &pages_d, host: &mapped };
        gpu.launch(0, &batch, sel, src, SwapTargets { hot_rows: hot, out: &mut out, counts: None }).unwrap();
        (s.clone_dtoh(&out.locations).unwrap(), gpu.take_fault().unwrap())
    };
    let good: Vec<u32> = host.pages(RequestId(0)).unwrap().to_vec();
    // One launch, two, and deciding only (the misses' host rows checked there instead).
    for (fused_max, step, fill) in [(usize::MAX, 0u32, false), (0, 10, false), (usize::MAX, 20, true)] {
        gpu.set_fused_max(fused_max);
        gpu.set_fill_in_attention(fill);
        // A valid step: no fault.
        let (_, fault) = run(&mut gpu, &mut hot, 200 + step, &[3, 150, 199], &good);
        assert!(!fault);
        // A selected position beyond the sequence (fast path and managed path): fault, location -1.
        let (locs, fault) = run(&mut gpu, &mut hot, 40, &[3, 41], &good);
        assert!(fault && locs[1] == -1, "fast path: {locs:?}");
        let (locs, fault) = run(&mut gpu, &mut hot, 201 + step, &[5, 250], &good);
        assert!(fault && locs[1] == -1, "managed path: {locs:?}");
        // A host page id outside the tier: fault, and no read outside the mapping.
        // (Tokens no earlier step brought in: misses, whose copies read the bad page.)
        let fresh = [6 * step, 6 * step + 1, 6 * step + 2];
        let mut bad = good.clone();
        bad[fresh[0] as usize / PAGE] = u32::MAX - 1;
        let (_, fault) = run(&mut gpu, &mut hot, 202 + step, &fresh, &bad);
        assert!(fault, "page id beyond the tier");
    }
    // The deferred swap-in's locate: the same checks, the same fault, location -1.
    let locate = |gpu: &mut GpuSwapInState, seq_len: u32, sel: &[u32], pages: &[u32]| {
        let req = SwapReq { seat: 0, seq_len, step: 1, sel_len: sel.len() as u32, ..SwapReq::default() };
        let batch = gpu.upload_requests(&[req]).unwrap();
        let (sels, pages_d) = (s.clone_htod(sel).unwrap(), s.clone_htod(pages).unwrap());
        let (mut loc, mut fill) = (s.alloc_zeros::<i32>(sel.len()).unwrap(), s.alloc_zeros::<u64>(sel.len()).unwrap());
        let mut copy = s.alloc_zeros::<u32>(sel.len()).unwrap();
        let mut staging = s.alloc_zeros::<u8>(sel.len() * ROW).unwrap();
        let mut view = staging.as_view_mut();
        let st = Some(&mut view);
        let located =
            LocateTargets { locations: &mut loc, fills: &mut fill, sel_copy: &mut copy.as_view_mut(), staging: st };
        let at = LayerLaunch { stream: &s, layer: 0, batch: &batch };
        gpu.locate(at, &sels.as_view(), MissSource { pages: &pages_d, host: &mapped }, located).unwrap();
        (s.clone_dtoh(&loc).unwrap(), gpu.take_fault().unwrap())
    };
    let (locs, fault) = locate(&mut gpu, 240, &[3, 150, 239], &good);
    assert!(!fault && locs.iter().all(|&l| l >= 0), "valid: {locs:?}");
    let (locs, fault) = locate(&mut gpu, 40, &[3, 41], &good);
    assert!(fault && locs == [3, -1], "fast path: {locs:?}");
    let (locs, fault) = locate(&mut gpu, 240, &[5, 250], &good);
    assert!(fault && locs[1] == -1, "managed path: {locs:?}");
    let mut bad = good.clone();
    bad[290 / PAGE] = u32::MAX - 1;
    let (locs, fault) = locate(&mut gpu, 299, &[290], &bad);
    assert!(fault && locs == [-1], "page id beyond the tier: {locs:?}");
    // What the host can see is refused before any launch: pages for the sequence beyond the list.
    let req = SwapReq {
        seat: 0,
        seq_len: 202,
        step: 1,
        sel_offset: 0,
        sel_len: 1,
        page_offset: 0,
        score_offset: 0,
        prefetch_budget: 0,
        request: 0,
    };
    let batch = gpu.upload_requests(&[req]).unwrap();
    let sels = s.clone_htod(&[0u32]).unwrap();
    let short = s.clone_htod(&good[..2]).unwrap();
    let mut out = SwapOutputs::new(&s, 1, 1).unwrap();
    let sel = Selections { positions: &sels.as_view(), scores: None };
    let src = MissSource { pages: &short, host: &mapped };
    assert!(gpu.launch(0, &batch, sel, src, SwapTargets { hot_rows: &mut hot, out: &mut out, counts: None }).is_err());
    // And requests the swap-in cannot hold are refused when uploaded.
    let over = SwapReq { sel_offset: u32::MAX, sel_len: 2, ..req };
    assert!(gpu.upload_requests(&[over]).is_err(), "sel_offset + sel_len overflows");
    assert!(gpu.upload_requests(&[SwapReq { seat: 5, ..req }]).is_err(), "no such seat");
    assert!(gpu.upload_requests(&[SwapReq { sel_len: 33, seq_len: 400, ..req }]).is_err(), "beyond max_sel");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_buffer_beyond_the_blocks_shared_memory_is_refused_by_name() {
    let dev = CudaDevice::new(0).expect("a CUDA GPU");
    let lru = hisparse_policy::policy::by_name("lru", 0).unwrap();
    // top_k 2048: 9600 slots fit the 227 KiB a block may have (with the kernels' static shared
    // memory); 9728 (exactly 227 KiB of dynamic shared memory) and 12288 do not.
    assert!(GpuSwapInState::new(&dev, Arc::clone(&lru), shape(1, 1, 9600, 512, 2048, 0)).is_ok());
    for slots in [9728, 12288] {
        let err = GpuSwapInState::new(&dev, Arc::clone(&lru), shape(1, 1, slots, 512, 2048, 0)).err().expect("refused");
        assert!(err.to_string().contains("device_buffer_size"), "{err}");
    }
}

/// A swap-in's shape from its sizes, in [`GpuSwapInStateShape`]'s field order.
fn shape(
    seats: usize,
    layers: usize,
    device_buffer_size: usize,
    block_size: usize,
    max_sel: usize,
    max_tokens: usize,
) -> GpuSwapInStateShape {
    GpuSwapInStateShape { seats, layers, device_buffer_size, block_size, max_sel, max_tokens }
}
