//! `hisparse gpu-bench` (feature `cuda`): the swap-in path on the GPU, measured with its
//! ceilings in the same run — pinned host-to-device memcpy (the PCIe limit) and a device-to-device
//! copy (HBM) — then: host-tier set-up (memory map + touch + register against cuMemHostAlloc),
//! registration of a file-backed tier, miss-gather bandwidth for 656 B and 1152 B rows over host
//! tiers of several sizes, and swap-in call latency at top_k 2048, a 4096-slot buffer and 13%
//! misses, hit-only calls and the short-sequence fast path. Medians after warm-up, CUDA events.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaStream, DevicePtrMut, LaunchConfig, PushKernelArg};
use hisparse_kernels::SWAP_COUNTS;
use hisparse_kernels::cuda::{
    CudaDevice, GpuSwapInState, GpuSwapInStateShape, MissSource, Selections, SwapOutputs, SwapReq, SwapTargets,
    swap_in_source,
};
use hisparse_memory::{HostTier, HostTierConfig, RequestId};
use hisparse_policy::policy::by_name;
use hisparse_policy::{StepCtx, SwapInPlan, SwapInState, SwapInputs};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::guard;

/// Options of `hisparse gpu-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuBenchArgs {
    /// Host-tier sizes (GiB) for the miss-gather bandwidth, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub tier_gib: Vec<usize>,
    /// Size (GiB) of the host tier whose set-up is timed against cuMemHostAlloc (0: skip).
    #[arg(long, default_value_t = 64)]
    pub setup_gib: usize,
    /// Batch sizes for the swap-in latency, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32,128")]
    pub batches: Vec<usize>,
    /// Timed repetitions (medians are reported).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Output folder.
    #[arg(long, default_value = "results/gpu-bench")]
    pub out: PathBuf,
}

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// What.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// Context: the ceiling ratio or a note.
    pub note: String,
}

pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> BenchError {
    move |e| BenchError::Gpu(format!("CUDA {what}: {e}"))
}

impl Figure {
    /// Prints the figure as a table line and appends it to `figs`.
    pub(crate) fn record(figs: &mut Vec<Figure>, name: String, value: f64, unit: &str, note: String) {
        crate::console::note(&format!("{name:<60} {value:>10.2} {unit:<7} {note}"));
        figs.push(Figure { name, value, unit: unit.into(), note });
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `f` (enqueueing work on `s`) with events: median milliseconds over `reps` after 3 warm-ups.
pub(crate) fn time_ms(s: &Arc<CudaStream>, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let mut t = Vec::new();
    for _ in 0..reps.max(1) {
        let a = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda("event"))?;
        f()?;
        let b = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda("event"))?;
        t.push(f64::from(a.elapsed_ms(&b).map_err(cuda("elapsed"))?));
    }
    Ok(median(t))
}

