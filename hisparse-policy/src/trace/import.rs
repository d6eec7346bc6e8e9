//! Importing selections captured from another engine: per request, a tensor of selected
//! positions of shape `[steps, layers, top_k]` (or `[steps, top_k]` for one layer), integers
//! (`int16/32/64`, `uint16/32`), `-1` as padding — the form a Python engine dumps in one line
//! (`np.save`, `safetensors.torch.save_file`). See the crate README for the exact rules.
//!
//! * `.npy` (format 1.0–3.0, little-endian, C order): one file per request.
//! * safetensors: one tensor per request; a tensor named `NAME.seq_len` (shape `[steps]`) gives
//!   request `NAME`'s sequence length at each step. Requests are numbered by their names when
//!   every name is an integer, else in name order.
//!
//! A step's sequence length comes from `NAME.seq_len`, else from [`ImportOptions::prompt_len`]
//! (`prompt_len + step`), else it is the largest position selected so far plus one.

use super::{MAX_LAYERS, MAX_TOP_K, TraceHeader, TraceRecord};
use crate::error::{PolicyError, Result};

/// Integer types a selection tensor may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexDtype {
    /// `int16`.
    I16,
    /// `uint16`.
    U16,
    /// `int32`.
    I32,
    /// `uint32`.
    U32,
    /// `int64`.
    I64,
}

impl IndexDtype {
    fn size(self) -> usize {
        match self {
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::U32 => 4,
            Self::I64 => 8,
        }
    }

    fn read(self, b: &[u8]) -> i64 {
        match self {
            Self::I16 => i64::from(i16::from_le_bytes([b[0], b[1]])),
            Self::U16 => i64::from(u16::from_le_bytes([b[0], b[1]])),
            Self::I32 => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Self::U32 => i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Self::I64 => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        }
    }
}

/// A `[steps, layers, top_k]` tensor of selected positions over borrowed little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct SelectionTensor<'a> {
    /// Steps, layers, top-k.
    pub shape: [usize; 3],
    /// Element type.
    pub dtype: IndexDtype,
    bytes: &'a [u8],
}

fn bad(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

impl<'a> SelectionTensor<'a> {
    /// A tensor over `bytes` (`shape` of 2 or 3 dimensions; 2 means one layer).
    pub fn new(shape: &[usize], dtype: IndexDtype, bytes: &'a [u8]) -> Result<Self> {
        let shape = match *shape {
            [s, k] => [s, 1, k],
            [s, l, k] => [s, l, k],
            _ => return Err(bad("shape", format!("{shape:?}"), "expected [steps, layers, top_k] or [steps, top_k]")),
        };
        if shape.contains(&0) {
            return Err(bad("shape", format!("{shape:?}"), "every dimension must be at least 1"));
        }
        if shape[1] > MAX_LAYERS as usize || shape[2] > MAX_TOP_K as usize {
            return Err(bad("shape", format!("{shape:?}"), "at most 4096 layers and 2^20 positions per row"));
        }
        let need = shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d));
        if need != Some(bytes.len()) {
            return Err(bad("shape", format!("{shape:?}"), format!("{} bytes of data do not hold it", bytes.len())));
        }
        Ok(Self { shape, dtype, bytes })
    }

    /// The positions of (`step`, `layer`) as stored (padding included).
    fn row(&self, step: usize, layer: usize) -> impl Iterator<Item = i64> + '_ {
        let [_, l, k] = self.shape;
        let w = self.dtype.size();
        let start = (step * l + layer) * k * w;
        self.bytes[start..start + k * w].chunks_exact(w).map(move |c| self.dtype.read(c))
    }
}

