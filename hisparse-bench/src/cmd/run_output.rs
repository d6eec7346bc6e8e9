//! What `hisparse run` writes into its output folder, whichever input it decoded (the emulated
//! workload or a real model): `run.json` (the summaries and every step) and `steps.csv`; for a
//! load sweep (several `--arrival-rate`s) also `load.csv` (latency percentiles per load and
//! mode) and `latency.svg` (latency against offered load, a line per mode).

use super::run_args::ModeRun;
use crate::error::Result;
use crate::files::OutputDir;
use crate::report::Csv;

/// Writes `runs` into `out`: run.json (the summaries and every step) and steps.csv.
pub fn write_outputs(out: &OutputDir, runs: &[ModeRun]) -> Result<()> {
    out.write_json("run.json", &runs)?;
    let mut csv = Csv::new(&[
        "mode",
        "step",
        "seconds",
        "tokens",
        "running",
        "queued",
        "hits",
        "misses",
        "max_misses",
        "bytes_h2d",
        "bytes_d2h",
        "prefetched",
        "prefetch_useful",
        "prefetch_wasted",
        "bytes_h2d_prefetch",
        "indexer_s",
        "top_k_s",
        "swap_in_s",
        "attention_s",
        "backup_s",
        "append_s",
        "device_bytes",
        "host_bytes",
    ]);
    for r in runs {
        for s in &r.steps {
            let st = &s.stages;
            csv.row([
                r.mode.to_string(),
                s.step.to_string(),
                format!("{:.6}", s.seconds),
                s.tokens.to_string(),
                s.running.to_string(),
                s.queued.to_string(),
                s.swap.hits.to_string(),
                s.swap.misses.to_string(),
                s.swap.max_misses.to_string(),
                s.swap.bytes_h2d.to_string(),
                s.bytes_d2h.to_string(),
                s.swap.prefetched.to_string(),
                s.swap.prefetch_useful.to_string(),
                s.swap.prefetch_wasted.to_string(),
                s.swap.bytes_h2d_prefetch.to_string(),
                format!("{:.6}", st.indexer),
                format!("{:.6}", st.top_k),
                format!("{:.6}", st.swap_in),
                format!("{:.6}", st.attention),
                format!("{:.6}", st.backup),
                format!("{:.6}", st.append),
                s.device_bytes_in_use.to_string(),
                s.host_bytes_in_use.to_string(),
            ]);
        }
    }
    out.write("steps.csv", csv.text().as_bytes())?;
    if is_load_sweep(runs) {
        out.write("load.csv", load_csv(runs).as_bytes())?;
        out.write("latency.svg", latency_plot(runs)?.as_bytes())?;
    }
    Ok(())
}

/// The offered loads of `runs` (requests per second), ascending, each once.
fn loads(runs: &[ModeRun]) -> Vec<f64> {
    let mut rates: Vec<f64> = runs.iter().filter_map(|r| r.arrival_rate).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates
}

/// Whether `runs` are a load sweep (several offered loads: `--arrival-rate R1,R2,...`).
pub fn is_load_sweep(runs: &[ModeRun]) -> bool {
    loads(runs).len() > 1
}

/// The most requests that waited for capacity at once in `r` (0: none ever waited).
pub fn max_waiting(r: &ModeRun) -> usize {
    r.steps.iter().map(|s| s.queued).max().unwrap_or(0)
}

/// Per mode, the lowest offered load at which requests waited for capacity (its memory or the
/// batch cap full: it saturates there), or `None` if none waited at any load.
pub fn first_waiting_load(runs: &[ModeRun]) -> Vec<(hisparse_memory::Mode, Option<f64>)> {
    let mut modes: Vec<hisparse_memory::Mode> = Vec::new();
    for r in runs {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
    }
    modes
        .into_iter()
        .map(|m| {
            let first = loads(runs)
                .into_iter()
                .find(|&l| runs.iter().any(|r| r.mode == m && r.arrival_rate == Some(l) && max_waiting(r) > 0));
            (m, first)
        })
        .collect()
}

/// A load sweep's table: per offered load and mode, the requests, what waited, throughput and
/// the latency percentiles (ms).
fn load_csv(runs: &[ModeRun]) -> String {
    let mut csv = Csv::new(&[
        "arrival_rate",
        "mode",
        "finished",
        "rejected",
        "refused",
        "max_waiting",
        "tokens_per_s",
        "first_decode_p50_ms",
        "first_decode_p90_ms",
        "first_decode_p99_ms",
        "per_token_p50_ms",
        "per_token_p90_ms",
        "per_token_p99_ms",
    ]);
    for r in runs {
        let (f, t) = (&r.latency.first_decode, &r.latency.per_token);
        csv.row([
            r.arrival_rate.map_or(String::new(), |x| x.to_string()),
            r.mode.to_string(),
            r.summary.finished.to_string(),
            r.rejected.len().to_string(),
            r.refused.len().to_string(),
            max_waiting(r).to_string(),
            format!("{:.2}", r.summary.tokens_per_s),
            format!("{:.3}", 1e3 * f.p50),
            format!("{:.3}", 1e3 * f.p90),
            format!("{:.3}", 1e3 * f.p99),
            format!("{:.3}", 1e3 * t.p50),
            format!("{:.3}", 1e3 * t.p90),
            format!("{:.3}", 1e3 * t.p99),
        ]);
    }
    csv.text().to_owned()
}

/// Latency against offered load: per mode, P99 time to first decode (solid) and P99 per-token
/// latency (dashed), in ms.
fn latency_plot(runs: &[ModeRun]) -> Result<String> {
    use crate::report::plot::{Chart, Series, line_chart};
    let mut series = Vec::new();
    for (i, (mode, _)) in first_waiting_load(runs).into_iter().enumerate() {
        let of_mode: Vec<&ModeRun> = runs.iter().filter(|r| r.mode == mode && r.arrival_rate.is_some()).collect();
        let line = |p: fn(&ModeRun) -> f64| -> Vec<(f64, f64)> {
            let mut pts: Vec<(f64, f64)> = of_mode.iter().filter_map(|r| Some((r.arrival_rate?, 1e3 * p(r)))).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            pts
        };
        series.push(Series {
            label: format!("{mode}: time to first decode, P99"),
            points: line(|r| r.latency.first_decode.p99),
            color: Some(i),
            ..Default::default()
        });
        series.push(Series {
            label: format!("{mode}: per token, P99"),
            points: line(|r| r.latency.per_token.p99),
            dashed: true,
            color: Some(i),
            ..Default::default()
        });
    }
    let chart = Chart {
        title: "Latency against offered load",
        x_label: "offered load (requests per second)",
        y_label: "latency (ms)",
        log_x: true,
        markers: &[],
    };
    line_chart(&chart, &series)
}
