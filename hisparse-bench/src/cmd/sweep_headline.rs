//! The sweep's headline per context: **capacity** (requests that fit, hisparse over resident),
//! **efficiency** (hisparse's tokens/s over the swap-in-free bound's at the same concurrency,
//! where `--bound` measured it) and the peak-against-peak ratio, with the table and the JSON
//! record ([`Headline`]) that hold them.

use super::common::NO_COPIES;
use super::sweep_data::{Headline, Point, SweepMode, SweepReport};

fn series(r: &SweepReport, c: usize, m: SweepMode) -> Vec<&Point> {
    r.points.iter().filter(|p| p.context == c && p.mode == m).collect()
}

fn best(ps: &[&Point]) -> f64 {
    ps.iter().map(|p| p.tokens_per_s).fold(0.0, f64::max)
}

/// The headline of every context that measured both modes.
pub fn headlines(r: &SweepReport) -> Vec<Headline> {
    let mut contexts: Vec<usize> = r.points.iter().map(|p| p.context).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let mut out = Vec::new();
    for c in contexts {
        let (res, hs, bound) =
            (series(r, c, SweepMode::Resident), series(r, c, SweepMode::HiSparse), series(r, c, SweepMode::Bound));
        let running = |ps: &[&Point]| ps.iter().map(|p| p.running).fold(0.0, f64::max);
        let (rr, hr) = (running(&res), running(&hs));
        if res.is_empty() || hs.is_empty() || rr <= 0.0 || best(&res) <= 0.0 {
            continue;
        }
        // The first level at which hisparse ran (within a tenth of a request) its most.
        let Some(top) = hs.iter().filter(|p| p.running >= hr - 0.1).min_by_key(|p| p.concurrency) else { continue };
        let efficiency = bound
            .iter()
            .find(|b| b.concurrency == top.concurrency && b.tokens_per_s > 0.0)
            .map(|b| top.tokens_per_s / b.tokens_per_s);
        out.push(Headline {
            context: c,
            resident_running: rr,
            hisparse_running: hr,
            capacity: hr / rr,
            at_concurrency: top.concurrency,
            efficiency,
            peak_ratio: best(&hs) / best(&res),
            bound_peak_ratio: (!bound.is_empty()).then(|| best(&bound) / best(&res)),
        });
    }
    out
}

/// The bound's table (empty without `--bound`): per point, the bound's tokens/s and
/// hisparse's over it.
pub fn render_bound(r: &SweepReport) -> String {
    if !r.points.iter().any(|p| p.mode == SweepMode::Bound) {
        return String::new();
    }
    let mut s = format!(
        "\nswap-in-free bound ({NO_COPIES}):\n{:>8} {:>11} {:>9} {:>26} {:>14}\n",
        "context", "concurrency", "running", "bound tok/s", "hisparse/bound"
    );
    for b in r.points.iter().filter(|p| p.mode == SweepMode::Bound) {
        let hs = r
            .points
            .iter()
            .find(|p| p.mode == SweepMode::HiSparse && p.context == b.context && p.concurrency == b.concurrency);
        let eff = match hs {
            Some(h) if b.tokens_per_s > 0.0 => format!("{:.3}", h.tokens_per_s / b.tokens_per_s),
            _ => "-".into(),
        };
        s += &format!(
            "{:>8} {:>11} {:>9.1} {:>26} {:>14}\n",
            b.context,
            b.concurrency,
            b.running,
            b.tokens_per_s_cell(),
            eff
        );
    }
    s
}

/// The headline lines (empty where no context measured both modes).
pub fn render_headline(r: &SweepReport) -> String {
    let mut s = String::new();
    for h in headlines(r) {
        let eff = h.efficiency.map_or_else(
            || "efficiency not measured (--bound)".to_owned(),
            |e| format!("efficiency {e:.3} at {} requests", h.at_concurrency),
        );
        let product = h.efficiency.map_or_else(String::new, |e| format!(" = {:.2}x", h.capacity * e));
        s += &format!(
            "context {}: capacity {:.2}x ({:.1} -> {:.1} requests) x {eff}{product}; peak against peak {:.2}x{}\n",
            h.context,
            h.capacity,
            h.resident_running,
            h.hisparse_running,
            h.peak_ratio,
            h.bound_peak_ratio.map_or_else(String::new, |b| format!(" (the bound's {b:.2}x)"))
        );
    }
    if !s.is_empty() {
        s.insert_str(0, "\nheadline (capacity: most requests running, hisparse over resident):\n");
    }
    s
}