/// Reads a `.npy` file's array (format versions 1–3, little-endian integers, C order).
pub fn parse_npy(bytes: &[u8]) -> Result<SelectionTensor<'_>> {
    let npy = |reason: &str| bad("npy", "header", reason);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(npy("not a .npy file (magic \\x93NUMPY missing)"));
    }
    let (len, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(bad("npy", format!("version {v}"), "versions 1, 2 and 3 are read")),
    };
    let dict = bytes.get(start..start.saturating_add(len)).ok_or_else(|| npy("header runs past the file"))?;
    let dict = std::str::from_utf8(dict).map_err(|_| npy("header is not text"))?;
    let field = |key: &str| -> Result<&str> {
        let at = dict.find(&format!("'{key}'")).ok_or_else(|| npy(&format!("no '{key}' in the header")))?;
        let rest = dict[at + key.len() + 2..].trim_start().strip_prefix(':').ok_or_else(|| npy("malformed header"))?;
        Ok(rest.trim_start())
    };
    let descr = field("descr")?;
    let descr = descr.get(1..).and_then(|d| d.split('\'').next()).ok_or_else(|| npy("malformed descr"))?;
    let dtype = match descr {
        "<i2" => IndexDtype::I16,
        "<u2" => IndexDtype::U16,
        "<i4" => IndexDtype::I32,
        "<u4" => IndexDtype::U32,
        "<i8" => IndexDtype::I64,
        d => return Err(bad("dtype", d, "expected little-endian int16, uint16, int32, uint32 or int64")),
    };
    if field("fortran_order")?.starts_with("True") {
        return Err(bad("fortran_order", "True", "save the array in C order (np.ascontiguousarray)"));
    }
    let shape = field("shape")?;
    let shape = shape.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or_else(|| npy("malformed shape"))?;
    let shape: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("shape", s, "not a dimension")))
        .collect::<Result<_>>()?;
    SelectionTensor::new(&shape, dtype, &bytes[start + len..])
}

/// One request's selections (and, if known, its sequence length at each step).
#[derive(Clone, Debug)]
pub struct RequestSelections<'a> {
    /// Request id in the trace.
    pub request: u64,
    /// The selections.
    pub tensor: SelectionTensor<'a>,
    /// Sequence length at each step.
    pub seq_lens: Option<Vec<u32>>,
}

/// Reads a safetensors file: one request per tensor, `NAME.seq_len` tensors as their lengths.
pub fn parse_safetensors(bytes: &[u8]) -> Result<Vec<RequestSelections<'_>>> {
    use safetensors::{Dtype, SafeTensors};
    let st = SafeTensors::deserialize(bytes).map_err(|e| bad("safetensors", "file", e.to_string()))?;
    let mut names: Vec<String> =
        st.names().into_iter().filter(|n| !n.ends_with(".seq_len")).map(str::to_owned).collect();
    if names.is_empty() {
        return Err(bad("safetensors", "file", "holds no selection tensor"));
    }
    let numbered: Option<Vec<u64>> = names.iter().map(|n| n.parse().ok()).collect();
    match &numbered {
        Some(ids) => {
            // "1", "01" and "+1" all read as request 1: two of them would merge two requests.
            let mut pairs: Vec<(u64, &String)> = ids.iter().copied().zip(&names).collect();
            pairs.sort();
            if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(bad(
                    "safetensors",
                    format!("tensors {} and {}", w[0].1, w[1].1),
                    format!("both name request {}: name each request once (0, 1, 2, ...)", w[0].0),
                ));
            }
            names.sort_by_key(|n| n.parse::<u64>().unwrap_or(u64::MAX));
        }
        None => names.sort(),
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let t = st.tensor(name).map_err(|e| bad("safetensors", name, e.to_string()))?;
        let dtype = match t.dtype() {
            Dtype::I16 => IndexDtype::I16,
            Dtype::U16 => IndexDtype::U16,
            Dtype::I32 => IndexDtype::I32,
            Dtype::U32 => IndexDtype::U32,
            Dtype::I64 => IndexDtype::I64,
            d => return Err(bad("dtype", format!("{d:?} ({name})"), "expected an integer type")),
        };
        let tensor = SelectionTensor::new(t.shape(), dtype, t.data())?;
        let seq_lens = match st.tensor(&format!("{name}.seq_len")) {
            Err(_) => None,
            Ok(s) => {
                let lens = SelectionTensor::new(
                    &[s.shape().iter().product::<usize>(), 1],
                    match s.dtype() {
                        Dtype::I32 => IndexDtype::I32,
                        Dtype::U32 => IndexDtype::U32,
                        Dtype::I64 => IndexDtype::I64,
                        d => {
                            return Err(bad(
                                "dtype",
                                format!("{d:?} ({name}.seq_len)"),
                                "expected int32, uint32 or int64",
                            ));
                        }
                    },
                    s.data(),
                )?;
                let v: Vec<i64> = (0..lens.shape[0]).flat_map(|st| lens.row(st, 0).collect::<Vec<_>>()).collect();
                Some(
                    v.into_iter()
                        .map(|x| {
                            u32::try_from(x).map_err(|_| bad("seq_len", format!("{x} ({name})"), "must be in 1..2^32"))
                        })
                        .collect::<Result<_>>()?,
                )
            }
        };
        let request = numbered.as_ref().map_or(i as u64, |_| name.parse().unwrap_or(i as u64));
        out.push(RequestSelections { request, tensor, seq_lens });
    }
    Ok(out)
}

