//! Criterion bench: the engine's own work per decode step (scheduling, batch assembly, tier
//! bookkeeping, metrics) at 256 running requests, with kernels that do nothing, so that only the
//! engine is timed. The measured time is `StageTimes::bookkeeping` (wall time of the step minus
//! kernel calls, swap-in, backup, appends and the emulated model's workload).
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use hisparse_kernels::{Kernels, ModelKernels, StepControl};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hisparse_engine::{Engine, EngineConfig, RequestSpec};
use hisparse_kernels::{
    AttentionBatch, Backend, CpuRowBackup, CpuSwapIn, DeviceSwapInConfig, IndexerBatch, Result, RowBackupConfig, Span,
};
use hisparse_memory::{EmulatedDevice, HostTier, KvGeometry, Mode, RequestId};

/// Kernels that do no arithmetic: top-k returns the first k positions.
#[derive(Default)]
struct NullBackend(EmulatedDevice);

impl Kernels for NullBackend {
    type Memory = EmulatedDevice;

    fn name(&self) -> &'static str {
        "null"
    }

    fn memory(&self) -> &EmulatedDevice {
        &self.0
    }

    fn indexer_scores(&self, _: &IndexerBatch<'_, EmulatedDevice>, _: &mut Vec<f32>) -> Result<()> {
        Ok(())
    }

    fn top_k(&self, _: &Vec<f32>, spans: &[Span], k: usize, out: &mut Vec<i32>) -> Result<()> {
        for (i, _) in spans.iter().enumerate() {
            out[i * k..(i + 1) * k].iter_mut().enumerate().for_each(|(j, x)| *x = j as i32);
        }
        Ok(())
    }

    fn sparse_attention(
        &self,
        _: &AttentionBatch<'_, EmulatedDevice>,
        _: &mut Vec<f32>,
        _: &mut Vec<f32>,
    ) -> Result<()> {
        Ok(())
    }
}

impl StepControl for NullBackend {}

impl ModelKernels for NullBackend {}

impl Backend for NullBackend {
    type SwapIn = CpuSwapIn;
    type Backup = CpuRowBackup;

    fn device_swap_in(&self, cfg: &DeviceSwapInConfig, host: &mut HostTier) -> Result<CpuSwapIn> {
        CpuSwapIn::new(cfg, host, hisparse_kernels::MissFill::SwapIn)
    }

    fn row_backup(&self, cfg: &RowBackupConfig, host: &mut HostTier) -> Result<CpuRowBackup> {
        CpuRowBackup::new(host, cfg)
    }
}

fn engine(mode: Mode) -> Engine<NullBackend> {
    let mut cfg = EngineConfig::new(KvGeometry::preset("cpu-small").unwrap(), mode, 3 << 30);
    cfg.cache.hisparse.max_request_tokens = 4096;
    cfg.cache.hisparse.host_tier_bytes = 3 << 30;
    cfg.cache.typical_tokens = 3024;
    let mut e = Engine::new(NullBackend::default(), cfg).unwrap();
    for i in 0..256 {
        e.submit(RequestSpec { id: RequestId(i), prompt_tokens: 1024, output_tokens: 2000 }).unwrap();
    }
    let first = e.step().unwrap();
    assert_eq!(first.metrics.running, 256, "all 256 requests must run");
    e
}

fn overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_bookkeeping_256_requests_cpu_small");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    for mode in [Mode::Resident, Mode::HiSparse] {
        let mut e = engine(mode);
        let r = e.step().unwrap();
        println!("{mode}: one step {:.2} ms, stages {:?}", 1e3 * r.metrics.seconds, r.metrics.stages);
        g.bench_function(mode.name(), |b| {
            b.iter_custom(|iters| {
                let mut t = 0.0;
                for _ in 0..iters {
                    t += e.step().unwrap().metrics.stages.bookkeeping;
                }
                Duration::from_secs_f64(t)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
