//! `hisparse replot`: a sweep's tables, CSV and plots again from its `sweep.json` (a run on a
//! machine whose plots did not come back, or plots after a change to the charts), into a
//! folder of their own — the JSON it reads is never written.

use std::path::PathBuf;

use super::sweep::SweepReport;
use crate::error::{BenchError, Result};
use crate::report::OutputDir;

/// The command's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplotArgs {
    /// A `sweep.json` written by `hisparse sweep`.
    pub sweep_json: PathBuf,
    /// Folder for the copy of the JSON, the CSV and the plots (default: next to the JSON, in
    /// `replot/`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Reads the report and writes its outputs; returns it and the folder.
pub fn run(a: &ReplotArgs) -> Result<(SweepReport, PathBuf)> {
    let text = std::fs::read_to_string(&a.sweep_json)
        .map_err(|e| BenchError::flag("sweep_json", a.sweep_json.display(), format!("cannot be read ({e})")))?;
    let report: SweepReport = serde_json::from_str(&text)
        .map_err(|e| BenchError::flag("sweep_json", a.sweep_json.display(), format!("is not a sweep report ({e})")))?;
    let dest = match &a.out {
        Some(d) => d.clone(),
        None => a.sweep_json.parent().map_or_else(|| PathBuf::from("replot"), |p| p.join("replot")),
    };
    if std::fs::canonicalize(&dest).ok() == a.sweep_json.parent().and_then(|p| std::fs::canonicalize(p).ok()) {
        return Err(BenchError::flag("out", dest.display(), "is the folder of the JSON it reads; pick another"));
    }
    let out = OutputDir::prepare("out", &dest)?;
    super::sweep_output::write(&report, &out)?;
    Ok((report, out.keep()))
}
