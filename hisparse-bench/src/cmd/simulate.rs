//! `hisparse simulate`: replay a trace under several policies and buffer sizes; print a table and
//! write JSON, CSV and SVG (miss ratio against buffer size; misses per step over time).

use std::path::PathBuf;

use hisparse_policy::trace::read_trace;
use hisparse_policy::{PolicyError, SimConfig, SimReport, memory_estimate, simulate_with};

use crate::error::{BenchError, Result};
use crate::report::plot::{Chart, Series, line_chart, misses_over_time};
use crate::report::{Csv, OutputDir};
use crate::{guard, interrupt, progress};

/// Options of `hisparse simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// The trace (binary .hstrace or JSON lines).
    #[arg(long)]
    pub trace: PathBuf,
    /// Policies, comma separated (lru, fifo, random, clock, belady).
    #[arg(long, value_delimiter = ',', default_value = "lru,fifo,random,clock,belady")]
    pub policies: Vec<String>,
    /// Buffer sizes (regular slots), comma separated; default: 1, 2 and 4 times the trace's top_k.
    #[arg(long, value_delimiter = ',')]
    pub buffers: Vec<usize>,
    /// Seed of the random policy.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes per fetched row (default: the trace's, else 656).
    #[arg(long, default_value_t = 0)]
    pub row_bytes: usize,
    /// Output folder (default: `results/simulate-NAME`, NAME being the trace file name; this
    /// command's files in it are replaced).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the simulation and writes its outputs; returns the report and the output folder.
pub fn run(a: &SimulateArgs) -> Result<(SimReport, PathBuf)> {
    let (header, records) = read_trace(&a.trace)?;
    if records.is_empty() {
        return Err(BenchError::flag("trace", a.trace.display(), "holds no records"));
    }
    let k = header.top_k as usize;
    let buffers = if a.buffers.is_empty() { vec![k, 2 * k, 4 * k] } else { a.buffers.clone() };
    let max = hisparse_memory::slot_table::MAX_BUFFER_SLOTS;
    for &b in &buffers {
        if b < k.max(1) || b > max {
            return Err(BenchError::flag(
                "buffers",
                b,
                format!("buffer sizes must be in the trace's top_k ({k})..={max} (a step's selection must fit)"),
            ));
        }
    }
    guard::within("row-bytes", a.row_bytes, 0, 1 << 20)?;
    for p in &a.policies {
        hisparse_policy::policy::by_name(p, a.seed).map_err(|e| BenchError::flag("policies", p, e.to_string()))?;
    }
    guard::memory(
        "trace",
        a.trace.display(),
        "replaying this trace (its longest sequence)",
        memory_estimate(&records),
    )?;
    let stem = a.trace.file_stem().map_or("trace".into(), |s| s.to_string_lossy().into_owned());
    let dir = a.out.clone().unwrap_or_else(|| PathBuf::from("results").join(format!("simulate-{stem}")));
    let out = OutputDir::prepare("out", &dir)?;
    let cfg =
        SimConfig { policies: a.policies.clone(), buffer_sizes: buffers.clone(), seed: a.seed, row_bytes: a.row_bytes };
    let streams = {
        let mut s: Vec<(u64, u32)> = records.iter().map(|r| (r.request, r.layer)).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    };
    let bar = progress::bar(streams.saturating_mul(a.policies.len() * buffers.len() + 1) as u64, "streams replayed");
    let report = match simulate_with(&header, &records, &cfg, &|n| bar.set_position(n), &interrupt::requested) {
        Err(PolicyError::Cancelled) => return Err(BenchError::Interrupted("replaying the trace".into())),
        r => r?,
    };
    bar.finish_and_clear();
    out.write_json("simulate.json", &report)?;
    let mut csv = Csv::new(&[
        "policy",
        "buffer_slots",
        "selected",
        "misses",
        "miss_ratio",
        "bytes_fetched",
        "mean_misses_per_request_step",
        "p50",
        "p99",
        "max",
        "mean_misses_per_batch_step",
        "batch_p99",
        "batch_max",
    ]);
    for r in &report.results {
        let (d, b) = (&r.misses_per_request_step, &r.misses_per_batch_step);
        csv.row([
            r.policy.clone(),
            r.buffer_slots.to_string(),
            r.selected.to_string(),
            r.misses.to_string(),
            format!("{:.6}", r.miss_ratio),
            r.bytes_fetched.to_string(),
            format!("{:.3}", d.mean),
            format!("{}", d.p50),
            format!("{}", d.p99),
            format!("{}", d.max),
            format!("{:.3}", b.mean),
            format!("{}", b.p99),
            format!("{}", b.max),
        ]);
    }
    out.write("simulate.csv", csv.text().as_bytes())?;
    plots(&report, &buffers, &a.trace, &out)?;
    Ok((report, out.keep()))
}

