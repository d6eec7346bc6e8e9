//! The engine and the per-layer API on the H200: with the CUDA backend (indexer, top-k, device
//! swap-in, attention, the emulated model's new rows and their backup all on the GPU) the
//! hisparse and resident modes produce bit-identical attention outputs over many steps —
//! requests joining and leaving, one aborted mid-run, every GPU policy, a policy and batch cap
//! swapped mid-run, the backup stream slowed by an injected delay, launch graphs on (with the
//! top-k split over several blocks inside them, too) — and both
//! match the CPU backend within the kernels' tolerances, with the same selections and rows.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::scenario::{self, expected};
use common::{config, expected_count, requests, run_counted, run_on};
use hisparse_engine::{Engine, EngineConfig, LayerDump};
use hisparse_kernels::cuda::CudaBackend;
use hisparse_kernels::{CpuBackend, MissFill, MissFillMode};
use hisparse_memory::Mode;

/// A fixed split count: outputs then do not depend on the batch size in their last bits.
fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA GPU").with_splits(3)
}

/// `backend` filling its misses as `fill`.
fn filling(backend: CudaBackend, fill: MissFill) -> CudaBackend {
    backend.with_miss_fill(fill).expect("a valid miss-fill form")
}

/// `config` with every layer launched one by one (every layer's digest is then recorded).
fn eager(mode: Mode, policy: &str) -> EngineConfig {
    EngineConfig { launch_graphs: false, ..config(mode, policy) }
}

