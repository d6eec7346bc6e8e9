//! The JSON-lines trace form, for small hand-written traces: a header line, then one record
//! per line. Blank lines and lines starting with `#` are skipped.
//!
//! ```text
//! {"hisparse_trace": 1, "top_k": 4, "layers": 2, "row_bytes": 656, "has_scores": false}
//! {"step": 1, "request": 0, "layer": 0, "seq_len": 20, "selected": [1, 5, 9, 19]}
//! ```
//!
//! Version 2 adds `score_margin` and `index_source` to the header and `near` (pairs of position
//! and score, best first) to the records:
//!
//! ```text
//! {"hisparse_trace": 2, "top_k": 2, "layers": 2, "score_margin": 2, "index_source": [0, 0]}
//! {"step": 1, "request": 0, "layer": 0, "seq_len": 20, "selected": [5, 19], "near": [[9, 0.5], [1, 0.25]]}
//! ```

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::{TraceHeader, TraceRecord};
use crate::error::{PolicyError, Result};

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine {
    hisparse_trace: u32,
    top_k: u32,
    layers: u32,
    #[serde(default)]
    row_bytes: u32,
    #[serde(default)]
    has_scores: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    score_margin: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    index_source: Vec<u32>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Reads a JSON-lines trace; errors name the line and its byte offset.
pub fn read(input: impl BufRead) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let mut header: Option<TraceHeader> = None;
    let mut records = Vec::new();
    let mut offset = 0u64;
    for (n, line) in input.lines().enumerate() {
        let at = offset;
        let line = line.map_err(|e| PolicyError::Trace { what: "unreadable", offset: at, message: e.to_string() })?;
        offset += line.len() as u64 + 1;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let bad = |e: serde_json::Error| PolicyError::Trace {
            what: "bad JSON line",
            offset: at,
            message: format!("line {}: {e}", n + 1),
        };
        match &header {
            None => {
                let h: HeaderLine = serde_json::from_str(text).map_err(bad)?;
                if !(1..=2).contains(&h.hisparse_trace) {
                    return Err(PolicyError::Trace {
                        what: "unsupported version",
                        offset: at,
                        message: format!(
                            "line {}: hisparse_trace = {}, this reader reads 1 and 2",
                            n + 1,
                            h.hisparse_trace
                        ),
                    });
                }
                let th = TraceHeader {
                    top_k: h.top_k,
                    layers: h.layers,
                    row_bytes: h.row_bytes,
                    has_scores: h.has_scores,
                    score_margin: h.score_margin,
                    index_source: h.index_source,
                };
                if h.hisparse_trace == 1 && th.is_v2() {
                    return Err(PolicyError::Trace {
                        what: "unsupported version",
                        offset: at,
                        message: format!("line {}: score_margin and index_source need hisparse_trace = 2", n + 1),
                    });
                }
                th.check(at)?;
                header = Some(th);
            }
            Some(h) => {
                let r: TraceRecord = serde_json::from_str(text).map_err(bad)?;
                r.check(h, at)?;
                records.push(r);
            }
        }
    }
    let header = header.ok_or(PolicyError::Trace { what: "truncated", offset, message: "no header line".into() })?;
    Ok((header, records))
}

/// Writes a trace as JSON lines.
pub fn write(mut out: impl Write, header: &TraceHeader, records: &[TraceRecord]) -> Result<()> {
    let io = |e: std::io::Error| PolicyError::Io { path: "trace".into(), message: e.to_string() };
    let json = |e: serde_json::Error| PolicyError::Io { path: "trace".into(), message: e.to_string() };
    let h = HeaderLine {
        hisparse_trace: if header.is_v2() { 2 } else { 1 },
        top_k: header.top_k,
        layers: header.layers,
        row_bytes: header.row_bytes,
        has_scores: header.has_scores,
        score_margin: header.score_margin,
        index_source: header.index_source.clone(),
    };
    writeln!(out, "{}", serde_json::to_string(&h).map_err(json)?).map_err(io)?;
    for r in records {
        r.check(header, 0)?;
        writeln!(out, "{}", serde_json::to_string(r).map_err(json)?).map_err(io)?;
    }
    Ok(())
}
