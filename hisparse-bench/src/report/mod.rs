//! Writing results: SVG line charts, CSV files and JSON, into an output folder.

pub mod plot;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{BenchError, Result};

/// Creates `dir` (and parents).
pub fn ensure_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Io { path: dir.display().to_string(), source })
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write_text(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| BenchError::Io { path: path.display().to_string(), source })?;
    Ok(path)
}

/// Writes `value` as pretty JSON to `dir/name`.
pub fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<PathBuf> {
    let text = serde_json::to_string_pretty(value).map_err(|e| BenchError::Check(format!("JSON: {e}")))?;
    write_text(dir, name, &text)
}

/// A CSV document built row by row (fields are numbers or simple names: no quoting needed,
/// commas in a field are replaced by semicolons).
#[derive(Debug, Default)]
pub struct Csv {
    text: String,
}

impl Csv {
    /// A CSV with a header row.
    pub fn new(header: &[&str]) -> Self {
        let mut c = Self::default();
        c.row(header.iter().map(|s| s.to_string()));
        c
    }

    /// Appends a row.
    pub fn row(&mut self, fields: impl IntoIterator<Item = String>) {
        let line: Vec<String> = fields.into_iter().map(|f| f.replace(',', ";")).collect();
        self.text += &line.join(",");
        self.text.push('\n');
    }

    /// The document.
    pub fn text(&self) -> &str {
        &self.text
    }
}
