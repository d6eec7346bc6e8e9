//! Admission and capacity: requests wait for capacity in arrival order, one that can never fit is
//! rejected whole with its reason while the others continue, everything is freed (no leak), and
//! bad configurations or requests are typed errors naming the field.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_engine::{Engine, EngineConfig, EngineError, Outcome, RequestSpec};
use hisparse_kernels::CpuBackend;
use hisparse_memory::{KvGeometry, Mode, RequestId};

fn cfg(mode: Mode, device_bytes: u64) -> EngineConfig {
    let mut c = EngineConfig::new(KvGeometry::preset("cpu-small").unwrap(), mode, device_bytes);
    c.cache.hisparse.max_request_tokens = 4096;
    c.cache.typical_tokens = 1100;
    c
}

fn req(id: u64, prompt: usize, out: usize) -> RequestSpec {
    RequestSpec { id: RequestId(id), prompt_tokens: prompt, output_tokens: out }
}

#[test]
fn requests_wait_then_run_and_the_too_large_one_is_rejected() {
    // Resident: 3152 B per token, pages of 64 tokens: 8 MiB hold 41 pages, i.e. two requests of
    // 1000 + 24 tokens (16 pages each) and then the one of 508 (8 pages) — never a third 1024.
    for mode in [Mode::Resident, Mode::HiSparse, Mode::Hybrid] {
        let mut e = Engine::new(CpuBackend::new(), cfg(mode, 8 << 20)).unwrap();
        for i in 0..4 {
            e.submit(req(i, 1000, 24)).unwrap();
        }
        e.submit(req(99, 1_000_000, 4)).unwrap();
        e.submit(req(5, 500, 8)).unwrap();
        let first = e.step().unwrap();
        let reps = e.run(1000).unwrap();
        assert!(e.is_idle());
        let rejected: Vec<_> = e.outcomes().iter().filter(|(_, o)| matches!(o, Outcome::Rejected { .. })).collect();
        assert_eq!(rejected.len(), 1, "{mode}");
        assert_eq!(rejected[0].0, RequestId(99));
        if let Outcome::Rejected { reason } = &rejected[0].1 {
            assert!(reason.contains("needs") && reason.contains("in all"), "{reason}");
        }
        assert_eq!(e.outcomes().len(), 6);
        let max_running = reps.iter().chain([&first]).map(|r| r.metrics.running).max().unwrap();
        match mode {
            Mode::Resident => {
                assert_eq!(first.metrics.running, 2, "resident admits two long requests at first");
                assert!(max_running <= 3, "resident ran {max_running} at once on 8 MiB");
            }
            Mode::HiSparse | Mode::Hybrid => assert!(max_running >= 4, "{mode} ran only {max_running} at once"),
        }
        assert!(reps.iter().any(|r| r.metrics.queued > 0) || mode != Mode::Resident);
        e.check_pools().unwrap();
        assert_eq!((e.device_bytes_in_use(), e.host_bytes_in_use()), (0, 0), "{mode}: memory leaked");
    }
}

#[test]
fn metrics_add_up() {
    let mut e = Engine::new(CpuBackend::new(), cfg(Mode::HiSparse, 32 << 20)).unwrap();
    e.submit(req(1, 1200, 10)).unwrap();
    e.submit(req(2, 300, 5)).unwrap();
    let reps = e.run(100).unwrap();
    let tokens: usize = reps.iter().map(|r| r.metrics.tokens).sum();
    assert_eq!(tokens, 15);
    let s = &reps[0].metrics;
    assert_eq!((s.admitted, s.running, s.tokens), (2, 2, 2));
    assert!(s.stages.indexer > 0.0 && s.stages.attention > 0.0 && s.stages.admission > 0.0);
    assert!(s.bytes_prompt_host == (1500 * 656 * 4) as u64, "{}", s.bytes_prompt_host);
    // The cold request misses all it selects at first (but the newest); later steps hit.
    assert!(s.swap.misses >= 255 * 4, "{}", s.swap.misses);
    assert!(reps[3].metrics.swap.hits > reps[3].metrics.swap.misses);
    assert_eq!(s.swap.bytes_h2d, s.swap.misses * 656);
    assert_eq!(s.bytes_d2h, 2 * 4 * 656);
    assert!(s.device_bytes_in_use > 0 && s.host_bytes_in_use > 0);
}

