//! `hisparse simulate`: replay a trace under several policies, prefetchers and buffer sizes;
//! print a table and write JSON, CSV and SVG (miss ratio against buffer size; what prefetch
//! moves; misses per step over time).

use std::path::PathBuf;

use hisparse_policy::policy::BuiltinPolicy;
use hisparse_policy::prefetch::{BuiltinPrefetcher, PrefetcherConfig};
use hisparse_policy::trace::{RecordHead, TraceData};
use hisparse_policy::{
    PolicyChoice, PolicyConfig, PolicyError, PrefetcherChoice, SimConfig, SimReport, memory_estimate,
    memory_estimate_encoded, replays, simulate_encoded, simulate_with,
};

use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::report::Csv;
use crate::report::plot::{Chart, Series, line_chart, misses_over_time, stacked_charts};
use crate::{guard, interrupt, progress};

/// Options of `hisparse simulate`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// The trace (binary .hstrace or JSON lines).
    #[arg(long)]
    pub trace: PathBuf,
    /// Eviction policies, comma separated (score-aware ones need a trace with near-cut scores).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lru,fifo,random,clock,belady")]
    pub policies: Vec<BuiltinPolicy>,
    /// Prefetchers, comma separated (next-step needs a trace with near-cut candidates).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "none")]
    pub prefetchers: Vec<BuiltinPrefetcher>,
    /// Most rows a speculative prefetcher brings into one buffer per step (0: a quarter of top_k).
    #[arg(long, default_value_t = 0)]
    pub prefetch_budget: usize,
    /// Buffer sizes (regular slots), comma separated; default: 1, 2 and 4 times the trace's top_k.
    #[arg(long, value_delimiter = ',')]
    pub buffers: Vec<usize>,
    /// The policies' tunables as JSON (a file holding a PolicyConfig; see the policy crate's
    /// README); --seed overrides its seed.
    #[arg(long)]
    pub policy_config: Option<PathBuf>,
    /// Seed of the random policy.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Leading steps of every stream replayed but not counted (the buffers warm up; the
    /// per-step plot still shows them).
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// Bytes per fetched row (default: the trace's, else 656).
    #[arg(long, default_value_t = 0)]
    pub row_bytes: usize,
    /// Output folder (default: `results/simulate-NAME`, NAME being the trace file name), written
    /// whole: an earlier output of this program there is replaced, a folder holding other files
    /// is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Records in the longest (request, layer) stream of `records`.
fn longest_stream(records: &[impl RecordHead]) -> usize {
    let mut per_stream: std::collections::HashMap<(u64, u32), usize> = std::collections::HashMap::new();
    for r in records {
        *per_stream.entry((r.request(), r.layer())).or_default() += 1;
    }
    per_stream.values().copied().max().unwrap_or(0)
}

