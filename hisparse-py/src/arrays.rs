//! Selection traces from arrays: positions `[requests, steps, layers, k]` (a trace of one request
//! may drop the first axis) with -1 padding, as vLLM pads and NumPy users build them, and
//! SGLang's `indexer_topk` (base64 of little-endian int32 `[tokens, layers, top_k]`). Every
//! position is checked; a bad one is refused naming the argument and its index.

use hisparse_policy::trace::{MAX_LAYERS, MAX_TOP_K, TraceHeader, TraceRecord};
use pyo3::PyErr;

use crate::error::value;

/// Largest position or sequence length a trace takes (a request is at most 2^31 tokens).
pub const MAX_POSITION: i64 = (u32::MAX / 2) as i64;

/// The Python arguments the parts of [`Positions`] came from, for errors.
pub struct Names {
    /// The positions.
    pub selected: &'static str,
    /// The sequence lengths.
    pub seq_lens: &'static str,
    /// The first request's id.
    pub first_request: &'static str,
    /// Whether a position past its step's sequence is the positions' fault (the sequence
    /// lengths were derived, not given), named by step.
    pub derived_seq_lens: bool,
}

/// Positions of a trace as an array, with what the trace's header needs.
pub struct Positions<'a> {
    /// The elements, row-major over `shape`.
    pub data: &'a [i64],
    /// `[requests, steps, layers, k]`.
    pub shape: [usize; 4],
    /// Tokens in each request's sequence at each step, `[requests, steps]` row-major (`None`:
    /// one past the largest position selected so far).
    pub seq_lens: Option<&'a [i64]>,
    /// Positions selected per step (`None`: `k`).
    pub top_k: Option<u32>,
    /// Bytes of a KV row (for the bytes the simulator counts).
    pub row_bytes: u32,
    /// The first request's id.
    pub first_request: u64,
    /// Where each part came from.
    pub names: Names,
}