/// [`eager`] over a small grouped-query geometry (SmolLM2's 9 query heads in 3 groups of 64, 4
/// layers, top-k 256, bf16 rows): the oracle's scores, the swap-in's copies and the
/// grouped-query attention, all on CUDA.
fn gqa(mode: Mode, policy: &str) -> EngineConfig {
    let mut c = eager(mode, policy);
    c.cache.geometry =
        hisparse_memory::KvGeometry::gqa("gqa-small", 4, 9, 3, 64, 256, hisparse_memory::KvRowFormat::Bf16).unwrap();
    // A model without an indexer selects by its own attention (what `CacheConfig::new` picks
    // for a grouped-query geometry).
    c.cache.index_score = hisparse_kernels::IndexScore::Oracle(hisparse_kernels::OracleScore::default());
    c
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_grouped_query_rows_are_lossless() {
    let (resident, counts) = run_counted(gpu(), gqa(Mode::Resident, "lru"), &[], None);
    assert_eq!(resident.len(), expected_count());
    assert!(counts.iter().all(|c| c.misses == 0), "resident never misses");
    for policy in ["lru", "clock", "s3fifo"] {
        let (hs, counts) = run_counted(gpu(), gqa(Mode::HiSparse, policy), &[], None);
        assert!(counts.iter().map(|c| c.misses).sum::<u64>() > 0, "{policy}: the buffers never missed");
        assert_eq!(hs, resident, "grouped-query rows, {policy}: outputs differ from the resident baseline");
    }
    let distinct: std::collections::HashSet<u64> = resident.values().copied().collect();
    assert!(distinct.len() > resident.len() / 2, "outputs are not trivial");
    // A miss-fill form that leaves misses to the attention is refused by name.
    let auto = filling(gpu(), MissFill::Auto { max_batch: 8 });
    let e = Engine::new(auto, gqa(Mode::HiSparse, "lru")).err().expect("refused");
    assert!(e.to_string().contains("miss_fill"), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_hisparse_equals_resident_bit_for_bit() {
    let resident = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    assert_eq!(resident.len(), expected_count());
    // Every online policy with a GPU form: recency, frequency with token words (s3fifo, mq),
    // score-aware ones reading the indexer's scores on the device.
    let policies: Vec<_> =
        hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some() && !p.needs_future()).collect();
    assert!(policies.len() >= 9, "{} GPU policies", policies.len());
    for policy in policies {
        let hs = run_on(gpu(), eager(Mode::HiSparse, policy.name()), &[], None);
        assert_eq!(hs, resident, "{}: outputs differ from the resident baseline", policy.name());
    }
    let hs = run_on(gpu(), eager(Mode::HiSparse, "lru"), &["clock", "random", "fifo", "lru"], None);
    assert_eq!(hs, resident, "policy and batch cap swapped mid-run");
    let hs = run_on(gpu(), eager(Mode::HiSparse, "clock"), &[], Some(Duration::from_millis(2)));
    assert_eq!(hs, resident, "slow backup worker");
    let distinct: std::collections::HashSet<u64> = resident.values().copied().collect();
    assert!(distinct.len() > resident.len() / 2, "outputs are not trivial");
    // The indexer on fp8 queries (e4m3 MMA): both modes select alike.
    let fp8 = |mode, policy| {
        let mut c = eager(mode, policy);
        c.cache.index_queries = hisparse_kernels::IndexerQueries::Fp8;
        c
    };
    let resident = run_on(gpu(), fp8(Mode::Resident, "lru"), &[], None);
    for policy in ["lru", "score"] {
        assert_eq!(run_on(gpu(), fp8(Mode::HiSparse, policy), &[], None), resident, "fp8 index queries, {policy}");
    }
}

/// Every layer's dump at steps 1, 6 and 12 of the requests decoded together.
fn dumps<B: hisparse_kernels::Backend>(backend: B, cfg: EngineConfig) -> Vec<LayerDump>
where
    B::Memory: Clone,
{
    let mut e = Engine::new(backend, cfg).unwrap();
    for r in requests() {
        e.submit(r).unwrap();
    }
    let mut out = Vec::new();
    for s in 1..=12 {
        if [1, 6, 12].contains(&s) {
            e.capture_next_step();
        }
        let rep = e.step().unwrap();
        out.extend(rep.dump);
        if s == 12 {
            assert!(rep.metrics.swap.hits + rep.metrics.swap.misses > 0);
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_engine_matches_the_cpu_backend() {
    for mode in [Mode::HiSparse, Mode::Resident] {
        let mut cfg = config(mode, "lru");
        cfg.capture_digests = false;
        let (cpu, gpu) = (dumps(CpuBackend::new(), cfg.clone()), dumps(gpu(), cfg));
        assert_eq!(cpu.len(), gpu.len());
        assert!(!cpu.is_empty());
        for (c, g) in cpu.iter().zip(&gpu) {
            assert_eq!((c.layer, &c.requests, &c.seq_lens), (g.layer, &g.requests, &g.seq_lens));
            let max = c.scores.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in c.scores.iter().zip(&g.scores) {
                assert!(x == y || (x - y).abs() <= 2e-5 * max, "{mode} layer {}: score {x} vs {y}", c.layer);
            }
            assert_eq!(c.selections, g.selections, "{mode} layer {}: selections differ", c.layer);
            assert_eq!(c.selected_rows, g.selected_rows, "{mode} layer {}: selected rows differ", c.layer);
            let max = c.out.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(max > 0.0);
            for (x, y) in c.out.iter().zip(&g.out) {
                assert!((x - y).abs() <= 4e-3 * max + 1e-5, "{mode} layer {}: out {x} vs {y}", c.layer);
            }
            for (x, y) in c.lse.iter().zip(&g.lse) {
                assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{mode} layer {}: lse {x} vs {y}", c.layer);
            }
        }
    }
}

/// Launch graphs: replaying layers 1..L as one captured graph computes what launching them one
/// by one does: every layer's output of every step (digests keep each layer's output in its own
/// buffer, written inside the graph), and the swap-in's hits and misses.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_launch_graphs_replay_what_eager_launches_compute() {
    let mut resident_graphs = None;
    let modes = [(Mode::Resident, "lru"), (Mode::HiSparse, "lru"), (Mode::HiSparse, "clock"), (Mode::Hybrid, "lru")];
    for (mode, policy) in modes {
        let (eager_d, eager_c) = run_counted(gpu(), eager(mode, policy), &[], None);
        let (graph_d, graph_c) = run_counted(gpu(), config(mode, policy), &[], None);
        let replays: u64 = graph_c.iter().map(|c| c.replays).sum();
        let captures: u64 = graph_c.iter().map(|c| c.captures).sum();
        assert!(replays >= 10 && captures >= 1, "{mode:?} {policy}: {replays} replays, {captures} captures");
        assert!(captures < replays, "{mode:?} {policy}: every replay was captured anew ({captures})");
        assert_eq!(eager_c.iter().map(|c| c.replays).sum::<u64>(), 0);
        let strip = |c: &[common::StepCounts]| c.iter().map(|c| (c.hits, c.misses)).collect::<Vec<_>>();
        assert_eq!(strip(&graph_c), strip(&eager_c), "{mode:?} {policy}: hits and misses differ");
        assert_eq!(graph_d.len(), eager_d.len(), "{mode:?} {policy}: a digest of every layer of every step");
        for (k, d) in &graph_d {
            assert_eq!(eager_d.get(k), Some(d), "{mode:?} {policy}: digest {k:?} differs");
        }
        match (&resident_graphs, mode) {
            (None, Mode::Resident) => resident_graphs = Some(graph_d),
            (Some(r), _) => assert_eq!(&graph_d, r, "{mode} {policy}: with graphs differs from resident"),
            _ => {}
        }
    }
    // IndexShare layers (empty query buffers on the shared layers) keep one graph too.
    let mut c = config(Mode::HiSparse, "lru");
    c.cache.geometry = c.cache.geometry.with_indexers(hisparse_memory::IndexerLayout::Every { first_full: 1, freq: 2 });
    let (_, counts) = run_counted(gpu(), c, &[], None);
    let (replays, captures): (u64, u64) =
        (counts.iter().map(|c| c.replays).sum(), counts.iter().map(|c| c.captures).sum());
    assert!(replays >= 10 && captures < replays, "shared layers: {replays} replays, {captures} captures");
    // The backup's side stream, slowed, inside the captured graphs: still the same outputs.
    let (slow, counts) = run_counted(gpu(), config(Mode::HiSparse, "lru"), &[], Some(Duration::from_millis(2)));
    assert!(counts.iter().map(|c| c.replays).sum::<u64>() >= 10);
    assert_eq!(Some(&slow), resident_graphs.as_ref(), "slowed backup stream with graphs");
}

/// Dense attention (top-k past every request: no index keys, nothing selected) under launch
/// graphs: one graph replayed step after step (no buffer of the step moves), the outputs those
/// of eager launches and of a cache that keeps the keys.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_dense_attention_replays_one_graph() {
    let dense = |mut c: EngineConfig, longest: usize| {
        c.cache.geometry.top_k = 2048;
        c.cache.hisparse.device_buffer_size = 2048;
        c.cache.hisparse.max_request_tokens = longest;
        c
    };
    let (graph_d, graph_c) = run_counted(gpu(), dense(config(Mode::Resident, "lru"), 2048), &[], None);
    let (replays, captures): (u64, u64) =
        (graph_c.iter().map(|c| c.replays).sum(), graph_c.iter().map(|c| c.captures).sum());
    assert!(
        replays >= 10 && captures < replays,
        "dense: {replays} replays, {captures} captures (one a step: every step moved a buffer)"
    );
    let (eager_d, _) = run_counted(gpu(), dense(eager(Mode::Resident, "lru"), 2048), &[], None);
    let (keys_d, _) = run_counted(gpu(), dense(eager(Mode::Resident, "lru"), 4096), &[], None);
    assert_eq!(eager_d, keys_d, "dense attention with and without index keys");
    for (k, d) in &graph_d {
        assert_eq!(eager_d.get(k), Some(d), "dense: digest {k:?} differs under graphs");
    }
}

/// The per-layer API's scenario (caller-made tensors in device memory, arrivals between steps,
/// an abort mid-run) on the GPU: resident and hisparse bit-identical for every GPU policy, with
/// shared index layers, and with the backup stream slowed.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_per_layer_api_is_lossless_for_every_gpu_policy() {
    for shared in [false, true] {
        let (resident, _) = scenario::run_on(gpu(), Mode::Resident, shared, "lru", "none", None);
        assert_eq!(resident.len(), expected());
        let policies: Vec<_> = hisparse_policy::policy::builtin(0)
            .into_iter()
            .filter(|p| p.cuda().is_some() && !p.needs_future())
            .collect();
        for p in &policies {
            let (hs, misses) = scenario::run_on(gpu(), Mode::HiSparse, shared, p.name(), "none", None);
            assert!(misses > 0, "{}: the scenario must miss", p.name());
            assert_eq!(hs, resident, "{} (shared index: {shared}): outputs differ", p.name());
        }
        let slow = Some(Duration::from_millis(2));
        let (hs, _) = scenario::run_on(gpu(), Mode::HiSparse, shared, "clock", "none", slow);
        assert_eq!(hs, resident, "slowed backup stream (shared index: {shared})");
    }
}

/// Hybrid placement on the GPU: the per-layer API's scenario in a budget where requests are
/// demoted, promoted and their pages moved, bit-identical to resident; the engine in hybrid
/// placement bit-identical to resident too; the attention's miss fill refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_hybrid_placement_equals_resident() {
    let g = scenario::geometry(false);
    let (resident, _) = scenario::run_on(gpu(), Mode::Resident, false, "lru", "none", None);
    let mut c = scenario::cache(gpu(), Mode::Hybrid, &g, "lru", "none", None);
    let (hybrid, misses) = scenario::run_requests(&mut c, &g, &scenario::scenario());
    assert_eq!(hybrid, resident, "the per-layer API in hybrid placement");
    let moved = c.placement();
    assert!(misses > 0 && moved.demotions > 0 && moved.promotions > 0 && moved.moved_pages > 0, "{moved:?}");
    let res = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    assert_eq!(run_on(gpu(), eager(Mode::Hybrid, "lru"), &[], None), res, "the engine in hybrid placement");
    let e = Engine::new(filling(gpu(), MissFill::Attention), eager(Mode::Hybrid, "lru")).err().expect("refused");
    assert!(e.to_string().contains("miss_fill"), "{e}");
}

/// Next-step prefetch (near-cut candidates) is not on the GPU yet: refused, naming it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_next_step_prefetch_is_refused_by_name() {
    let mut cfg = config(Mode::HiSparse, "lru");
    cfg.cache.hisparse.prefetch = "next-step".parse().unwrap();
    let e = Engine::new(gpu(), cfg).err().expect("refused");
    assert!(e.to_string().contains("prefetcher") && e.to_string().contains("next-step"), "{e}");
}

