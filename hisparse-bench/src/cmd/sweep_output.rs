//! What `hisparse sweep` writes and prints: JSON, CSV, the tables, and four plots — throughput
//! against requested concurrency with each point's spread, above the requests each mode really
//! ran at once (the capacity effect the system is for); the rows moved host to device per step
//! (on the critical path and prefetched); misses per step over time with the concurrency levels
//! marked; and the misses of a replayed trace at several buffer sizes.

use super::common::NO_COPIES;
use super::sweep_data::{Point, SweepMode, SweepReport};
use crate::error::Result;
use crate::files::OutputDir;
use crate::guard::human_bytes;
use crate::report::Csv;
use crate::report::plot::{Chart, Marker, Series, line_chart, misses_over_time, stacked_charts};

fn contexts(r: &SweepReport) -> Vec<usize> {
    let mut c: Vec<usize> = r.points.iter().map(|p| p.context).collect();
    c.sort_unstable();
    c.dedup();
    c
}

fn context_list(r: &SweepReport) -> String {
    contexts(r).iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Writes sweep.json, sweep.csv and the plots into `out`.
pub fn write(r: &SweepReport, out: &OutputDir) -> Result<()> {
    out.write_json("sweep.json", r)?;
    let mut csv = Csv::new(&[
        "context",
        "concurrency",
        "mode",
        "running",
        "tokens_per_s",
        "tokens_per_s_min",
        "tokens_per_s_max",
        "step_ms",
        "misses_per_step",
        "miss_ratio",
        "swap_in_share",
        "kernel_ms",
        "h2d_mb_per_step",
        "prefetch_mb_per_step",
        "h2d_gb_per_s",
        "prefetch_useful_share",
    ]);
    for p in &r.points {
        csv.row([
            p.context.to_string(),
            p.concurrency.to_string(),
            p.mode.to_string(),
            format!("{:.2}", p.running),
            format!("{:.2}", p.tokens_per_s),
            format!("{:.2}", p.tokens_per_s_min),
            format!("{:.2}", p.tokens_per_s_max),
            format!("{:.3}", p.step_ms),
            format!("{:.1}", p.misses_per_step),
            format!("{:.5}", p.miss_ratio),
            format!("{:.4}", p.swap_in_share),
            format!("{:.3}", p.kernel_ms),
            format!("{:.3}", p.h2d_mb_per_step),
            format!("{:.3}", p.prefetch_mb_per_step),
            format!("{:.2}", p.h2d_gb_per_s),
            format!("{:.4}", p.prefetch_useful_share),
        ]);
    }
    out.write("sweep.csv", csv.text().as_bytes())?;
    out.write("throughput.svg", throughput_svg(r)?.as_bytes())?;
    if has_hisparse(r) {
        out.write("transfers.svg", transfers_svg(r)?.as_bytes())?;
    }
    let markers: Vec<Marker> =
        r.level_starts.iter().map(|&(n, at)| Marker { x: at as f64, label: format!("{n} req") }).collect();
    if !r.misses_over_time.is_empty() {
        let title =
            format!("Misses per step over time: {}, hisparse (measured), context {}", r.preset, context_list(r));
        out.write(
            "misses_over_time.svg",
            misses_over_time(&title, r.misses_over_time.iter().cloned(), &markers)?.as_bytes(),
        )?;
    }
    if !r.misses_by_buffer.is_empty() {
        let level = r.level_starts.last().map_or(0, |l| l.0);
        let first = contexts(r).first().copied().unwrap_or(0);
        let title =
            format!("LRU misses by buffer size: {}, context {first}, {level} requests (replayed trace)", r.preset);
        let lines = r.misses_by_buffer.iter().map(|(b, v)| (format!("LRU, {b} slots"), v.clone()));
        out.write("misses_by_buffer.svg", misses_over_time(&title, lines, &[])?.as_bytes())?;
    }
    Ok(())
}

/// The throughput chart above the running-requests chart, one colour per context, resident
/// dashed.
fn throughput_svg(r: &SweepReport) -> Result<String> {
    let (mut tput, mut running) = (Vec::new(), Vec::new());
    for (ci, &c) in contexts(r).iter().enumerate() {
        let modes = [SweepMode::Resident, SweepMode::HiSparse, SweepMode::Bound, SweepMode::Hybrid];
        for (mi, mode) in modes.into_iter().enumerate() {
            let pts: Vec<_> = r.points.iter().filter(|p| p.context == c && p.mode == mode).collect();
            if pts.is_empty() {
                continue; // a sweep of one mode, or without the bound
            }
            let color = Some(modes.len() * ci + mi);
            let label = match mode {
                SweepMode::Bound => format!("bound (no swap-in copies; timing only), context {c}"),
                m => format!("{m}, context {c}"),
            };
            tput.push(Series {
                label: label.clone(),
                points: pts.iter().map(|p| (p.concurrency as f64, p.tokens_per_s)).collect(),
                spread: pts.iter().map(|p| (p.tokens_per_s_min, p.tokens_per_s_max)).collect(),
                dashed: !matches!(mode, SweepMode::HiSparse | SweepMode::Hybrid),
                color,
            });
            running.push(Series {
                label,
                points: pts.iter().map(|p| (p.concurrency as f64, p.running)).collect(),
                dashed: !matches!(mode, SweepMode::HiSparse | SweepMode::Hybrid),
                color,
                ..Series::default()
            });
        }
    }
    let emulated = if r.emulation.starts_with("none") { "attention only" } else { "non-attention part emulated" };
    let title = format!(
        "Decode throughput: {}, context {}, {}, {emulated}",
        r.preset,
        context_list(r),
        r.backend.to_uppercase()
    );
    let top = Chart {
        title: &title,
        x_label: "requests submitted (concurrency)",
        y_label: "decode tokens / s (median, min-max of windows)",
        log_x: true,
        markers: &[],
    };
    let bottom_title = format!("Requests decoding at once: {} (the rest wait for capacity)", r.preset);
    let bottom = Chart {
        title: &bottom_title,
        x_label: "requests submitted (concurrency)",
        y_label: "requests running",
        log_x: true,
        markers: &[],
    };
    stacked_charts((&top, &tput), (&bottom, &running))
}

/// Hisparse's rows host to device per step against concurrency, one colour per context: the
/// misses (on the critical path) solid, the prefetched rows dashed (where a prefetcher ran).
fn transfers_svg(r: &SweepReport) -> Result<String> {
    let mut series = Vec::new();
    for (ci, &c) in contexts(r).iter().enumerate() {
        let pts: Vec<_> = r.points.iter().filter(|p| p.context == c && p.mode == SweepMode::HiSparse).collect();
        let line = |label: String, f: fn(&Point) -> f64, dashed: bool| Series {
            label,
            points: pts.iter().map(|p| (p.concurrency as f64, f(p))).collect(),
            dashed,
            color: Some(2 * ci + 1),
            ..Series::default()
        };
        series.push(line(format!("misses, context {c}"), |p| p.h2d_mb_per_step, false));
        if pts.iter().any(|p| p.prefetch_mb_per_step > 0.0) {
            series.push(line(format!("prefetched, context {c}"), |p| p.prefetch_mb_per_step, true));
        }
    }
    let title = format!("Rows host to device per step: {}, hisparse, {}", r.preset, r.backend.to_uppercase());
    let chart = Chart {
        title: &title,
        x_label: "requests submitted (concurrency)",
        y_label: "MB per step",
        log_x: true,
        markers: &[],
    };
    line_chart(&chart, &series)
}

/// The hierarchy's policies in a line: eviction, prefetcher, who fills the misses (`fill`, the
/// backend's form).
pub fn hierarchy(hs: &hisparse_policy::HiSparseConfig, fill: hisparse_kernels::MissFill, backend: &str) -> String {
    use hisparse_kernels::MissFill;
    // Under a policy that reads scores `auto` lets the attention fill instead of deferring.
    let reads_scores = hs.online_policy().is_ok_and(|p| p.needs_scores());
    let fill = match (backend == "cuda", fill) {
        (_, MissFill::NoCopies { .. }) => {
            return format!("{} eviction, prefetcher {}, misses NOT copied ({NO_COPIES})", hs.eviction, hs.prefetch);
        }
        (false, _) | (true, MissFill::SwapIn) => "swap-in".to_owned(),
        (true, MissFill::HitsFirst) => "deferred swap-in, the attention over the hits while the misses are \
             gathered into device staging rows, then over the misses and an LSE merge"
            .to_owned(),
        (true, MissFill::CopyEngine { share, .. }) => format!(
            "deferred swap-in (host threads gather them into pinned rows, {:.1}% of the selection per layer, \
             which the copy engine copies to device staging rows for the attention)",
            100.0 * share
        ),
        (true, MissFill::DeferredGather) => {
            "deferred swap-in (its first kernel gathers them into device staging rows for the attention)".to_owned()
        }
        (true, MissFill::Deferred) => "deferred swap-in (the attention reads them from the host tier)".to_owned(),
        (true, MissFill::Auto { max_batch: n }) if !reads_scores => format!(
            "deferred swap-in in batches of at most {n} requests (the attention reads them from the host tier), \
             else the swap-in"
        ),
        (true, MissFill::Attention) => "attention".to_owned(),
        (true, MissFill::Auto { max_batch: n }) => {
            format!("attention in batches of at most {n} requests, else the swap-in")
        }
    };
    format!("{} eviction, prefetcher {}, misses filled by the {fill}", hs.eviction, hs.prefetch)
}

/// The sweep as a table.
pub fn render(r: &SweepReport, out: &std::path::Path) -> String {
    let tiers: Vec<String> = r.device_tier_bytes.iter().map(|(m, b)| format!("{m} {}", human_bytes(*b))).collect();
    let mut s = format!(
        "hisparse sweep: {} geometry, {} backend, buffer {} slots, host tier {}\n\
         hierarchy: {}\n\
         device KV budget {} (tiers hold: {})\nmodel: {}\n\
         each point: median of {} windows of {} steps [min-max]\n",
        r.preset,
        r.backend,
        r.device_buffer_size,
        human_bytes(r.host_tier_bytes),
        r.hierarchy,
        human_bytes(r.device_kv_bytes),
        tiers.join(", "),
        r.emulation,
        r.windows,
        r.window,
    );
    // The two modes' table, where the sweep ran either (a hybrid-only sweep has its own table).
    let two_modes = r.points.iter().any(|p| matches!(p.mode, SweepMode::Resident | SweepMode::HiSparse));
    let mut keys: Vec<(usize, usize)> =
        r.points.iter().filter(|_| two_modes).map(|p| (p.context, p.concurrency)).collect();
    keys.sort_unstable();
    keys.dedup();
    if two_modes {
        s += &two_modes_header();
    }
    if r.gpus > 1 || r.points.iter().any(|p| p.exchange_mb_per_step > 0.0) {
        let x = r.points.iter().map(|p| p.exchange_mb_per_step).fold(0.0, f64::max);
        // The collectives' time is theirs only where layers are launched one by one.
        let share =
            r.points.iter().filter(|p| p.step_ms > 0.0).map(|p| p.stages_ms.exchange / p.step_ms).fold(0.0, f64::max);
        let timed = if share > 0.0 {
            format!(", at most {:.1}% of a step in the layers launched one by one", 100.0 * share)
        } else {
            String::new()
        };
        s.insert_str(
            s.find("each point:").unwrap_or(0),
            &format!(
                "deployment: {} GPU{}, one engine each (requests round robin, host tier divided); tok/s summed \
                 over them, a step their slowest; collectives up to {x:.2} MB per rank and step{timed}\n",
                r.gpus,
                if r.gpus == 1 { "" } else { "s" }
            ),
        );
    }
    let cell = Point::tokens_per_s_cell;
    for (c, n) in keys {
        let get = |m: SweepMode| r.points.iter().find(|p| p.context == c && p.concurrency == n && p.mode == m);
        let (res, hs) = (get(SweepMode::Resident), get(SweepMode::HiSparse));
        let ratio = match (res, hs) {
            (Some(res), Some(hs)) if res.tokens_per_s > 0.0 => format!("{:.2}x", hs.tokens_per_s / res.tokens_per_s),
            _ => "-".into(),
        };
        // A sweep of one mode leaves the other's columns as "-".
        let running = |p: Option<&Point>| p.map_or_else(|| "-".into(), |p| format!("{:.1}", p.running));
        s += &format!(
            "{:>8} {:>11} {:>9} {:>9} {:>26} {:>26} {:>7} {:>10}\n",
            c,
            n,
            running(res),
            running(hs),
            res.map_or_else(|| "-".into(), cell),
            hs.map_or_else(|| "-".into(), cell),
            ratio,
            hs.map_or_else(|| "-".into(), |h| format!("{:.2}%", 100.0 * h.miss_ratio))
        );
    }
    if two_modes {
        s += "\n(resident / hisparse: requests decoding at once; the rest waited for capacity)\n";
    }
    s += &hybrid_table(r);
    s += &super::sweep_headline::render_bound(r);
    s += &super::sweep_headline::render_headline(r);
    if has_hisparse(r) {
        s += &transfers(r);
    }
    // The plots `write` made.
    let plots: Vec<String> = [
        ("throughput.svg", true),
        ("transfers.svg", has_hisparse(r)),
        ("misses_over_time.svg", !r.misses_over_time.is_empty()),
        ("misses_by_buffer.svg", !r.misses_by_buffer.is_empty()),
    ]
    .iter()
    .filter(|(_, made)| *made)
    .map(|(f, _)| format!("{}/{f}", out.display()))
    .collect();
    s += &format!("wrote {}/sweep.json, sweep.csv\nplots: {}\n", out.display(), plots.join(", "));
    s
}

/// The header of the resident and hisparse table.
fn two_modes_header() -> String {
    format!(
        "\n{:>8} {:>11} {:>9} {:>9} {:>26} {:>26} {:>7} {:>10}\n",
        "context", "concurrency", "resident", "hisparse", "resident tok/s", "hisparse tok/s", "ratio", "hs miss %"
    )
}

/// Hybrid placement's points (`--mode hybrid` or `all`) against both other modes at the same
/// concurrency; empty where the sweep did not run it.
fn hybrid_table(r: &SweepReport) -> String {
    let hybrid: Vec<&Point> = r.points.iter().filter(|p| p.mode == SweepMode::Hybrid).collect();
    if hybrid.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\nhybrid placement (whole KV on the device while it has room):\n{:>8} {:>11} {:>8} {:>26} {:>12} {:>12} {:>10} {:>8}\n",
        "context", "concurrency", "running", "hybrid tok/s", "vs resident", "vs hisparse", "vs better", "miss %"
    );
    for h in hybrid {
        let peer = |m: SweepMode| {
            r.points
                .iter()
                .find(|p| p.mode == m && p.context == h.context && p.concurrency == h.concurrency)
                .map(|p| p.tokens_per_s)
                .filter(|&t| t > 0.0)
        };
        let ratio = |t: Option<f64>| t.map_or_else(|| "-".into(), |t| format!("{:.2}x", h.tokens_per_s / t));
        let (res, hs) = (peer(SweepMode::Resident), peer(SweepMode::HiSparse));
        // The better of the two modes at this point (the goal's reference).
        let better = res.into_iter().chain(hs).reduce(f64::max);
        s += &format!(
            "{:>8} {:>11} {:>8.1} {:>26} {:>12} {:>12} {:>10} {:>7.2}%\n",
            h.context,
            h.concurrency,
            h.running,
            h.tokens_per_s_cell(),
            ratio(res),
            ratio(hs),
            ratio(better),
            100.0 * h.miss_ratio
        );
    }
    s
}