/// Writes a non-zero pattern over the whole mapping, 16 threads at a time (never time on zeros).
fn fill(tier: &mut HostTier) {
    let base = tier.as_ptr() as usize;
    let len = tier.len();
    (0..len.div_ceil(1 << 21)).into_par_iter().for_each(|c| {
        let start = c << 21;
        let end = (start + (1 << 21)).min(len);
        for i in (start..end).step_by(8) {
            // SAFETY: inside the mapping; each 2 MiB chunk is written by one thread, before the
            // tier is registered or read by anything else.
            unsafe { ((base + i) as *mut u64).write_unaligned((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1) };
        }
    });
}

/// Runs every measurement; returns the figures.
pub fn run(a: &GpuBenchArgs) -> Result<Vec<Figure>> {
    guard::within("reps", a.reps, 1, 100_000)?;
    for &b in &a.batches {
        guard::within("batches", b, 1, 1024)?;
    }
    for &g in &a.tier_gib {
        guard::at_least_one("tier-gib", g)?;
        guard::memory("tier-gib", g, "the host tier", guard::product(&[g, 1 << 30]))?;
    }
    guard::memory("setup-gib", a.setup_gib, "the host tier", guard::product(&[a.setup_gib, 1 << 30]))?;
    let out = OutputDir::prepare("out", &a.out)?;
    let dev = CudaDevice::new(0)?;
    let s = dev.stream().clone();
    let mut figs = Vec::new();
    let mut push =
        |name: String, value: f64, unit: &str, note: String| Figure::record(&mut figs, name, value, unit, note);
    crate::console::note(&format!("device: {}", dev.name()?));

    // Ceilings: HBM copy, pinned host-to-device memcpy.
    let n = 2usize << 30;
    let src = s.alloc_zeros::<u8>(n).map_err(cuda("alloc"))?;
    let mut dst = s.alloc_zeros::<u8>(n).map_err(cuda("alloc"))?;
    let ms = time_ms(&s, a.reps, || s.memcpy_dtod(&src, &mut dst).map_err(cuda("dtod")))?;
    let hbm = 2.0 * n as f64 / (ms * 1e-3);
    push("HBM device-to-device copy, 2 GiB (read + write)".into(), hbm / 1e9, "GB/s", "ceiling".into());
    drop(src);
    let mut pinned =
        HostTier::new(&HostTierConfig { bytes: 1 << 30, layers: 1, row_bytes: 4096, page_tokens: 64, file: None })?;
    fill(&mut pinned);
    pinned.register_cuda(dev.context())?;
    let ptr = pinned.as_ptr();
    let bytes = pinned.len();
    let ms = time_ms(&s, a.reps, || {
        let (d, _g) = dst.device_ptr_mut(&s);
        // SAFETY: `ptr..ptr + bytes` is the registered host tier, alive until after the timing; `dst` holds 2 GiB.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(d, ptr.cast(), bytes, s.cu_stream()) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(BenchError::Gpu(format!("cuMemcpyHtoDAsync: {r:?}")))
        }
    })?;
    let pcie = bytes as f64 / (ms * 1e-3);
    push("pinned host-to-device memcpy, 1 GiB (PCIe)".into(), pcie / 1e9, "GB/s", "ceiling".into());
    drop(pinned);
    drop(dst);

    // Host-tier set-up against cuMemHostAlloc, and a file-backed registration.
    if a.setup_gib > 0 {
        let size = a.setup_gib << 30;
        let t = Instant::now();
        let mut tier =
            HostTier::new(&HostTierConfig { bytes: size, layers: 1, row_bytes: 1 << 20, page_tokens: 64, file: None })?;
        let map_s = t.elapsed().as_secs_f64();
        let base = tier.as_ptr() as usize;
        let len = tier.len();
        let t = Instant::now();
        // Touch every page in parallel (the tier is anonymous memory that grows as it is touched).
        (0..len / 4096).into_par_iter().for_each(|p| {
            // SAFETY: within the mapping; pages written by one thread each, before registration.
            unsafe { *((base + p * 4096) as *mut u8) = 1 };
        });
        let touch_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        tier.register_cuda(dev.context())?;
        let reg_s = t.elapsed().as_secs_f64();
        push(
            format!("host tier {} GiB: mmap + hugepage advice", a.setup_gib),
            map_s,
            "s",
            format!("hugepage advice accepted: {}", tier.hugepage_advice()),
        );
        push(format!("host tier {} GiB: touch (16 threads)", a.setup_gib), touch_s, "s", String::new());
        push(
            format!("host tier {} GiB: cuMemHostRegister", a.setup_gib),
            reg_s,
            "s",
            format!("total {:.2} s", map_s + touch_s + reg_s),
        );
        drop(tier);
        dev.context().bind_to_thread().map_err(cuda("bind"))?;
        let t = Instant::now();
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: plain allocation call with a valid out pointer; freed below.
        let r = unsafe {
            sys::cuMemHostAlloc(&mut p, size, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)
        };
        let alloc_s = t.elapsed().as_secs_f64();
        if r == sys::CUresult::CUDA_SUCCESS {
            // SAFETY: allocated above.
            unsafe { sys::cuMemFreeHost(p) };
            push(format!("cuMemHostAlloc {} GiB (the alternative)", a.setup_gib), alloc_s, "s", String::new());
        } else {
            push(format!("cuMemHostAlloc {} GiB failed", a.setup_gib), alloc_s, "s", format!("{r:?}"));
        }
    }
    let path = std::env::temp_dir().join(format!("hisparse-file-tier-{}.bin", std::process::id()));
    let file_ok = HostTier::new(&HostTierConfig {
        bytes: 256 << 20,
        layers: 1,
        row_bytes: 4096,
        page_tokens: 64,
        file: Some(hisparse_memory::HostTierFile::new(&path)),
    })
    .and_then(|mut t| t.register_cuda(dev.context()).map(|_| ()));
    let _ = std::fs::remove_file(&path);
    let note = match &file_ok {
        Ok(()) => "yes".to_string(),
        Err(e) => format!("no: {e}"),
    };
    push(
        "file-backed host tier (256 MiB) registers with CUDA (1 = yes)".into(),
        f64::from(u8::from(file_ok.is_ok())),
        "",
        note,
    );

    // Miss-gather bandwidth: 32 requests x 267 sorted misses (13% of 2048), one layer's rows.
    let lru = by_name("lru", 0)?;
    let module = swap_in_source(lru.as_ref()).ok_or_else(|| BenchError::Gpu("lru has no GPU form".into()))?;
    let name = module.name.clone();
    let gather = dev.function_of(&name, "gather_rows", || Some(module))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for &gib in &a.tier_gib {
        for rb in [656usize, 1152] {
            let layers = 61;
            let mut tier = HostTier::new(&HostTierConfig {
                bytes: gib << 30,
                layers,
                row_bytes: rb,
                page_tokens: 64,
                file: None,
            })?;
            let base_t = Instant::now();
            fill(&mut tier);
            let host = tier.register_cuda(dev.context())?;
            let rows_per_layer = (tier.total_pages() * 64) as u64;
            let fill_s = base_t.elapsed().as_secs_f64();
            for (pattern, span) in [
                ("one layer's rows (layer-major layout)", rows_per_layer),
                ("rows anywhere in the tier", rows_per_layer * layers as u64),
            ] {
                let layer_base = if span == rows_per_layer { 30 * rows_per_layer } else { 0 };
                let mut src = Vec::new();
                for r in 0..32u64 {
                    let start = (r * 32_768) % span.max(1);
                    let mut pos: Vec<u64> = (0..267).map(|_| rng.random_range(0..32_768u64)).collect();
                    pos.sort_unstable();
                    src.extend(pos.iter().map(|p| layer_base + (start + p) % span));
                }
                host.check_rows("src_rows", &src)?;
                let n = src.len();
                let src_d = s.clone_htod(&src).map_err(cuda("htod"))?;
                let dst_rows: Vec<u32> = (0..n as u32).collect();
                let dst_rows_d = s.clone_htod(&dst_rows).map_err(cuda("htod"))?;
                let mut out = s.alloc_zeros::<u8>(n * rb).map_err(cuda("alloc"))?;
                let (nn, rbb, host_ptr) = (n as u32, rb as u32, host.device_ptr());
                let ms = time_ms(&s, a.reps, || {
                    let mut b = s.launch_builder(&gather);
                    b.arg(&host_ptr).arg(&src_d).arg(&dst_rows_d).arg(&nn).arg(&rbb).arg(&mut out);
                    let cfg = LaunchConfig { grid_dim: (132 * 4, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: src rows were checked against the registered tier's layout (`host`
                    // keeps it mapped); dst holds n rows.
                    unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda("gather"))
                })?;
                let bw = (n * rb) as f64 / (ms * 1e-3);
                push(
                    format!("gather {rb} B rows, {gib} GiB tier, {pattern}"),
                    bw / 1e9,
                    "GB/s",
                    format!(
                        "{:.0}% of pinned memcpy; {n} rows in {:.1} us (tier filled in {fill_s:.1} s)",
                        100.0 * bw / pcie,
                        ms * 1e3
                    ),
                );
            }
        }
    }

    // Swap-in latency: top_k 2048, 4096 slots, 13% misses; hit-only; fast path.
    let (k, b, ctx_len) = (2048usize, 4096usize, 32_768usize);
    let maxb = a.batches.iter().copied().max().unwrap_or(1);
    let mut tier = HostTier::new(&HostTierConfig {
        bytes: maxb * (ctx_len + 256) * 656 + (64 << 20),
        layers: 1,
        row_bytes: 656,
        page_tokens: 64,
        file: None,
    })?;
    for r in 0..maxb {
        tier.register(RequestId(r as u64))?;
        tier.grow(RequestId(r as u64), ctx_len + 200)?;
    }
    fill(&mut tier);
    let host = tier.register_cuda(dev.context())?;
    let pages: Vec<u32> =
        (0..maxb).flat_map(|r| tier.pages(RequestId(r as u64)).map(<[u32]>::to_vec).unwrap_or_default()).collect();
    let per = tier.pages(RequestId(0))?.len() as u32;
    let pages_d = s.clone_htod(&pages).map_err(cuda("htod"))?;
    for &batch in &a.batches {
        let kinds =
            [("13% misses", 13usize, false), ("hit-only", 0, false), ("fast path (seq_len <= buffer)", 0, true)];
        for ((label, miss_pct, fast), launches) in kinds.into_iter().flat_map(|x| [(x, 1usize), (x, 2)]) {
            let mut gpu = GpuSwapInState::new(
                &dev,
                Arc::clone(&lru),
                GpuSwapInStateShape {
                    seats: batch,
                    layers: 1,
                    device_buffer_size: b,
                    block_size: 512,
                    max_sel: k,
                    max_tokens: 0,
                },
            )?;
            gpu.set_fused_max(if launches == 1 { usize::MAX } else { 0 });
            let mut hot = s
                .alloc_zeros::<u8>(batch * hisparse_memory::device_tier::hot_buffer_rows_of(b) * 656)
                .map_err(cuda("alloc"))?;
            let mut mirror: Vec<SwapInState> =
                (0..batch).map(|_| SwapInState::new(b)).collect::<std::result::Result<_, _>>()?;
            let base_len = if fast { 3000 } else { ctx_len };
            for (r, m) in mirror.iter_mut().enumerate() {
                if fast {
                    m.preload(base_len)?;
                    gpu.reset_seat(r, base_len)?;
                } else {
                    gpu.reset_seat(r, 0)?;
                }
            }
            let mut times = Vec::new();
            let mut misses = 0usize;
            let mut plan = SwapInPlan::default();
            let mut checked = 0usize;
            for step in 1..=(a.reps + 8) {
                let seq_len = base_len + step;
                let mut reqs = Vec::new();
                let mut sels = Vec::new();
                let mut want_counts = Vec::new();
                for (r, m) in mirror.iter_mut().enumerate() {
                    let resident: Vec<u32> = m.table().slots().flatten().collect();
                    let want_hits = if step <= 4 || resident.len() < k {
                        resident.len().min(k)
                    } else {
                        k * (100 - miss_pct) / 100
                    };
                    let mut sel: Vec<u32> = resident.choose_multiple(&mut rng, want_hits).copied().collect();
                    while sel.len() < k.min(seq_len - 1) {
                        let t = rng.random_range(0..(seq_len - 1) as u32);
                        if m.table().slot_of(t).is_none() && !sel.contains(&t) {
                            sel.push(t);
                        }
                    }
                    sel.sort_unstable();
                    let ctx = StepCtx {
                        step: step as u32,
                        layer: 0,
                        request: r as u64,
                        device_buffer_size: b as u32,
                        seed: 0,
                    };
                    m.step(lru.as_ref(), &sel, seq_len, &ctx, SwapInputs::default(), &mut plan)?;
                    want_counts.extend([plan.hits.len() as u32, plan.misses.len() as u32, plan.evictions.len() as u32]);
                    if step > 8 {
                        misses += plan.misses.len();
                    }
                    reqs.push(SwapReq {
                        seat: r as u32,
                        seq_len: seq_len as u32,
                        step: step as u32,
                        sel_offset: sels.len() as u32,
                        sel_len: sel.len() as u32,
                        page_offset: r as u32 * per,
                        score_offset: 0,
                        prefetch_budget: 0,
                        request: r as u64,
                    });
                    sels.extend(sel);
                }
                let sels_d = s.clone_htod(&sels).map_err(cuda("htod"))?;
                let mut out = SwapOutputs::new(&s, reqs.len(), sels.len())?;
                let batch_d = gpu.upload_requests(&reqs)?;
                let view = sels_d.as_view();
                let (sel, src) =
                    (Selections { positions: &view, scores: None }, MissSource { pages: &pages_d, host: &host });
                s.synchronize().map_err(cuda("sync"))?;
                let e0 = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda("event"))?;
                gpu.launch(0, &batch_d, sel, src, SwapTargets { hot_rows: &mut hot, out: &mut out, counts: None })?;
                let e1 = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda("event"))?;
                let ms = f64::from(e0.elapsed_ms(&e1).map_err(cuda("elapsed"))?);
                // The kernel's own counts against the CPU mirror's decisions, every step.
                let got: Vec<u32> = s
                    .clone_dtoh(&out.counts.slice(..SWAP_COUNTS * reqs.len()))
                    .map_err(cuda("dtoh"))?
                    .chunks_exact(SWAP_COUNTS)
                    .flat_map(|c| c[..3].to_vec())
                    .collect();
                if got != want_counts {
                    let r = (0..reqs.len()).find(|&r| got[3 * r..3 * r + 3] != want_counts[3 * r..3 * r + 3]);
                    return Err(BenchError::Gpu(format!(
                        "swap-in {label}, batch {batch}, step {step}: request {r:?} counted (hits, misses, \
                         evictions) {:?} on the GPU, {:?} on the CPU mirror",
                        r.map(|r| &got[3 * r..3 * r + 3]),
                        r.map(|r| &want_counts[3 * r..3 * r + 3])
                    )));
                }
                if gpu.take_fault()? {
                    return Err(BenchError::Gpu(format!("swap-in {label}, batch {batch}: kernel fault flag raised")));
                }
                checked += reqs.len();
                if step > 8 {
                    times.push(ms);
                }
            }
            let med = median(times);
            let per_req = misses as f64 / (a.reps * batch) as f64;
            push(
                format!("swap-in call, batch {batch}, top_k 2048, 4096 slots, {label}, {launches} launch(es)"),
                med * 1e3,
                "us",
                format!(
                    "{per_req:.0} misses per request ({:.1}%), {:.1} GB/s of rows; kernel counts equal the CPU \
                     mirror's for {checked} request-steps",
                    100.0 * per_req / k as f64,
                    per_req * batch as f64 * 656.0 / (med * 1e-3) / 1e9
                ),
            );
        }
    }
    out.write_json("gpu-bench.json", &figs)?;
    out.commit()?;
    Ok(figs)
}
