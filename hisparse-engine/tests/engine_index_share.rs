//! IndexShare (GLM-5.2's shared-index layers) in the engine: a shared layer attends over the
//! selection of the nearest preceding full layer (the recorded trace shows identical
//! selections), stores no index keys (the device budget buys more capacity), and hisparse stays
//! bit-identical to resident; the calibration's shared layers repeat their full layer.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::{config, run_on};
use hisparse_engine::Engine;
use hisparse_engine::calibrate::{CalibrationSpec, selections};
use hisparse_engine::workload::Workload;
use hisparse_kernels::CpuBackend;
use hisparse_memory::{IndexerLayout, KvGeometry, Mode};
use hisparse_policy::trace::TraceReader;

/// cpu-small with layers 0 and 2 full, 1 and 3 shared.
fn shared(mut c: hisparse_engine::EngineConfig) -> hisparse_engine::EngineConfig {
    c.cache.geometry = c.cache.geometry.with_indexers(IndexerLayout::Every { first_full: 1, freq: 2 });
    c
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn shared_layers_attend_over_their_full_layers_selection() {
    let cfg = shared(config(Mode::HiSparse, "lru"));
    assert_eq!(cfg.cache.geometry.full_layers(), vec![0, 2]);
    let mut e = Engine::new(CpuBackend::new(), cfg).unwrap();
    let sink = Sink::default();
    e.record_trace(Box::new(sink.clone()), 0).unwrap();
    for r in common::requests() {
        e.submit(r).unwrap();
    }
    e.run(1000).unwrap();
    e.finish_trace().unwrap();
    e.check_pools().unwrap();
    let bytes = sink.0.lock().unwrap().clone();
    let records: Vec<_> = TraceReader::new(bytes.as_slice()).unwrap().map(Result::unwrap).collect();
    let mut by: BTreeMap<(u32, u64), BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
    for r in &records {
        by.entry((r.step, r.request)).or_default().insert(r.layer, r.selected.clone());
    }
    let (mut same, mut differ) = (0, 0);
    for layers in by.values() {
        assert_eq!(layers.len(), 4);
        assert_eq!(layers[&1], layers[&0], "layer 1 reuses layer 0's selection");
        assert_eq!(layers[&3], layers[&2], "layer 3 reuses layer 2's selection");
        if layers[&0] == layers[&2] { same += 1 } else { differ += 1 }
    }
    assert!(differ > same, "the full layers select on their own ({differ} differ, {same} equal)");
}

#[test]
fn hisparse_equals_resident_with_shared_layers() {
    let res = run_on(CpuBackend::new(), shared(config(Mode::Resident, "lru")), &[], None);
    let hs = run_on(CpuBackend::new(), shared(config(Mode::HiSparse, "clock")), &[], None);
    assert_eq!(res.len(), common::expected_count());
    assert_eq!(res, hs);
    // The shared layers really changed the computation (their selections are not their own).
    let all_full = run_on(CpuBackend::new(), config(Mode::Resident, "lru"), &[], None);
    assert_ne!(res, all_full);
}

#[test]
fn only_full_layers_store_index_keys() {
    for mode in [Mode::Resident, Mode::HiSparse] {
        let full = Engine::new(CpuBackend::new(), config(mode, "lru")).unwrap();
        let half = Engine::new(CpuBackend::new(), shared(config(mode, "lru"))).unwrap();
        let (a, b) = (full.capacity(), half.capacity());
        // The same budget holds more index pages (hisparse: more requests too) when half the
        // layers keep no keys.
        assert!(b.index_pages > a.index_pages, "{mode}: {a:?} vs {b:?}");
        assert!(b.seats >= a.seats && b.kv_pages >= a.kv_pages, "{mode}: {a:?} vs {b:?}");
        assert!(half.device_tier_bytes() <= 64 << 20);
    }
}

#[test]
fn the_calibration_repeats_a_full_layers_selection_in_its_shared_layers() {
    let g = KvGeometry::preset("glm-5.2").unwrap();
    let w = Workload::new(&g, 3);
    let spec = CalibrationSpec {
        requests: 1,
        layers: vec![5, 6, 7],
        steps: 3,
        context: 3000,
        score_margin: 0,
        stop: hisparse_engine::StopFlag::never(),
    };
    let recs = selections(&g, &w, &spec).unwrap();
    assert_eq!(recs.len(), 9);
    for step in recs.chunks(3) {
        assert_eq!((step[0].layer, step[1].layer, step[2].layer), (5, 6, 7));
        assert_eq!(step[2].selected, step[1].selected, "layer 7 shares layer 6's selection");
        assert_ne!(step[0].selected, step[1].selected, "layer 5 shares layer 2's, not 6's");
        assert_eq!(step[0].selected.len(), 2048);
    }
}
