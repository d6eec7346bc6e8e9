//! Calibration of the workload: run the real indexer and top-k (CPU backend) over a few
//! requests and layers, record the selections as a trace, and measure what the published
//! figures describe — LRU misses at 1, 2 and 4 times top-k slots, FIFO, random and Belady at 2x,
//! consecutive-step overlap per layer, adjacent-layer overlap.

use half::bf16;
use hisparse_kernels::Kernels;
use hisparse_kernels::{CpuBackend, IndexerBatch, IndexerRequest, Span};
use hisparse_memory::KvGeometry;
use hisparse_policy::trace::{TraceHeader, TraceRecord};
use hisparse_policy::{BuiltinPolicy, PolicyError, SimConfig, simulate_with};
use serde::Serialize;

use crate::error::Result;
use crate::workload::Workload;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalibrationSpec {
    /// Requests.
    pub requests: usize,
    /// Layers to run (indices into the geometry's layers).
    pub layers: Vec<usize>,
    /// Decode steps.
    pub steps: usize,
    /// Prompt tokens per request.
    pub context: usize,
    /// Candidates ranked just below the cut to record per selection, with their scores (and
    /// then the selected tokens' scores too); 0: none.
    pub score_margin: usize,
    /// A caller's stop, observed every step and between the simulator's replays.
    pub stop: crate::StopFlag,
}

/// Measured locality of a workload.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Calibration {
    /// Top-k.
    pub top_k: usize,
    /// LRU miss ratio at 1, 2 and 4 times top-k slots.
    pub lru: [f64; 3],
    /// FIFO, random and Belady miss ratios at 2 times top-k slots.
    pub fifo_random_belady_2x: [f64; 3],
    /// Mean consecutive-step overlap per run layer (newest token excluded).
    pub step_overlap: Vec<(usize, f64)>,
    /// Mean overlap between each pair of adjacent run layers `(l - 1, l)`.
    pub layer_overlap: Vec<((usize, usize), f64)>,
    /// The selections, for the simulator or a trace file.
    #[serde(skip)]
    pub records: Vec<TraceRecord>,
}

/// Runs the real indexer and top-k for `spec` and returns the selections.
pub fn selections(geometry: &KvGeometry, workload: &Workload, spec: &CalibrationSpec) -> Result<Vec<TraceRecord>> {
    let cpu = CpuBackend::new();
    let key = geometry.index_key()?;
    let (h, dim, k) = (geometry.index_heads, geometry.index_dim, geometry.top_k);
    let total = spec.context + spec.steps;
    let p = 64;
    let pages = total.div_ceil(p);
    let mut records = Vec::new();
    let mut vals = vec![0f32; dim];
    // The layers whose indexer runs: the run layers' sources (a shared layer's is the nearest
    // preceding full layer, IndexShare).
    let mut sources: Vec<usize> = spec.layers.iter().map(|&l| geometry.index_source(l)).collect();
    sources.sort_unstable();
    sources.dedup();
    for r in 0..spec.requests as u64 {
        // Keys of every position of every source layer.
        let keys: Vec<Vec<u8>> = sources
            .iter()
            .map(|&l| {
                let mut pool = vec![0u8; pages * p * key.row_bytes()];
                for (t, row) in pool.chunks_mut(key.row_bytes()).take(total).enumerate() {
                    workload.index_key(r, l, t, &mut vals);
                    key.encode(&vals, row)?;
                }
                // Padding keys of the last page need a valid scale.
                for row in pool.chunks_mut(key.row_bytes()).skip(total) {
                    row[dim..].copy_from_slice(&1f32.to_le_bytes());
                }
                Ok(pool)
            })
            .collect::<Result<_>>()?;
        let table: Vec<u32> = (0..pages as u32).collect();
        let mut drift = workload.start(r);
        let (mut q, mut w) = (vec![0f32; h * dim], vec![0f32; h]);
        let mut scores = vec![0f32; total];
        let mut top = vec![0i32; k];
        let mut selected: Vec<Vec<u32>> = vec![Vec::new(); sources.len()];
        let mut chosen: Vec<ScoresNear> = vec![(None, None); sources.len()];
        for step in 1..=spec.steps {
            spec.stop.check()?;
            workload.advance(r, &mut drift);
            let seq_len = spec.context + step;
            for (li, &l) in sources.iter().enumerate() {
                workload.indexer_query(r, l, &drift, &mut q, &mut w);
                let qb: Vec<bf16> = q.iter().map(|x| bf16::from_f32(*x)).collect();
                let req = [IndexerRequest { first_page: 0, seq_len, score_offset: 0 }];
                let batch = IndexerBatch {
                    heads: h,
                    key_layout: key,
                    queries: &qb,
                    weights: &w,
                    keys: &keys[li],
                    page_tokens: p,
                    page_table: &table,
                    requests: &req,
                    pin_newest: false,
                    queries_as: hisparse_kernels::IndexerQueries::Exact,
                    score: hisparse_kernels::IndexScore::Lightning,
                };
                cpu.indexer_scores(&batch, &mut scores)?;
                let newest_score = scores[seq_len - 1];
                scores[seq_len - 1] = f32::INFINITY; // the newest token is always attended to
                cpu.top_k(&scores, &[Span::new(0, seq_len)], k, &mut top)?;
                selected[li] = top.iter().map(|&x| x as u32).collect();
                if spec.score_margin > 0 {
                    scores[seq_len - 1] = newest_score;
                    chosen[li] = near_cut(&scores[..seq_len], &selected[li], spec.score_margin);
                }
            }
            for &l in &spec.layers {
                let li = sources.binary_search(&geometry.index_source(l)).unwrap_or(0);
                records.push(TraceRecord {
                    step: step as u32,
                    request: r,
                    layer: l as u32,
                    seq_len: seq_len as u32,
                    selected: selected[li].clone(),
                    scores: chosen[li].0.clone(),
                    near: chosen[li].1.clone(),
                });
            }
        }
    }
    Ok(records)
}