/// Whether the sweep measured the hisparse mode (`--mode` may leave it out).
fn has_hisparse(r: &SweepReport) -> bool {
    r.points.iter().any(|p| p.mode == SweepMode::HiSparse)
}

/// The hisparse points' step times and transfers: step and swap-in stage times (the swap-in
/// stage is timed per layer only where layers are launched one by one: `--no-graphs`), rows
/// moved host to device on and off the critical path, the bandwidth they used, and how many
/// prefetched rows a selection used.
fn transfers(r: &SweepReport) -> String {
    let mut s = format!(
        "\nhisparse transfers per step:\n{:>8} {:>11} {:>8} {:>11} {:>12} {:>13} {:>8} {:>14}\n",
        "context", "concurrency", "step ms", "swap-in ms", "misses MB", "prefetch MB", "GB/s", "prefetch used"
    );
    for p in r.points.iter().filter(|p| p.mode == SweepMode::HiSparse) {
        let used =
            if p.prefetched_per_step > 0.0 { format!("{:.1}%", 100.0 * p.prefetch_useful_share) } else { "-".into() };
        s += &format!(
            "{:>8} {:>11} {:>8.2} {:>11.3} {:>12.2} {:>13.2} {:>8.2} {:>14}\n",
            p.context,
            p.concurrency,
            p.step_ms,
            p.stages_ms.swap_in,
            p.h2d_mb_per_step,
            p.prefetch_mb_per_step,
            p.h2d_gb_per_s,
            used
        );
    }
    if r.points.iter().any(|p| p.mode == SweepMode::HiSparse && p.stages_ms.graph > 0.0) {
        s += "(swap-in ms: layer 0 only, the other layers replayed as one graph; --no-graphs times every layer)\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::hierarchy;
    use hisparse_policy::HiSparseConfig;

    #[test]
    fn the_hierarchy_line_names_who_fills_the_misses() {
        let with = |policy: &str| HiSparseConfig { eviction: policy.parse().unwrap(), ..HiSparseConfig::default() };
        let form = |fill: &str| fill.parse::<hisparse_kernels::MissFillMode>().unwrap().into();
        let line = |fill, policy, backend| hierarchy(&with(policy), form(fill), backend);
        assert!(line("auto", "lru", "cuda").ends_with("deferred swap-in in batches of at most 8 requests (the attention reads them from the host tier), else the swap-in"));
        assert!(
            line("auto", "score", "cuda").ends_with("attention in batches of at most 8 requests, else the swap-in")
        );
        assert!(
            line("deferred", "lru", "cuda").ends_with("deferred swap-in (the attention reads them from the host tier)")
        );
        assert!(line("attention", "lru", "cuda").ends_with("misses filled by the attention"));
        assert!(
            line("deferred-gather", "lru", "cuda")
                .ends_with("gathers them into device staging rows for the attention)")
        );
        assert!(line("copy-engine", "lru", "cuda").contains("12.5% of the selection per layer, which the copy engine"));
        // The CPU backend copies whatever the setting.
        assert!(line("deferred", "lru", "cpu").ends_with("misses filled by the swap-in"));
    }
}
