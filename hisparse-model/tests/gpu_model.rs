//! The real model (the tiny llama: 2 layers, 4 query heads over 2 KV heads of 16) as the engine's
//! client on the CUDA backend: the projections on the host, the cache's attention (new rows and
//! keys written, the oracle's selection, the swap-in, grouped-query attention) on the GPU.
//! Hisparse generates sparse resident's tokens and logits bit for bit on the GPU for every GPU
//! policy, with hot buffers that miss and evict on every layer; the GPU's logits agree with the
//! CPU backend's within what their arithmetic explains (the oracle's products on f16 tensor
//! cores, the attention's sums in another order: the mean negative log-likelihood of the
//! teacher's tokens within 1%, and most greedy tokens the same).
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
    let (mut worst, mut same, mut all) = (0f64, 0, 0);
    for (g, c) in fed.logits.iter().flatten().zip(cpu.logits.iter().flatten()) {
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
    eprintln!("GPU against CPU: {all} steps, worst relative NLL gap {worst:.3e}, {same} greedy tokens the same");
    assert!(all > 20 && worst < 0.01, "{all} steps: worst relative NLL gap {worst}");
    assert!(same * 10 >= all * 9, "{same} of {all} greedy tokens the same");
    std::fs::remove_dir_all(dir).unwrap();
}
