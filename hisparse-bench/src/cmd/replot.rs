//! `hisparse replot`: a sweep's tables, CSV and plots again from its `sweep.json` (a run on a
//! machine whose plots did not come back, or plots after a change to the charts), into a
//! folder of their own — the JSON it reads is never written.

use std::path::PathBuf;

use super::sweep::SweepReport;
use crate::error::{BenchError, Result};
use crate::files::OutputDir;

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
    let limit = crate::files::input::memory_limit(8);
    let text = crate::files::Input::open("sweep_json", &a.sweep_json)?.read_text("the sweep report", limit)?;
    let report: SweepReport = serde_json::from_str(&text)
        .map_err(|e| BenchError::flag("sweep_json", a.sweep_json.display(), format!("is not a sweep report ({e})")))?;
    let json_dir = match a.sweep_json.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dest = a.out.clone().unwrap_or_else(|| json_dir.join("replot"));
    let (d, j) = (std::fs::canonicalize(&dest).ok(), std::fs::canonicalize(&json_dir).ok());
    if d.is_some() && d == j {
        return Err(BenchError::flag("out", dest.display(), "is the folder of the JSON it reads; pick another"));
    }
    let out = OutputDir::prepare("out", &dest)?;
    super::sweep_output::write(&report, &out)?;
    Ok((report, out.commit()?))
}
