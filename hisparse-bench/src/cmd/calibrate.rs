//! `hisparse calibrate`: the synthetic workload's real indexer selections, measured against the
//! published figures the preset is calibrated to.

use hisparse_engine::workload::Workload;
use std::path::PathBuf;

use hisparse_engine::calibrate::{CalibrationSpec, calibrate, trace_header};

use crate::error::{BenchError, Result};
use crate::files::AtomicFile;
use crate::guard;

/// Options of `hisparse calibrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    /// Preset (glm-5.1, glm-5.2 with its shared-index layers, or deepseek-v3.2).
    #[arg(long, default_value = "glm-5.1", value_parser = crate::cmd::common::parse_preset)]
    pub preset: hisparse_memory::Preset,
    /// Context (prompt tokens).
    #[arg(long, default_value_t = 65_536)]
    pub context: usize,
    /// Decode steps.
    #[arg(long, default_value_t = 80)]
    pub steps: usize,
    /// Layers to run, comma separated (default: two adjacent deep layers, plus 0 and 1 for deepseek-v3.2).
    #[arg(long, value_delimiter = ',')]
    pub layers: Vec<usize>,
    /// Requests.
    #[arg(long, default_value_t = 1)]
    pub requests: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Also write the selections as a trace (.hstrace; .jsonl for JSON lines), for
    /// `hisparse simulate`.
    #[arg(long)]
    pub trace_out: Option<PathBuf>,
    /// Replace an existing --trace-out file.
    #[arg(long)]
    pub overwrite: bool,
    /// Record, per selection, the scores of the selected tokens and of this many candidates
    /// ranked just below the cut (what score-aware policies and next-step prefetch need).
    #[arg(long, default_value_t = 0)]
    pub score_margin: usize,
}

/// Runs and renders the comparison.
pub fn run(a: &CalibrateArgs) -> Result<String> {
    let g = a.preset.geometry();
    let layers = if a.layers.is_empty() {
        let mid = g.layers / 2;
        if g.name == "deepseek-v3.2" { vec![0, 1, mid, mid + 1] } else { vec![mid, mid + 1] }
    } else {
        a.layers.clone()
    };
    if let Some(&l) = layers.iter().find(|&&l| l >= g.layers) {
        return Err(BenchError::flag("layers", l, format!("the preset has {} layers", g.layers)));
    }
    let mut sorted = layers.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(BenchError::flag("layers", w[0], "is given twice; name each layer once"));
    }
    if a.steps < 4 {
        return Err(BenchError::flag("steps", a.steps, "need at least 4 steps (the first quarter is warm-up)"));
    }
    guard::at_least_one("requests", a.requests)?;
    if a.context < g.top_k {
        return Err(BenchError::flag(
            "context",
            a.context,
            format!("must be at least the preset's top_k = {}", g.top_k),
        ));
    }
    let total = guard::sum(("context", a.context), ("steps", a.steps))?;
    if total > u32::MAX as usize / 2 {
        let (flag, v) = if a.context > a.steps { ("context", a.context) } else { ("steps", a.steps) };
        return Err(BenchError::flag(flag, v, "context + steps must stay below 2^31 positions"));
    }
    // Index keys of every run layer for one request, plus scores; and every selection.
    let keys = guard::product(&[layers.len(), total.div_ceil(64) * 64 + 1, g.index_key()?.row_bytes() + 4]);
    guard::memory("context", a.context, "the index keys of the run layers", keys)?;
    guard::within("score-margin", a.score_margin, 0, hisparse_policy::trace::MAX_TOP_K as usize)?;
    let per_record = guard::sum(("top-k", g.top_k), ("score-margin", a.score_margin))?;
    let selections = guard::product(&[a.requests, a.steps, layers.len(), per_record, 8]);
    guard::memory("steps", a.steps, "the selections of every request, step and layer", selections)?;
    let spec = CalibrationSpec {
        requests: a.requests,
        layers,
        steps: a.steps,
        context: a.context,
        score_margin: a.score_margin,
        stop: crate::interrupt::engine_stop(),
    };
    // The output file is claimed before the long run, so a refusal comes at once.
    let file = a.trace_out.as_ref().map(|p| AtomicFile::create("trace-out", p, a.overwrite)).transpose()?;
    let c = calibrate(&g, &Workload::new(&g, a.seed), &spec)?;
    let mut written = String::new();
    if let Some(mut file) = file {
        let header = trace_header(&g, &spec);
        let jsonl = a.trace_out.as_ref().is_some_and(|p| p.extension().is_some_and(|e| e == "jsonl"));
        if jsonl {
            hisparse_policy::trace::jsonl::write(file.writer(), &header, &c.records)?;
        } else {
            let mut w = hisparse_policy::trace::TraceWriter::new(file.writer(), header)?;
            for r in &c.records {
                w.write(r)?;
            }
            w.finish()?;
        }
        let path = file.commit()?;
        written = format!("\nwrote {} ({} records)\n", path.display(), c.records.len());
    }
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let mut s = format!(
        "workload calibration: {} at {} tokens of context, {} steps, layers {:?}\n\n",
        g.name,
        a.context,
        a.steps,
        c.step_overlap.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    s += &format!("{:<44} {:>10} {:>16}\n", "statistic", "measured", "published");
    let k = g.top_k;
    let rows: Vec<(String, f64, &str)> = vec![
        (format!("LRU misses per step, {k} slots"), c.lru[0], "30% (GLM-5.1)"),
        (format!("LRU misses per step, {} slots", 2 * k), c.lru[1], "13.4% (GLM-5.1)"),
        (format!("LRU misses per step, {} slots", 4 * k), c.lru[2], "6.7% (GLM-5.1)"),
        (format!("FIFO misses per step, {} slots", 2 * k), c.fifo_random_belady_2x[0], "17.2% (GLM-5.1)"),
        (format!("random misses per step, {} slots", 2 * k), c.fifo_random_belady_2x[1], "16.1% (GLM-5.1)"),
        (format!("Belady misses per step, {} slots", 2 * k), c.fifo_random_belady_2x[2], "8.2% (GLM-5.1)"),
    ];
    for (name, v, p) in rows {
        // DeepSeek-V3.2's miss curve is unpublished; its calibration targets are the overlaps.
        let p = if g.name == "deepseek-v3.2" { "unpublished" } else { p };
        s += &format!("{name:<44} {:>10} {p:>16}\n", pct(v));
    }
    for (l, o) in &c.step_overlap {
        let p = if g.name == "deepseek-v3.2" {
            if *l < 2 { "1-2% (V3.2)" } else { "35-50% (V3.2)" }
        } else {
            "~70% (implied)"
        };
        s += &format!("{:<44} {:>10} {p:>16}\n", format!("consecutive-step overlap, layer {l}"), pct(*o));
    }
    for ((a, b), o) in &c.layer_overlap {
        let p = if g.name == "deepseek-v3.2" && *a < 2 { "(random layers)" } else { "70-100%" };
        s += &format!("{:<44} {:>10} {p:>16}\n", format!("adjacent-layer overlap, layers {a}-{b}"), pct(*o));
    }
    s += &written;
    Ok(s)
}