/// Prefetch on the GPU's transfer stream: for shared-index and adjacent-layer, under a recency,
/// a frequency and a score-aware policy, with every layer full or IndexShare layers: hisparse
/// with prefetch equals resident bit for bit (every layer's output), and the pipelined run
/// (transfer stream, launch graphs), the serial one (main stream, eager), the pipelined one with
/// the transfer stream slowed, and the CPU engine count the same hits, misses, prefetched,
/// useful and wasted rows at every step.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_prefetch_on_the_transfer_stream_is_exact() {
    let shared = |mut c: EngineConfig| {
        c.cache.geometry =
            c.cache.geometry.with_indexers(hisparse_memory::IndexerLayout::Every { first_full: 1, freq: 2 });
        c
    };
    let strip = |c: &[common::StepCounts]| {
        c.iter().map(|c| (c.hits, c.misses, c.prefetched, c.prefetch_useful, c.prefetch_wasted)).collect::<Vec<_>>()
    };
    for share in [false, true] {
        let geo = |c: EngineConfig| if share { shared(c) } else { c };
        let resident = run_on(gpu(), geo(config(Mode::Resident, "lru")), &[], None);
        for prefetcher in ["shared-index", "adjacent-layer"] {
            for policy in ["lru", "s3fifo", "score"] {
                let make = |serial: bool, graphs: bool, delay: Option<Duration>| {
                    let mut c = geo(config(Mode::HiSparse, policy));
                    c.cache.hisparse.prefetch = prefetcher.parse().unwrap();
                    c.cache.serial_prefetch = serial;
                    c.launch_graphs = graphs;
                    c.cache.transfer_delay = delay;
                    c
                };
                let what = format!("{prefetcher} / {policy} (shared index: {share})");
                let (piped, pc) = run_counted(gpu(), make(false, true, None), &[], None);
                assert_eq!(piped, resident, "{what}: pipelined outputs differ from resident");
                let (serial, sc) = run_counted(gpu(), make(true, false, None), &[], None);
                assert_eq!(serial, resident, "{what}: serial outputs differ");
                let slow = Some(Duration::from_micros(300));
                let (slowed, dc) = run_counted(gpu(), make(false, false, slow), &[], None);
                assert_eq!(slowed, resident, "{what}: slowed transfer stream");
                let (_, cpu) = run_counted(CpuBackend::new(), make(false, false, None), &[], None);
                assert_eq!(strip(&pc), strip(&cpu), "{what}: pipelined counts differ from the CPU engine");
                assert_eq!(strip(&sc), strip(&cpu), "{what}: serial counts differ");
                assert_eq!(strip(&dc), strip(&cpu), "{what}: slowed counts differ");
                let moved: u64 = cpu.iter().map(|c| c.prefetched).sum();
                let replays: u64 = pc.iter().map(|c| c.replays).sum();
                let meaningful = prefetcher == "adjacent-layer" || share;
                assert!(!meaningful || moved > 0, "{what}: nothing was prefetched");
                assert!(replays > 0, "{what}: the pipelined run never replayed a graph");
            }
        }
    }
}

