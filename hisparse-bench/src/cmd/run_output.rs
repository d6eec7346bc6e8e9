//! What `hisparse run` writes into its output folder, whichever input it decoded (the emulated
//! workload or a real model): `run.json` (the summaries and every step) and `steps.csv`.

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
    Ok(())
}
