//! The real model (the tiny llama: 2 layers, 4 query heads over 2 KV heads of 16) as the engine's
//! client on the CUDA backend: the projections on the host, the cache's attention (new rows and
//! keys written, the oracle's selection, the swap-in, grouped-query attention) on the GPU.
//! Hisparse generates sparse resident's tokens and logits bit for bit on the GPU for every GPU
//! policy, with hot buffers that miss and evict on every layer; the GPU's logits agree with the
//! CPU backend's within what their arithmetic explains (the oracle's products on f16 tensor
//! cores, the attention's sums in another order: the mean negative log-likelihood of the
//! teacher's tokens within 1%, and most greedy tokens the same). With `candle-cuda`, the same
//! with the projections on the GPU too (candle's CUDA kernels), each product within 1% of the
//! largest output of the CPU's.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{text_tokens, tiny};
use hisparse_engine::{
    Backend, CacheConfig, CpuBackend, Engine, EngineConfig, KvCache, KvRowFormat, Outcome, RequestId,
};
use hisparse_kernels::cuda::CudaBackend;
use hisparse_model::{AttentionKind, Llama, LlamaDecoder, PrefillOut, cache_config};

const TOP_K: usize = 16;

fn config(m: &Llama, kind: AttentionKind, policy: &str) -> CacheConfig {
    let mut c = cache_config(m.config(), kind, TOP_K, 2 * TOP_K, 200, KvRowFormat::Bf16, 8).unwrap();
    c.hisparse.eviction = policy.parse().unwrap();
    c
}

fn prompts(m: &Llama, ids: &[u32]) -> Vec<PrefillOut> {
    let (kv, key) = KvCache::with_named_policies(CpuBackend::new(), config(m, AttentionKind::SparseResident, "lru"))
        .unwrap()
        .layouts();
    vec![m.prefill(&ids[..120], kv, key).unwrap(), m.prefill(&ids[40..150], kv, key).unwrap()]
}

/// Every request's tokens, every step's logits, and the swap-ins' misses.
struct Served {
    tokens: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f32>>>,
    misses: u64,
}

/// Serves 5 requests (output 6 + i % 3) on `backend` to the end: greedy, or fed `forced[i]`.
fn serve<B: Backend>(
    backend: B,
    m: &Llama,
    ps: &[PrefillOut],
    cache: CacheConfig,
    forced: Option<&[Vec<u32>]>,
) -> Served
where
    B::Memory: Clone,
{
    let cfg = EngineConfig { launch_graphs: false, ..EngineConfig::with_cache(cache) };
    let mut e = Engine::with_model(backend, cfg, LlamaDecoder::<B::Memory>::new(m, ps)).unwrap();
    e.model_mut().keep_logits(true);
    let n = 5;
    for i in 0..n {
        let (prompt, output) = (i as usize % 2, 6 + i as usize % 3);
        let spec = match forced {
            Some(f) => e.model_mut().request_forced(RequestId(i), prompt, &f[i as usize][..output]).unwrap(),
            None => e.model_mut().request(RequestId(i), prompt, output).unwrap(),
        };
        e.submit(spec).unwrap();
    }
    let (mut logits, mut misses) = (vec![Vec::new(); n as usize], 0);
    while !e.is_idle() {
        let st = e.step().unwrap();
        misses += st.metrics.swap.misses;
        for (id, l) in e.model_mut().take_logits() {
            logits[id.0 as usize].push(l);
        }
    }
    assert!(e.outcomes().iter().all(|(_, o)| matches!(o, Outcome::Finished { .. })), "{:?}", e.outcomes());
    assert_eq!(e.cache().device_bytes_in_use(), 0);
    let mut tokens = vec![Vec::new(); n as usize];
    for (id, t) in e.model().finished() {
        tokens[id.0 as usize] = t.clone();
    }
    Served { tokens, logits, misses }
}

fn gpu() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA GPU")
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_real_model_is_lossless_and_agrees_with_the_cpu() {
    let (dir, m) = tiny("gpu-model", 21);
    let ps = prompts(&m, &text_tokens(&m, 200));
    let resident = serve(gpu(), &m, &ps, config(&m, AttentionKind::SparseResident, "lru"), None);
    assert_eq!(resident.misses, 0, "resident never misses");
    let policies: Vec<_> =
        hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some() && !p.needs_future()).collect();
    assert!(policies.len() >= 9, "{} GPU policies", policies.len());
    for p in policies {
        let hs = serve(gpu(), &m, &ps, config(&m, AttentionKind::HiSparse, p.name()), None);
        // Every step of every layer misses: the buffers hold 2 x top-k of 120+ positions.
        assert!(hs.misses > 0, "{}: the buffers never missed", p.name());
        assert_eq!(hs.tokens, resident.tokens, "{}: tokens differ from sparse resident", p.name());
        assert!(hs.logits == resident.logits, "{}: logits differ from sparse resident", p.name());
    }
    // Against the CPU backend: the GPU fed the CPU's greedy tokens, step for step.
    let cpu = serve(CpuBackend::new(), &m, &ps, config(&m, AttentionKind::SparseResident, "lru"), None);
    let fed = serve(gpu(), &m, &ps, config(&m, AttentionKind::SparseResident, "lru"), Some(&cpu.tokens));
    let (worst, same, all) = nll_gap(&fed.logits, &cpu.logits);
    eprintln!("GPU against CPU: {all} steps, worst relative NLL gap {worst:.3e}, {same} greedy tokens the same");
    assert!(all > 20 && worst < 0.01, "{all} steps: worst relative NLL gap {worst}");
    assert!(same * 10 >= all * 9, "{same} of {all} greedy tokens the same");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Over every step's logits of `gpu` and `cpu`: the worst relative gap of the CPU's greedy