/// Runs the simulation and writes its outputs; returns the report and the output folder.
pub fn run(a: &SimulateArgs) -> Result<(SimReport, PathBuf)> {
    let mut policy_config = match &a.policy_config {
        None => PolicyConfig::default(),
        Some(p) => {
            let text = crate::files::input::read_config("policy-config", p)?;
            let c: PolicyConfig = serde_json::from_str(&text)
                .map_err(|e| BenchError::flag("policy-config", p.display(), e.to_string()))?;
            c.validate().map_err(|e| BenchError::flag("policy-config", p.display(), e.to_string()))?;
            c
        }
    };
    if let Some(seed) = a.seed {
        policy_config.seed = seed;
    }
    let policies: Vec<PolicyChoice> = a.policies.iter().map(|&p| p.into()).collect();
    let prefetchers: Vec<PrefetcherChoice> = a.prefetchers.iter().map(|&p| p.into()).collect();
    // Scores are read only when a policy or prefetcher reads them (they are most of a scored
    // trace's bytes; a version-3 file's are skipped unread).
    let mut keep_scores = prefetchers.iter().any(|p| p.make(&PrefetcherConfig::default()).needs_near());
    for p in &policies {
        keep_scores |= p.make(&policy_config)?.needs_scores();
    }
    // Without scores a binary trace's positions stay encoded: LRU and FIFO without prefetch
    // then replay each stream in one pass, decoding a record at a time.
    let trace = if keep_scores {
        let (header, records) = super::trace::read_trace_arg_with("trace", &a.trace, true)?;
        TraceData::Records(header, records)
    } else {
        super::trace::read_trace_arg_encoded("trace", &a.trace)?
    };
    let header = trace.header().clone();
    let (records, longest) = match &trace {
        TraceData::Encoded(t) => (t.records().len(), longest_stream(t.records())),
        TraceData::Records(_, r) => (r.len(), longest_stream(r)),
    };
    if records == 0 {
        return Err(BenchError::flag("trace", a.trace.display(), "holds no records"));
    }
    let k = header.top_k as usize;
    let max = hisparse_memory::slot_table::MAX_BUFFER_SLOTS;
    if k > max {
        return Err(BenchError::flag(
            "trace",
            a.trace.display(),
            format!("its top_k is {k}; a hot buffer holds at most {max} slots, so no buffer could hold a selection"),
        ));
    }
    let buffers = if a.buffers.is_empty() {
        hisparse_policy::compared_device_buffer_sizes(k).into_iter().filter(|&b| b <= max).collect()
    } else {
        a.buffers.clone()
    };
    for &b in &buffers {
        if b < k.max(1) || b > max {
            return Err(BenchError::flag(
                "buffers",
                b,
                format!("buffer sizes must be in the trace's top-k ({k})..={max} (a step's selection must fit)"),
            ));
        }
    }
    guard::within("row-bytes", a.row_bytes, 0, 1 << 20)?;
    guard::within("prefetch-budget", a.prefetch_budget, 0, max)?;
    for p in &policies {
        if p.make(&policy_config)?.needs_scores() && header.score_margin == 0 {
            return Err(BenchError::flag(
                "policies",
                p,
                "needs the scores of the candidates below the cut: record the trace with --score-margin",
            ));
        }
    }
    if a.prefetchers.contains(&BuiltinPrefetcher::NextStep) && header.score_margin == 0 {
        return Err(BenchError::flag(
            "prefetchers",
            "next-step",
            "needs the candidates below the cut: record the trace with --score-margin",
        ));
    }
    if a.warmup_steps >= longest {
        return Err(BenchError::flag(
            "warmup-steps",
            a.warmup_steps,
            format!("the trace's longest stream has {longest} steps: nothing would be counted"),
        ));
    }
    let cfg = SimConfig {
        policies,
        prefetchers,
        buffer_sizes: buffers.clone(),
        policy_config,
        prefetcher_config: PrefetcherConfig { budget: a.prefetch_budget },
        row_bytes: a.row_bytes,
        warmup_steps: a.warmup_steps,
    };
    let (estimate, replays) = match &trace {
        TraceData::Encoded(t) => (memory_estimate_encoded(t, &cfg), replays(t.records(), &cfg)),
        TraceData::Records(_, r) => (memory_estimate(r), replays(r, &cfg)),
    };
    guard::memory("trace", a.trace.display(), "replaying this trace (its longest sequence)", estimate)?;
    let stem = a.trace.file_stem().map_or("trace".into(), |s| s.to_string_lossy().into_owned());
    let dir = a.out.clone().unwrap_or_else(|| PathBuf::from("results").join(format!("simulate-{stem}")));
    let out = OutputDir::prepare("out", &dir)?;
    let bar = progress::bar(replays, "replays");
    let (tick, cancel) = (|n| bar.set_position(n), &interrupt::requested);
    let simulated = match &trace {
        TraceData::Encoded(t) => simulate_encoded(t, &cfg, &tick, cancel),
        TraceData::Records(h, r) => simulate_with(h, r, &cfg, &tick, cancel),
    };
    let report = match simulated {
        Err(PolicyError::Cancelled) => return Err(BenchError::Interrupted("replaying the trace".into())),
        r => r?,
    };
    bar.finish_and_clear();
    out.write_json("simulate.json", &report)?;
    let mut csv = Csv::new(&[
        "policy",
        "prefetcher",
        "device_buffer_size",
        "selected",
        "misses",
        "miss_ratio",
        "prefetched",
        "prefetch_useful",
        "prefetch_wasted",
        "wasted_bytes",
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
            r.prefetcher.clone(),
            r.device_buffer_size.to_string(),
            r.selected.to_string(),
            r.swap.misses.to_string(),
            format!("{:.6}", r.miss_ratio),
            r.swap.prefetched.to_string(),
            r.swap.prefetch_useful.to_string(),
            r.swap.prefetch_wasted.to_string(),
            r.wasted_bytes.to_string(),
            r.swap.bytes_h2d.to_string(),
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
    Ok((report, out.commit()?))
}

/// The label of a result line: its policy, and its prefetcher when the run had several.
fn label(r: &hisparse_policy::SimResult, with_prefetcher: bool) -> String {
    if with_prefetcher && r.policy != "compulsory" {
        format!("{} + {}", r.policy, r.prefetcher)
    } else {
        r.policy.clone()
    }
}

fn plots(report: &SimReport, buffers: &[usize], trace: &std::path::Path, out: &OutputDir) -> Result<()> {
    let name = trace.file_name().map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned());
    let lines: Vec<&hisparse_policy::SimResult> = report.results.iter().filter(|r| r.policy != "compulsory").collect();
    let any_prefetch = lines.iter().any(|r| r.prefetcher != "none");
    let mut names: Vec<String> = lines.iter().map(|r| label(r, any_prefetch)).collect();
    names.dedup();
    let mut curves: Vec<Series> = names
        .iter()
        .map(|n| Series {
            label: n.clone(),
            points: lines
                .iter()
                .filter(|r| label(r, any_prefetch) == *n)
                .map(|r| (r.device_buffer_size as f64, 100.0 * r.miss_ratio))
                .collect(),
            dashed: n.starts_with("belady"),
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
    let title = format!("Critical-path miss ratio vs buffer size: {name}, top_k {}", report.header.top_k);
    let chart = Chart {
        title: &title,
        x_label: "device buffer slots per request and layer",
        y_label: "misses (% of selected tokens)",
        log_x: true,
        markers: &[],
    };
    out.write("miss_ratio.svg", line_chart(&chart, &curves)?.as_bytes())?;
    if any_prefetch {
        out.write("prefetch.svg", prefetch_chart(report, &name)?.as_bytes())?;
    }
    // Misses per step over time: the first policy and prefetcher at every buffer size.
    if let Some(first) = lines.first() {
        let over_time = lines
            .iter()
            .filter(|r| r.policy == first.policy && r.prefetcher == first.prefetcher)
            .map(|r| (format!("{} {} slots", label(r, any_prefetch), r.device_buffer_size), r.series.clone()));
        let title = format!("Misses per step over time: {name}, {}", label(first, any_prefetch));
        out.write("misses_over_time.svg", misses_over_time(&title, over_time, &[])?.as_bytes())?;
    }
    Ok(())
}

/// What each prefetcher buys under the first policy: critical-path misses above, rows moved
/// (solid: all, misses and prefetches; dashed: wasted prefetches) below, per selected token.
fn prefetch_chart(report: &SimReport, name: &str) -> Result<String> {
    let Some(policy) = report.results.first().map(|r| r.policy.clone()) else { return Ok(String::new()) };
    let mut prefetchers: Vec<&str> =
        report.results.iter().filter(|r| r.policy == policy).map(|r| r.prefetcher.as_str()).collect();
    prefetchers.dedup();
    let pct = |n: u64, r: &hisparse_policy::SimResult| 100.0 * n as f64 / r.selected.max(1) as f64;
    let mut top = Vec::new();
    let mut bottom = Vec::new();
    for (i, p) in prefetchers.iter().enumerate() {
        let rs: Vec<_> = report.results.iter().filter(|r| r.policy == policy && r.prefetcher == *p).collect();
        top.push(Series {
            label: (*p).to_string(),
            points: rs.iter().map(|r| (r.device_buffer_size as f64, pct(r.swap.misses, r))).collect(),
            color: Some(i),
            ..Series::default()
        });
        bottom.push(Series {
            label: format!("{p}: all rows"),
            points: rs
                .iter()
                .map(|r| (r.device_buffer_size as f64, pct(r.swap.misses + r.swap.prefetched, r)))
                .collect(),
            color: Some(i),
            ..Series::default()
        });
        if *p != "none" {
            bottom.push(Series {
                label: format!("{p}: wasted"),
                points: rs.iter().map(|r| (r.device_buffer_size as f64, pct(r.swap.prefetch_wasted, r))).collect(),
                color: Some(i),
                dashed: true,
                ..Series::default()
            });
        }
    }
    let t1 = format!("Prefetch under {policy}: {name}");
    let c1 = Chart {
        title: &t1,
        x_label: "device buffer slots per request and layer",
        y_label: "critical-path misses (% of selected)",
        log_x: true,
        markers: &[],
    };
    let c2 = Chart {
        title: "Rows moved host to device",
        x_label: "device buffer slots per request and layer",
        y_label: "rows (% of selected tokens)",
        log_x: true,
        markers: &[],
    };
    stacked_charts((&c1, &top), (&c2, &bottom))
}

/// The report as a table.
pub fn render(r: &SimReport, out: &std::path::Path) -> String {
    let any_prefetch = r.results.iter().any(|x| x.prefetcher != "none");
    let mut s = format!(
        "{} records, {} streams, {} steps, top_k {}, {} B per row\n\n{:<11} {:<15}{:>7} {:>9} {:>12} {:>10} {:>6} {:>9} {:>10} {:>10}\n",
        r.records,
        r.streams,
        r.steps,
        r.header.top_k,
        r.row_bytes,
        "policy",
        if any_prefetch { "prefetcher" } else { "" },
        "slots",
        "miss %",
        "misses/step",
        "batch p99",
        "max",
        "MB moved",
        "prefetch %",
        "vs belady"
    );
    for x in &r.results {
        let bel = r
            .results
            .iter()
            .find(|b| b.policy == "belady" && b.prefetcher == "none" && b.device_buffer_size == x.device_buffer_size);
        let vs = bel
            .filter(|b| b.swap.misses > 0)
            .map_or("-".to_string(), |b| format!("{:.2}x", x.swap.misses as f64 / b.swap.misses as f64));
        let slots = if x.device_buffer_size == 0 { "inf".to_string() } else { x.device_buffer_size.to_string() };
        let pf = if x.swap.prefetched == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.1}/{:.1}",
                100.0 * x.swap.prefetched as f64 / x.selected.max(1) as f64,
                100.0 * x.swap.prefetch_useful as f64 / x.swap.prefetched as f64
            )
        };
        s += &format!(
            "{:<11} {:<15}{:>7} {:>8.2}% {:>12.1} {:>10.0} {:>6.0} {:>9.1} {:>10} {:>10}\n",
            x.policy,
            if any_prefetch { x.prefetcher.as_str() } else { "" },
            slots,
            100.0 * x.miss_ratio,
            x.misses_per_request_step.mean,
            x.misses_per_batch_step.p99,
            x.misses_per_batch_step.max,
            x.swap.bytes_h2d as f64 / 1e6,
            pf,
            vs
        );
    }
    if any_prefetch {
        s += "\nmiss %: critical-path misses (fetched after the selection is known); prefetch %: rows prefetched\n(% of selected) / of which a selection used (%)\n";
    }
    let files = if any_prefetch {
        "simulate.json, simulate.csv, miss_ratio.svg, prefetch.svg, misses_over_time.svg"
    } else {
        "simulate.json, simulate.csv, miss_ratio.svg, misses_over_time.svg"
    };
    s += &format!("\nwrote {}/{{{files}}}\n", out.display());
    s
}