/// How to turn tensors into a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Prompt tokens: step `s` (from 1) then has `prompt_len + s` tokens. `None`: the tensor's
    /// `seq_len`, else the largest position selected so far plus one.
    pub prompt_len: Option<u32>,
    /// Bytes per KV row for the header (0: unknown).
    pub row_bytes: u32,
    /// The layer structure (see [`TraceHeader::index_source`]); empty: every layer full.
    pub index_source: Vec<u32>,
}

/// The trace of `requests`: one record per (step, request, layer), positions sorted, padding
/// (`-1`) dropped. Errors name the request, step and layer of a bad row (a negative position
/// other than -1, a repeat, one past the sequence).
pub fn import(requests: &[RequestSelections<'_>], opts: &ImportOptions) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let first = requests.first().ok_or_else(|| bad("requests", 0, "need at least one request"))?;
    let layers = first.tensor.shape[1];
    if let Some(r) = requests.iter().find(|r| r.tensor.shape[1] != layers) {
        return Err(bad(
            "shape",
            format!("{:?}", r.tensor.shape),
            format!("request {} has another layer count than {layers}", r.request),
        ));
    }
    let header = TraceHeader {
        top_k: requests.iter().map(|r| r.tensor.shape[2]).max().unwrap_or(1) as u32,
        layers: layers as u32,
        row_bytes: opts.row_bytes,
        index_source: opts.index_source.clone(),
        ..TraceHeader::default()
    };
    header.check(0).map_err(|e| bad("index_source", format!("{:?}", opts.index_source), e.to_string()))?;
    let mut records = Vec::new();
    for r in requests {
        let [steps, _, _] = r.tensor.shape;
        if let Some(lens) = r.seq_lens.as_ref().filter(|l| l.len() != steps) {
            return Err(bad("seq_len", lens.len(), format!("request {} has {steps} steps", r.request)));
        }
        let mut longest = 0u32;
        let mut last_len = 0u32;
        for step in 0..steps {
            let mut rows = Vec::with_capacity(layers);
            for layer in 0..layers {
                let at = || format!("request {} step {} layer {layer}", r.request, step + 1);
                let mut sel = Vec::with_capacity(r.tensor.shape[2]);
                for p in r.tensor.row(step, layer) {
                    match p {
                        -1 => {}
                        p => sel.push(u32::try_from(p).map_err(|_| bad("position", p, at()))?),
                    }
                }
                sel.sort_unstable();
                if let Some(w) = sel.windows(2).find(|w| w[0] == w[1]) {
                    return Err(bad("position", w[0], format!("{}: selected twice", at())));
                }
                if let Some(&m) = sel.last() {
                    longest = longest.max(m.checked_add(1).ok_or_else(|| bad("position", m, at()))?);
                }
                rows.push(sel);
            }
            let seq_len = match (&r.seq_lens, opts.prompt_len) {
                (Some(l), _) => l[step],
                (None, Some(p)) => p.checked_add(step as u32 + 1).ok_or_else(|| bad("prompt_len", p, "too long"))?,
                (None, None) => longest.max(1),
            };
            if seq_len < last_len {
                return Err(bad(
                    "seq_len",
                    seq_len,
                    format!(
                        "request {} step {}: shorter than step {step}'s {last_len} (a sequence only grows)",
                        r.request,
                        step + 1
                    ),
                ));
            }
            last_len = seq_len;
            for (layer, selected) in rows.into_iter().enumerate() {
                if let Some(&m) = selected.last().filter(|&&m| m >= seq_len) {
                    return Err(bad(
                        "position",
                        m,
                        format!(
                            "request {} step {} layer {layer}: past the sequence of {seq_len} tokens",
                            r.request,
                            step + 1
                        ),
                    ));
                }
                records.push(TraceRecord {
                    step: step as u32 + 1,
                    request: r.request,
                    layer: layer as u32,
                    seq_len,
                    selected,
                    ..TraceRecord::default()
                });
            }
        }
    }
    Ok((header, records))
}