/// token's negative log-likelihood, how many steps' greedy tokens are the same, and the steps.
fn nll_gap(gpu: &[Vec<Vec<f32>>], cpu: &[Vec<Vec<f32>>]) -> (f64, usize, usize) {
    let (mut worst, mut same, mut all) = (0f64, 0, 0);
    for (g, c) in gpu.iter().flatten().zip(cpu.iter().flatten()) {
        let lse = |l: &[f32]| {
            let mx = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            f64::from(mx) + l.iter().map(|&x| f64::from(x - mx).exp()).sum::<f64>().ln()
        };
        let best = hisparse_model::argmax(c) as usize;
        // The CPU's greedy token's negative log-likelihood under each.
        let (ng, nc) = (lse(g) - f64::from(g[best]), lse(c) - f64::from(c[best]));
        worst = worst.max((ng - nc).abs() / nc.max(1e-3));
        same += usize::from(hisparse_model::argmax(g) as usize == best);
        all += 1;
    }
    (worst, same, all)
}

/// `x @ w^T` of one projection on the GPU against the same weight's on the CPU.
#[cfg(feature = "candle-cuda")]
fn products_agree(what: &str, gpu: &hisparse_model::BlockWeights, cpu: &hisparse_model::BlockWeights) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (name, g, c) in [("wq", &gpu.wq, &cpu.wq), ("wv", &gpu.wv, &cpu.wv), ("down", &gpu.down, &cpu.down)] {
        assert!(g.device().is_cuda() && c.device().is_cpu(), "{what} {name}");
        let w = match c.qmatmul() {
            candle_core::quantized::QMatMul::QTensor(t) => t.dequantize(&candle_core::Device::Cpu).unwrap(),
            other => panic!("{name}: {other:?}"),
        };
        let cols = w.dims()[1];
        let w: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        // One row (the matrix-vector kernel) and several (candle's other path).
        for rows in [1, 3, 40] {
            let x: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-2f32..2.0)).collect();
            let (want, got) = (c.matmul(&x, rows).unwrap(), g.matmul(&x, rows).unwrap());
            assert!(want.iter().any(|v| v.abs() > 0.01), "{what} {name}: outputs are not trivial");
            for (o, (a, b)) in got.iter().zip(&want).enumerate() {
                let (x, w) =
                    (&x[(o / (want.len() / rows)) * cols..][..cols], &w[(o % (want.len() / rows)) * cols..][..cols]);
                // Each side takes an activation as itself or as its 8-bit code of its block of
                // 32 (scale amax / 127): at most one step of the block's codes apart; and the
                // f32 sums in another order.
                let bound: f32 = x
                    .chunks(32)
                    .zip(w.chunks(32))
                    .map(|(xb, wb)| {
                        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                        wb.iter().zip(xb).map(|(w, x)| w.abs() * (step + 1e-5 * x.abs())).sum::<f32>()
                    })
                    .sum();
                assert!((a - b).abs() <= bound, "{what} {name}, {rows} rows, output {o}: {a} vs {b} (bound {bound})");
            }
        }
    }
}

#[cfg(feature = "candle-cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn with_its_projections_on_cuda_the_model_is_lossless_and_agrees_with_the_cpu() {
    let (dir, host) = tiny("gpu-projections", 23);
    let dev = candle_core::Device::new_cuda(0).expect("a CUDA GPU");
    let m = Llama::load_on(&dir.join("tiny.gguf"), &dev).unwrap();
    assert!(m.weights.output.device().is_cuda(), "the output head is on the GPU");
    products_agree("layer 0", &m.weights.blocks[0], &host.weights.blocks[0]);
    let ids = text_tokens(&m, 200);
    // The prompts prefilled with the GPU's projections; hisparse equals sparse resident bit for
    // bit through them.
    let ps = prompts(&m, &ids);
    let resident = serve(gpu(), &m, &ps, config(&m, AttentionKind::SparseResident, "lru"), None);
    for p in ["lru", "lfu"] {
        let hs = serve(gpu(), &m, &ps, config(&m, AttentionKind::HiSparse, p), None);
        assert!(hs.misses > 0, "{p}: the buffers never missed");
        assert_eq!(hs.tokens, resident.tokens, "{p}: tokens differ from sparse resident");
        assert!(hs.logits == resident.logits, "{p}: logits differ from sparse resident");
    }
    // Against the whole model on the CPU (its projections and its cache), fed the CPU's tokens.
    let host_ps = prompts(&host, &ids);
    let cpu = serve(CpuBackend::new(), &host, &host_ps, config(&host, AttentionKind::SparseResident, "lru"), None);
    let fed = serve(gpu(), &m, &ps, config(&m, AttentionKind::SparseResident, "lru"), Some(&cpu.tokens));
    let (worst, same, all) = nll_gap(&fed.logits, &cpu.logits);
    eprintln!(
        "GPU projections against the CPU: {all} steps, worst relative NLL gap {worst:.3e}, {same} greedy the same"
    );
    assert!(all > 20 && worst < 0.01, "{all} steps: worst relative NLL gap {worst}");
    assert!(same * 10 >= all * 9, "{same} of {all} greedy tokens the same");
    std::fs::remove_dir_all(dir).unwrap();
}
