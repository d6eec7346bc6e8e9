//! Results as documents: SVG line charts (`plot.rs`) and CSV files; where they are written is
//! `files`' concern.

pub mod plot;

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