/// Misses brought in by the attention (`miss_fill = "attention"`: the swap-in only decides, the
/// attention reads missed rows from the host tier and writes them into their slots): every GPU
/// policy equals resident bit for bit, so does `auto` switching between both paths, and with
/// launch graphs, prefetch on the transfer stream and IndexShare layers it computes what the
/// copying swap-in does, with the same hits and misses at every step.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_misses_filled_by_the_attention_are_lossless() {
    let fill = || filling(gpu(), MissFill::Attention);
    let resident = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    let policies: Vec<_> =
        hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some() && !p.needs_future()).collect();
    for policy in &policies {
        let hs = run_on(fill(), eager(Mode::HiSparse, policy.name()), &[], None);
        assert_eq!(hs, resident, "{}: outputs differ from the resident baseline", policy.name());
        let copy = eager(Mode::HiSparse, policy.name());
        assert_eq!(run_on(gpu(), copy, &[], None), resident, "{}: the copying swap-in differs", policy.name());
    }
    // `auto` at batches of at most 3 under a policy that reads scores (where `auto` lets the
    // attention fill rather than defer): the requests (arriving two at a time, five in all)
    // take both paths from step to step, eager and replayed.
    for graphs in [false, true] {
        let mut c = eager(Mode::HiSparse, "score");
        c.launch_graphs = graphs;
        let auto = filling(gpu(), MissFill::Auto { max_batch: 3 });
        assert_eq!(run_on(auto, c, &[], None), resident, "auto (graphs: {graphs})");
    }
    matches_the_copying_swap_in("attention", fill);
    // The mma.sync attention (the default is warpgroup MMA) fills alike.
    let mma = || gpu().with_wgmma_attention(false);
    let resident = run_on(mma(), eager(Mode::Resident, "lru"), &[], None);
    let mma_fill = filling(mma(), MissFill::Attention);
    assert_eq!(run_on(mma_fill, eager(Mode::HiSparse, "lru"), &[], None), resident, "mma.sync attention fills");
}