fn plots(report: &SimReport, buffers: &[usize], trace: &std::path::Path, out: &OutputDir) -> Result<()> {
    let name = trace.file_name().map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    let mut names: Vec<&str> =
        report.results.iter().map(|r| r.policy.as_str()).filter(|p| *p != "compulsory").collect();
    names.dedup();
    let mut curves: Vec<Series> = names
        .iter()
        .map(|p| Series {
            label: (*p).to_string(),
            points: report
                .results
                .iter()
                .filter(|r| r.policy == *p)
                .map(|r| (r.buffer_slots as f64, 100.0 * r.miss_ratio))
                .collect(),
            dashed: *p == "belady",
            ..Series::default()
        })
        .collect();
    if let Some(c) = report.results.iter().find(|r| r.policy == "compulsory") {
        let (lo, hi) = (*buffers.iter().min().unwrap_or(&1) as f64, *buffers.iter().max().unwrap_or(&1) as f64);
        curves.push(Series {
            label: "compulsory (infinite buffer)".into(),
            points: vec![(lo, 100.0 * c.miss_ratio), (hi, 100.0 * c.miss_ratio)],
            dashed: true,
            ..Series::default()
        });
    }
    let title = format!("Miss ratio vs buffer size: {name}, top_k {}", report.header.top_k);
    let chart = Chart {
        title: &title,
        x_label: "device buffer slots per request and layer",
        y_label: "misses (% of selected tokens)",
        log_x: true,
        markers: &[],
    };
    out.write("miss_ratio.svg", line_chart(&chart, &curves)?.as_bytes())?;
    // Misses per step over time: the first policy at every buffer size.
    if let Some(first) = names.first() {
        let lines = report
            .results
            .iter()
            .filter(|r| r.policy == *first)
            .map(|r| (format!("{} {} slots", r.policy, r.buffer_slots), r.series.clone()));
        let title = format!("Misses per step over time: {name}, {first}");
        out.write("misses_over_time.svg", misses_over_time(&title, lines, &[])?.as_bytes())?;
    }
    Ok(())
}

/// The report as a table.
pub fn render(r: &SimReport, out: &std::path::Path) -> String {
    let mut s = format!(
        "{} records, {} streams, {} steps, top_k {}, {} B per row\n\n{:<11} {:>7} {:>9} {:>12} {:>12} {:>9} {:>9} {:>11}\n",
        r.records,
        r.streams,
        r.steps,
        r.header.top_k,
        r.row_bytes,
        "policy",
        "slots",
        "miss %",
        "misses/step",
        "batch p99",
        "max",
        "MB moved",
        "vs belady"
    );
    for x in &r.results {
        let bel = r.results.iter().find(|b| b.policy == "belady" && b.buffer_slots == x.buffer_slots);
        let vs = bel
            .filter(|b| b.misses > 0)
            .map_or("-".to_string(), |b| format!("{:.2}x", x.misses as f64 / b.misses as f64));
        let slots = if x.buffer_slots == 0 { "inf".to_string() } else { x.buffer_slots.to_string() };
        s += &format!(
            "{:<11} {:>7} {:>8.2}% {:>12.1} {:>12.0} {:>9.0} {:>9.1} {:>11}\n",
            x.policy,
            slots,
            100.0 * x.miss_ratio,
            x.misses_per_request_step.mean,
            x.misses_per_batch_step.p99,
            x.misses_per_batch_step.max,
            x.bytes_fetched as f64 / 1e6,
            vs
        );
    }
    s += &format!("\nwrote {}/{{simulate.json, simulate.csv, miss_ratio.svg, misses_over_time.svg}}\n", out.display());
    s
}
