//! The engine's device path (inputs staged for every layer before the loop, packed row
//! writes, seeds on the device, selections kept in device buffers, inputs generated during the
//! previous step when the batch is unchanged) run over the CPU kernels:
//! resident-mode outputs equal the host path's bit for bit, and every layer keeps its digest
//! (a backend that cannot capture launches every layer).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{config, expected_count, run_counted, run_on};
use half::bf16;
use hisparse_kernels::{AttentionBatch, Backend, CpuBackend, IndexerBatch, NoDeviceSwapIn, Span};
use hisparse_memory::{EmulatedDevice, Mode};

/// The CPU kernels behind a backend that asks for the device path.
struct DevicePathCpu(CpuBackend);

impl Backend for DevicePathCpu {
    type Memory = EmulatedDevice;
    type SwapIn = NoDeviceSwapIn;

    fn name(&self) -> &'static str {
        "cpu-device-path"
    }

    fn memory(&self) -> &EmulatedDevice {
        self.0.memory()
    }

    fn indexer_scores(
        &self,
        b: &IndexerBatch<'_, EmulatedDevice>,
        scores: &mut Vec<f32>,
    ) -> hisparse_kernels::Result<()> {
        self.0.indexer_scores(b, scores)
    }

    fn top_k(&self, scores: &Vec<f32>, spans: &[Span], k: usize, out: &mut Vec<i32>) -> hisparse_kernels::Result<()> {
        self.0.top_k(scores, spans, k, out)
    }

    fn sparse_attention(
        &self,
        b: &AttentionBatch<'_, EmulatedDevice>,
        out: &mut Vec<f32>,
        lse: &mut Vec<f32>,
    ) -> hisparse_kernels::Result<()> {
        self.0.sparse_attention(b, out, lse)
    }

    fn fill_unit_bf16(&self, seeds: &[u64], len: usize, out: &mut Vec<bf16>) -> hisparse_kernels::Result<()> {
        self.0.fill_unit_bf16(seeds, len, out)
    }

    fn prefers_device_selection(&self) -> bool {
        true
    }
}

#[test]
fn the_device_path_equals_the_host_path_bit_for_bit() {
    let host = run_on(CpuBackend::new(), config(Mode::Resident, "lru"), &[], None);
    assert_eq!(host.len(), expected_count());
    for graphs in [true, false] {
        let mut cfg = config(Mode::Resident, "lru");
        cfg.launch_graphs = graphs;
        let (device, counts) = run_counted(DevicePathCpu(CpuBackend::new()), cfg, &[], None);
        assert_eq!(device.len(), expected_count(), "graphs {graphs}: a layer lost its digest");
        // Most steps' inputs were generated during the step before (the batch unchanged).
        let ahead = counts.iter().filter(|c| c.ahead).count();
        assert!(ahead > counts.len() / 3 && ahead < counts.len(), "{ahead} of {} steps ahead", counts.len());
        let differ = host.iter().filter(|(k, d)| device.get(k) != Some(d)).count();
        assert_eq!(differ, 0, "graphs {graphs}: {differ} of {} digests differ", host.len());
    }
}

#[test]
fn the_device_path_equals_the_host_path_with_shared_index_layers() {
    let shared = |mode| {
        let mut c = config(mode, "lru");
        c.geometry = c.geometry.with_indexers(hisparse_memory::IndexerLayout::Every { first_full: 1, freq: 2 });
        c
    };
    let host = run_on(CpuBackend::new(), shared(Mode::Resident), &[], None);
    let device = run_on(DevicePathCpu(CpuBackend::new()), shared(Mode::Resident), &[], None);
    assert_eq!(host.len(), expected_count());
    assert_eq!(host, device);
}