/// With launch graphs and each prefetcher (IndexShare layers for shared-index), a run on a
/// backend made by `make` computes what the copying swap-in does: the same hits, misses and
/// prefetches at every step, the same outputs.
fn matches_the_copying_swap_in(what: &str, make: impl Fn() -> CudaBackend) {
    let strip = |c: &[common::StepCounts]| c.iter().map(|c| (c.hits, c.misses, c.prefetched)).collect::<Vec<_>>();
    for (prefetcher, c) in common::prefetcher_configs() {
        let (copied, cc) = run_counted(gpu(), c.clone(), &[], None);
        let (made, mc) = run_counted(make(), c, &[], None);
        assert!(mc.iter().map(|c| c.replays).sum::<u64>() >= 10, "{what} / {prefetcher}: graphs replayed");
        assert!(mc.iter().map(|c| c.misses).sum::<u64>() > 0, "{what} / {prefetcher}: the run must miss");
        assert_eq!(strip(&mc), strip(&cc), "{what} / {prefetcher}: hits, misses and prefetches differ");
        assert_eq!(made, copied, "{what} / {prefetcher}: outputs differ from the copying swap-in");
    }
}

/// The swap-in deferred (`miss_fill = "deferred"`: the attention reads each miss from the host
/// tier and writes nothing; the swap-in's decisions and copies run after it on a stream of
/// their own): every GPU policy that does not read scores equals resident bit for bit, eager and
/// with the deferred stream slowed; with launch graphs and each prefetcher (IndexShare layers for
/// shared-index) the hits, misses and prefetches equal the copying swap-in's at every step, and
/// so do the outputs; a policy that reads scores is refused by name, and `auto` (deferred in
/// small batches, the attention filling under such a policy) is lossless too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_a_deferred_swap_in_is_lossless() {
    for fill in ["deferred", "deferred-gather", "copy-engine"] {
        deferred_swap_in_is_lossless(fill);
    }
    // The copy engine's landing rows (64, the fewest) short of a layer's misses: the scatter
    // reads the rest from the host tier; replayed from launch graphs too.
    let resident = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    for graphs in [false, true] {
        let mut c = eager(Mode::HiSparse, "lru");
        c.launch_graphs = graphs;
        let few = filling(gpu(), MissFill::CopyEngine { share: 1e-6, host_threads: 2 });
        assert_eq!(run_on(few, c, &[], None), resident, "copy-engine, 64 landing rows (graphs: {graphs})");
    }
}