/// A record's scores of the selected tokens and its near-cut candidates.
type ScoresNear = (Option<Vec<f32>>, Option<Vec<(u32, f32)>>);

/// The selected tokens' scores (ascending positions, as `selected`) and the `margin` best
/// unselected positions with their scores, best first (ties by position).
fn near_cut(scores: &[f32], selected: &[u32], margin: usize) -> ScoresNear {
    let mut r = TraceRecord { selected: selected.to_vec(), ..TraceRecord::default() };
    r.set_scores(scores, margin);
    (r.scores, r.near)
}

/// The trace header of [`selections`] under `spec`.
pub fn trace_header(geometry: &KvGeometry, spec: &CalibrationSpec) -> TraceHeader {
    let shared = (0..geometry.layers).any(|l| geometry.index_source(l) != l);
    TraceHeader {
        top_k: geometry.top_k as u32,
        layers: geometry.layers as u32,
        row_bytes: 656,
        has_scores: spec.score_margin > 0,
        score_margin: spec.score_margin.min(hisparse_policy::trace::MAX_TOP_K as usize) as u32,
        index_source: if shared {
            (0..geometry.layers).map(|l| geometry.index_source(l) as u32).collect()
        } else {
            Vec::new()
        },
    }
}

/// Measures the locality of `workload` under `spec`.
pub fn calibrate(geometry: &KvGeometry, workload: &Workload, spec: &CalibrationSpec) -> Result<Calibration> {
    let records = selections(geometry, workload, spec)?;
    let k = geometry.top_k;
    let header = trace_header(geometry, spec);
    let cfg = SimConfig {
        policies: [BuiltinPolicy::Lru, BuiltinPolicy::Fifo, BuiltinPolicy::Random, BuiltinPolicy::Belady]
            .map(Into::into)
            .to_vec(),
        buffer_sizes: hisparse_policy::compared_device_buffer_sizes(k),
        policy_config: hisparse_policy::PolicyConfig::seeded(1),
        ..SimConfig::default()
    };
    let stop = || spec.stop.requested();
    let report = match simulate_with(&header, &records, &cfg, &|_| {}, &stop) {
        Err(PolicyError::Cancelled) => return Err(crate::EngineError::Stopped),
        r => r?,
    };
    // Steady state: leave out each stream's first steps (cold buffer) by subtracting them.
    let ratio = |policy: &str, device_buffer_size: usize| {
        let r = report.results.iter().find(|x| x.policy == policy && x.device_buffer_size == device_buffer_size);
        r.map_or(0.0, |x| {
            let warm: Vec<f64> = x.series.iter().skip(x.series.len() / 4).copied().collect();
            warm.iter().sum::<f64>() / warm.len().max(1) as f64 / k as f64
        })
    };
    let n_layers = spec.layers.len();
    let rec = |r: usize, s: usize, li: usize| &records[(r * spec.steps + s) * n_layers + li];
    let mut step_overlap = Vec::new();
    for (li, &l) in spec.layers.iter().enumerate() {
        let mut v = Vec::new();
        for r in 0..spec.requests {
            for s in 1..spec.steps {
                let (a, b) = (rec(r, s, li), rec(r, s - 1, li));
                // A selection of the newest position alone counts as no overlap.
                v.push(a.overlap_with(b).unwrap_or(0.0));
            }
        }
        step_overlap.push((l, v.iter().sum::<f64>() / v.len().max(1) as f64));
    }
    let mut layer_overlap = Vec::new();
    for li in 1..n_layers {
        if spec.layers[li] == spec.layers[li - 1] + 1 {
            let mut lo = Vec::new();
            for r in 0..spec.requests {
                for s in 0..spec.steps {
                    let (a, b) = (rec(r, s, li), rec(r, s, li - 1));
                    lo.push(a.overlap_with(b).unwrap_or(0.0));
                }
            }
            layer_overlap
                .push(((spec.layers[li - 1], spec.layers[li]), lo.iter().sum::<f64>() / lo.len().max(1) as f64));
        }
    }
    Ok(Calibration {
        top_k: k,
        lru: [ratio("lru", k), ratio("lru", 2 * k), ratio("lru", 4 * k)],
        fifo_random_belady_2x: [ratio("fifo", 2 * k), ratio("random", 2 * k), ratio("belady", 2 * k)],
        step_overlap,
        layer_overlap,
        records,
    })
}
