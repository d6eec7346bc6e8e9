//! The JSON-lines trace form, for small hand-written traces: a header line, then one record
//! per line. Blank lines and lines starting with `#` are skipped.
//!
//! ```text
//! {"hisparse_trace": 1, "top_k": 4, "layers": 2, "row_bytes": 656, "has_scores": false}
//! {"step": 1, "request": 0, "layer": 0, "seq_len": 20, "selected": [1, 5, 9, 19]}
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
                if h.hisparse_trace != 1 {
                    return Err(PolicyError::Trace {
                        what: "unsupported version",
                        offset: at,
                        message: format!("line {}: hisparse_trace = {}, this reader reads 1", n + 1, h.hisparse_trace),
                    });
                }
                let th =
                    TraceHeader { top_k: h.top_k, layers: h.layers, row_bytes: h.row_bytes, has_scores: h.has_scores };
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
        hisparse_trace: 1,
        top_k: header.top_k,
        layers: header.layers,
        row_bytes: header.row_bytes,
        has_scores: header.has_scores,
    };
    writeln!(out, "{}", serde_json::to_string(&h).map_err(json)?).map_err(io)?;
    for r in records {
        r.check(header, 0)?;
        writeln!(out, "{}", serde_json::to_string(r).map_err(json)?).map_err(io)?;
    }
    Ok(())
}