/// The trace of `p` (records by step, then request, then layer), or the first bad element.
pub fn records(p: &Positions<'_>) -> Result<(TraceHeader, Vec<TraceRecord>), PyErr> {
    let [requests, steps, layers, k] = p.shape;
    let n = &p.names;
    if layers == 0 || layers > MAX_LAYERS as usize {
        return Err(value(n.selected, format!("{layers} layers; a trace has 1..={MAX_LAYERS}")));
    }
    if k == 0 || k > MAX_TOP_K as usize {
        return Err(value(n.selected, format!("k = {k} positions per row; a trace takes 1..={MAX_TOP_K}")));
    }
    if requests == 0 || steps == 0 {
        return Err(value(n.selected, format!("{requests} requests x {steps} steps: nothing selected")));
    }
    // Request ids never wrap.
    if p.first_request.checked_add(requests as u64 - 1).is_none() {
        return Err(value(n.first_request, format!("{}: {requests} requests from it pass 2^64 - 1", p.first_request)));
    }
    let top_k = p.top_k.unwrap_or(k as u32);
    if top_k == 0 || top_k > MAX_TOP_K {
        return Err(value("top_k", format!("{top_k}: must be in 1..={MAX_TOP_K}")));
    }
    if let Some(s) = p.seq_lens
        && s.len() != requests * steps
    {
        return Err(value(n.seq_lens, format!("{} values; one per (request, step): {requests} x {steps}", s.len())));
    }
    let at = |r: usize, s: usize, l: usize| ((r * steps + s) * layers + l) * k;
    let mut out = Vec::with_capacity(requests * steps * layers);
    let mut seq = vec![1i64; requests];
    for s in 0..steps {
        for r in 0..requests {
            let mut rows = Vec::with_capacity(layers);
            let mut newest = -1i64;
            for l in 0..layers {
                let row = &p.data[at(r, s, l)..at(r, s, l) + k];
                let mut sel = Vec::with_capacity(k);
                for (j, &v) in row.iter().enumerate() {
                    let index =
                        || if requests == 1 { format!("[{s}, {l}, {j}]") } else { format!("[{r}, {s}, {l}, {j}]") };
                    match v {
                        -1 => {}
                        v if v < 0 => {
                            return Err(value(
                                &format!("{}{}", n.selected, index()),
                                format!("{v}: positions are 0 or more, -1 pads"),
                            ));
                        }
                        v if v > MAX_POSITION => {
                            return Err(value(
                                &format!("{}{}", n.selected, index()),
                                format!("{v}: positions stay below 2^31"),
                            ));
                        }
                        v => sel.push(v as u32),
                    }
                }
                sel.sort_unstable();
                if let Some(w) = sel.windows(2).find(|w| w[0] == w[1]) {
                    let index = if requests == 1 { format!("[{s}, {l}]") } else { format!("[{r}, {s}, {l}]") };
                    return Err(value(&format!("{}{index}", n.selected), format!("position {} selected twice", w[0])));
                }
                if sel.len() > top_k as usize {
                    return Err(value(
                        "top_k",
                        format!("{top_k}: step {s}, layer {l} selects {} positions", sel.len()),
                    ));
                }
                newest = newest.max(sel.last().map_or(-1, |&x| i64::from(x)));
                rows.push(sel);
            }
            let seq_len = match p.seq_lens {
                Some(given) => {
                    let v = given[r * steps + s];
                    if n.derived_seq_lens && v <= newest {
                        let index = if requests == 1 { format!("[{s}]") } else { format!("[{r}, {s}]") };
                        return Err(value(
                            &format!("{}{index}", n.selected),
                            format!(
                                "selects position {newest}, past the {v} tokens of its sequence ({} + step + 1)",
                                n.seq_lens
                            ),
                        ));
                    }
                    if !(1..=MAX_POSITION).contains(&v) || v <= newest {
                        return Err(value(
                            &format!("{}[{r}, {s}]", n.seq_lens),
                            format!("{v}: must be in 1..2^31 and above every position selected ({newest})"),
                        ));
                    }
                    // A sequence only grows.
                    if s > 0 && v < seq[r] {
                        return Err(value(
                            &format!("{}[{r}, {s}]", n.seq_lens),
                            format!("{v}: below the step before's {}; a sequence never shrinks", seq[r]),
                        ));
                    }
                    v
                }
                None => seq[r].max(newest + 1),
            };
            seq[r] = seq_len;
            for (l, selected) in rows.into_iter().enumerate() {
                out.push(TraceRecord {
                    step: s as u32,
                    request: p.first_request + r as u64,
                    layer: l as u32,
                    seq_len: seq_len as u32,
                    selected,
                    ..TraceRecord::default()
                });
            }
        }
    }
    if out.iter().all(|r| r.selected.is_empty()) {
        return Err(value(n.selected, "every entry is -1 (padding): nothing selected"));
    }
    let header = TraceHeader { top_k, layers: layers as u32, row_bytes: p.row_bytes, ..TraceHeader::default() };
    Ok((header, out))
}

/// SGLang's `indexer_topk`: base64 of little-endian int32 `[tokens, layers, top_k]`, as its
/// elements.
pub fn sglang_positions(b64: &[u8], layers: usize, top_k: usize) -> Result<Vec<i64>, PyErr> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim_ascii())
        .map_err(|e| value("indexer_topk", format!("not base64: {e}")))?;
    if layers == 0 {
        return Err(value("layers", "0: must be at least 1"));
    }
    if top_k == 0 {
        return Err(value("top_k", "0: must be at least 1"));
    }
    let Some(per_token) = layers.checked_mul(top_k).and_then(|n| n.checked_mul(4)) else {
        return Err(value("top_k", format!("{top_k}: {layers} layers x top_k int32 positions overflow")));
    };
    if bytes.len() % per_token != 0 {
        return Err(value(
            "indexer_topk",
            format!("{} bytes: not whole tokens of {layers} layers x {top_k} int32 positions", bytes.len()),
        ));
    }
    Ok(bytes.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect())
}