#[test]
fn the_waiting_queue_is_bounded_and_a_refused_request_holds_nothing() {
    let mut c = cfg(Mode::HiSparse, 8 << 20);
    c.max_queued = 3;
    let mut e = Engine::new(CpuBackend::new(), c).unwrap();
    for i in 0..3 {
        e.submit(req(i, 300, 2)).unwrap();
    }
    assert_eq!(e.submit(req(3, 300, 2)).unwrap_err(), EngineError::QueueFull { capacity: 3 });
    assert_eq!(e.counts(), (3, 0, 0), "the refused request was not queued");
    e.step().unwrap();
    // Admission emptied the queue: there is room again, and the refused id is still free.
    e.submit(req(3, 300, 2)).unwrap();
    e.run(100).unwrap();
    assert_eq!(e.outcomes().len(), 4);
    e.check_pools().unwrap();
    // Token counts that overflow are refused, not wrapped.
    let e2 = e.submit(req(7, usize::MAX, 2)).unwrap_err();
    assert!(e2.to_string().contains("below 2^31"), "{e2}");
}

#[test]
fn bad_configs_and_requests_are_named() {
    let field = |e: EngineError| e.to_string();
    let mut c = cfg(Mode::HiSparse, 8 << 20);
    c.cache.hisparse.device_buffer_size = 100; // below top_k 256
    assert!(field(Engine::new(CpuBackend::new(), c).err().unwrap()).contains("device_buffer_size = 100"));
    let mut c = cfg(Mode::HiSparse, 8 << 20);
    c.cache.hisparse.eviction = hisparse_policy::Eviction::Belady;
    assert!(field(Engine::new(CpuBackend::new(), c).err().unwrap()).contains("eviction_policy = belady"));
    let c = cfg(Mode::Resident, 0);
    assert!(field(Engine::new(CpuBackend::new(), c).err().unwrap()).contains("device_kv_bytes = 0"));
    let mut c = cfg(Mode::HiSparse, 8 << 20);
    c.cache.hisparse.swap_in_block_size = 2048;
    assert!(field(Engine::new(CpuBackend::new(), c).err().unwrap()).contains("swap_in_block_size = 2048"));
    let mut e = Engine::new(CpuBackend::new(), cfg(Mode::Resident, 8 << 20)).unwrap();
    assert!(e.submit(req(1, 10, 0)).unwrap_err().to_string().contains("output_tokens"));
    e.submit(req(1, 10, 1)).unwrap();
    assert!(e.submit(req(1, 10, 1)).unwrap_err().to_string().contains("duplicate"));
    assert!(
        e.runtime().set_policy(hisparse_policy::Eviction::Belady).is_err(),
        "an offline policy cannot be swapped in"
    );
}

#[test]
fn a_swapped_policy_is_what_the_configs_then_describe() {
    let mut e = Engine::new(CpuBackend::new(), cfg(Mode::HiSparse, 8 << 20)).unwrap();
    e.submit(req(1, 300, 3)).unwrap();
    e.step().unwrap();
    let clock = hisparse_policy::Eviction::Clock { bits: 3 };
    e.runtime().set_policy(clock.clone()).unwrap();
    assert_eq!(e.config().cache.hisparse.eviction, hisparse_policy::Eviction::Lru, "taken up at the next step");
    e.step().unwrap();
    assert_eq!(e.config().cache.hisparse.eviction, clock);
    assert_eq!(e.runtime().get().eviction, clock);
}

#[test]
fn a_policy_the_miss_fill_cannot_run_is_refused_by_the_handle_and_the_engine_goes_on() {
    let c = cfg(Mode::HiSparse, 8 << 20);
    let backend = CpuBackend::new().with_miss_fill(hisparse_engine::MissFill::Deferred).unwrap();
    let mut e = Engine::new(backend, c).unwrap();
    e.submit(req(1, 300, 3)).unwrap();
    let err = e.runtime().set_policy(hisparse_policy::Eviction::Score).unwrap_err().to_string();
    assert!(err.contains("miss_fill") && err.contains("score"), "{err}");
    assert_eq!(e.runtime().get().eviction, hisparse_policy::Eviction::Lru);
    e.step().unwrap();
    assert_eq!(e.config().cache.hisparse.eviction, hisparse_policy::Eviction::Lru);
}