fn deferred_swap_in_is_lossless(fill: &str) {
    let form: MissFill = fill.parse::<MissFillMode>().unwrap().into();
    let defer = || filling(gpu(), form);
    let resident = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    let policies: Vec<_> =
        hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some() && !p.needs_future()).collect();
    let mut refused = 0;
    for policy in &policies {
        let cfg = eager(Mode::HiSparse, policy.name());
        if policy.needs_scores() {
            let e = Engine::new(defer(), cfg).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("miss_fill") && e.contains(policy.name()), "{}: {e}", policy.name());
            refused += 1;
            // `auto` takes it: the attention fills its misses in small batches instead.
            let auto = filling(gpu(), MissFill::from(MissFillMode::Auto));
            assert_eq!(
                run_on(auto, eager(Mode::HiSparse, policy.name()), &[], None),
                resident,
                "{}: auto",
                policy.name()
            );
            continue;
        }
        let hs = run_on(defer(), cfg, &[], None);
        assert_eq!(hs, resident, "{fill} / {}: outputs differ from the resident baseline", policy.name());
    }
    assert!(refused > 0 && refused < policies.len(), "{refused} of {} policies refused", policies.len());
    let mut slow = eager(Mode::HiSparse, "s3fifo");
    slow.cache.transfer_delay = Some(Duration::from_micros(300));
    assert_eq!(run_on(defer(), slow, &[], None), resident, "{fill}: deferred stream slowed");
    // The mma.sync attention (the default is warpgroup MMA) reads the misses alike.
    let mma = || gpu().with_wgmma_attention(false);
    let mma_resident = run_on(mma(), eager(Mode::Resident, "lru"), &[], None);
    let mma_defer = filling(mma(), form);
    assert_eq!(run_on(mma_defer, eager(Mode::HiSparse, "lru"), &[], None), mma_resident, "{fill}: mma.sync");
    // `auto` at batches of at most 3: deferred and copying swap-ins from step to step, eager and
    // replayed, with a mid-run switch to a policy that reads scores and back.
    for graphs in [false, true] {
        let mut c = eager(Mode::HiSparse, "lru");
        c.launch_graphs = graphs;
        let auto = filling(gpu(), MissFill::Auto { max_batch: 3 });
        assert_eq!(run_on(auto, c, &["score", "lru"], None), resident, "auto (graphs: {graphs})");
    }
    matches_the_copying_swap_in(fill, defer);
}

