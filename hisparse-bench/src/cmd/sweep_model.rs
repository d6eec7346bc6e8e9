//! `hisparse sweep --model` / `--gguf`: the sweep's steady-state throughput over concurrency x
//! context with a real model's requests (`run_model.rs`) instead of the emulated workload. Per
//! context and mode one engine holds the most requests of the sweep, each decoding longer than
//! the sweep lasts; each level lets that many run (more wait within a `--device-memory`
//! budget: the point's `running` shows what fit), measured by the emulated sweep's own loop
//! (`sweep_measure.rs`).

use std::path::PathBuf;

use super::run_model::ModelInput;
use super::sweep_data::{SweepArgs, SweepMode, SweepReport};
use super::sweep_measure::{SharedBuf, measure, replay};
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, progress};

/// Runs the sweep at `levels` (sorted), `steps` steps per level.
pub fn run(a: &SweepArgs, levels: &[usize], steps: usize) -> Result<(SweepReport, PathBuf)> {
    if let Some(n) = a.gpus {
        return Err(BenchError::flag("gpus", n, "a model is served by one CPU engine"));
    }
    if a.bound {
        return Err(BenchError::flag("bound", true, "the swap-in-free bound is measured on the emulated workload"));
    }
    if crate::deferred::given("seed") {
        let when = "with --model or --gguf (the seed drives the emulated workload; a model's sweep has no arrivals)";
        return Err(BenchError::Unread { flag: "seed", when: when.into() });
    }
    let life = (levels.len() + 1).checked_mul(steps).and_then(|s| s.checked_add(1)).ok_or_else(|| {
        let (flag, v) = guard::largest(&[("window", a.window, 4), ("windows", a.windows, 3), ("warmup", a.warmup, 3)]);
        BenchError::flag(flag, v, "the sweep's steps overflow")
    })?;
    let mut input = ModelInput::load(&a.source, &a.engine)?;
    let positions = input.model.config().context;
    for &c in &a.context {
        if guard::sum(("context", c), ("window", life))? > positions {
            return Err(BenchError::flag(
                "context",
                c,
                format!("with the sweep's {life} decode steps it passes the model's {positions} positions"),
            ));
        }
    }
    let out = OutputDir::prepare("out", a.out.as_deref().unwrap_or(std::path::Path::new("results/sweep")))?;
    let max_n = levels.last().copied().unwrap_or(1);
    let modes: Vec<SweepMode> = a.mode.modes().into_iter().map(SweepMode::from).collect();
    let total = levels.iter().sum::<usize>().saturating_mul(a.context.len() * modes.len()).saturating_mul(steps);
    let bar = progress::bar(total as u64, "request-steps");
    let (mut points, mut measured_misses, mut tier_bytes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hierarchy, mut buffer, mut device_kv, mut host_tier) = (String::new(), 0, 0, 0);
    let mut backend = "cpu";
    let trace = SharedBuf::default();
    for &context in &a.context {
        bar.set_message(format!("context {context}: prefilling"));
        input.prefill(context, "context")?;
        let all: Vec<_> = modes.iter().map(|m| m.mode()).collect();
        input.refuse_a_budget_holding_nothing(&a.engine, &all, context + life, max_n)?;
        for &mode in &modes {
            let (mut model_engine, specs) = input.engine(&a.engine, mode.mode(), (context + life, max_n), |_| life)?;
            let e = model_engine.engine();
            backend = e.backend_name();
            let hs = &e.config().cache.hisparse;
            if !tier_bytes.iter().any(|&(m, _)| m == mode.mode()) {
                tier_bytes.push((mode.mode(), e.device_tier_bytes() as u64));
            }
            // The report's hierarchy is hisparse's; a resident-only sweep shows its own budget.
            if mode == SweepMode::HiSparse || hierarchy.is_empty() {
                (hierarchy, buffer) = (
                    super::sweep_output::hierarchy(hs, hisparse_kernels::MissFill::SwapIn, backend),
                    hs.device_buffer_size,
                );
                (device_kv, host_tier) = (hs.device_kv_bytes, hs.host_bytes());
            }
            let record = (mode == SweepMode::HiSparse && Some(&context) == a.context.first()).then_some(&trace);
            let (ps, per_step) = measure(a, e, &specs, (context, mode), (levels, steps), record, &bar)?;
            points.extend(ps);
            if mode == SweepMode::HiSparse {
                measured_misses.push((format!("context {context}"), per_step));
            }
        }
    }
    bar.finish_and_clear();
    let misses_by_buffer = replay(&trace, input.top_k())?;
    let c = input.model.config();
    let mut report = SweepReport {
        preset: input.name(),
        backend: backend.into(),
        emulation: format!(
            "a real model, nothing emulated ({} layers, {} query heads over {} KV heads of {}), oracle top-{} \
             over its own attention weights, {} prompts of the text",
            c.layers,
            c.heads,
            c.kv_heads,
            c.head_dim,
            input.top_k(),
            input.prompts.len()
        ),
        device_buffer_size: buffer,
        gpus: 1,
        hierarchy,
        device_kv_bytes: device_kv,
        device_tier_bytes: tier_bytes,
        host_tier_bytes: host_tier,
        window: a.window,
        windows: a.windows,
        points,
        level_starts: levels.iter().enumerate().map(|(i, &n)| (n, i * steps)).collect(),
        misses_over_time: measured_misses,
        misses_by_buffer,
        bound: None,
        headline: Vec::new(),
    };
    report.headline = super::sweep_headline::headlines(&report);
    super::sweep_output::write(&report, &out)?;
    Ok((report, out.commit()?))
}