/// Every layer's digest of two requests longer than one top-k round (2048 positions), decoded
/// together to the end on `backend`.
fn long_request_digests(backend: CudaBackend, cfg: EngineConfig) -> common::Digests {
    let mut e = Engine::new(backend, cfg).unwrap();
    for (i, prompt_tokens) in [3000usize, 4000].into_iter().enumerate() {
        let id = hisparse_memory::RequestId(i as u64 + 70);
        e.submit(hisparse_engine::RequestSpec { id, prompt_tokens, output_tokens: 6 }).unwrap();
    }
    let mut digests = common::Digests::new();
    for _ in 0..100 {
        if e.is_idle() {
            break;
        }
        for (id, tok, layer, d) in e.step().unwrap().digests {
            digests.insert((id.0, tok, layer), d);
        }
    }
    assert!(e.is_idle(), "the requests finish");
    digests
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_split_top_k_inside_launch_graphs_selects_like_one_block() {
    // The top-k over several blocks per request (forced: these spans are short of the automatic
    // choice's 64k), its four launches captured in the step's graphs, against one block per
    // request launched layer by layer: the same selections, so the same outputs bit for bit.
    for mode in [Mode::Resident, Mode::HiSparse] {
        let one = long_request_digests(gpu().with_top_k_blocks(1), eager(mode, "lru"));
        let split = long_request_digests(gpu().with_top_k_blocks(3), config(mode, "lru"));
        assert_eq!(one.len(), 2 * 6 * 4, "{mode:?}: a digest of every layer of every token");
        assert_eq!(split, one, "{mode:?}: the split top-k in graphs selects differently");
    }
}

/// The sweep's timing bound (`miss_fill = "no-copies"`) of `auto` at batches of at most 3: its
/// decisions run where `auto` runs them (deferred after a locate at small batches, on the main
/// stream above), so every step's hits and misses equal `auto`'s, eager and replayed from launch
/// graphs; it copies no row and its attention never reads the host tier, so its outputs are
/// not the resident ones. The bound of `swap-in` (never deferred) decides alike too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_bound_decides_as_the_form_it_bounds() {
    let strip = |c: &[common::StepCounts]| c.iter().map(|c| (c.hits, c.misses)).collect::<Vec<_>>();
    let resident = run_on(gpu(), eager(Mode::Resident, "lru"), &[], None);
    for (graphs, form) in
        [(false, MissFill::Auto { max_batch: 3 }), (true, MissFill::Auto { max_batch: 3 }), (true, MissFill::SwapIn)]
    {
        let mut c = eager(Mode::HiSparse, "lru");
        c.launch_graphs = graphs;
        let (real, rc) = run_counted(filling(gpu(), form), c.clone(), &[], None);
        let (bound, bc) = run_counted(filling(gpu(), form.bound()), c, &[], None);
        assert_eq!(real, resident, "{form:?} (graphs: {graphs}) is lossless");
        assert!(rc.iter().map(|c| c.misses).sum::<u64>() > 0, "{form:?}: the run must miss");
        assert_eq!(strip(&bc), strip(&rc), "{form:?} (graphs: {graphs}): the bound decides otherwise");
        assert_eq!(bound.len(), resident.len());
        let same = bound.iter().filter(|(k, d)| resident.get(k) == Some(d)).count();
        assert!(same < bound.len(), "{form:?} (graphs: {graphs}): the bound's outputs are all right");
    }
}
