//! `hisparse.Trace`: a selection trace in memory — read from our files (binary `.hstrace` or
//! JSON lines), built from a NumPy array or SGLang's `indexer_topk`, written atomically (a
//! temporary file beside the destination, placed without replacing unless asked), and shown
//! back as NumPy arrays.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hisparse_policy::trace::{
    EncodedTrace, MAX_LAYERS, MAX_TOP_K, TraceData, TraceHeader, TraceRecord, TraceWriter, read_trace_file_encoded,
    read_trace_file_with, read_trace_from_encoded, read_trace_from_with,
};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use crate::arrays::{MAX_POSITION, Names, Positions, records, sglang_positions};
use crate::error::{exists, io, kind, policy, uint, value};

/// A KV row's bytes where the caller names none (an fp8 MLA row of DeepSeek-V3.2 and GLM-5.1).
const DEFAULT_ROW_BYTES: u32 = 656;

/// A selection trace: which positions each (step, request, layer) selected.
#[pyclass(module = "hisparse", name = "Trace", frozen)]
pub struct Trace {
    pub(crate) header: TraceHeader,
    body: Body,
    /// Read from a file with `scores=False`: whatever scores it held were left out.
    pub(crate) read_without_scores: bool,
}

/// A trace's records: decoded, or a binary file read without scores whose positions stay
/// encoded (checked as read) and are decoded once, when something needs them whole.
enum Body {
    Records(Vec<TraceRecord>),
    Encoded { trace: EncodedTrace, decoded: OnceLock<Vec<TraceRecord>> },
}

impl Trace {
    fn new(header: TraceHeader, records: Vec<TraceRecord>) -> Self {
        Self { header, body: Body::Records(records), read_without_scores: false }
    }

    /// The trace file at `path` read as [`Trace::read`] says (blocking: a FIFO waits for its
    /// writer); errors as text, naming no argument yet.
    fn read_blocking(path: &Path, max_bytes: u64, scores: bool) -> Result<Self, String> {
        let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
        let size = f.metadata().ok().filter(std::fs::Metadata::is_file).map(|m| m.len());
        // Without scores a binary trace's positions stay encoded (each checked here): replays
        // by LRU and FIFO without prefetch then decode a record at a time.
        let encoded = |read: hisparse_policy::Result<TraceData>| match read? {
            TraceData::Encoded(trace) => trace.check_positions().map(|()| Self {
                header: trace.header().clone(),
                body: Body::Encoded { trace, decoded: OnceLock::new() },
                read_without_scores: true,
            }),
            TraceData::Records(h, r) => Ok(Self { read_without_scores: true, ..Self::new(h, r) }),
        };
        match size {
            Some(n) if !scores => encoded(read_trace_file_encoded(f, n, max_bytes)),
            None if !scores => encoded(read_trace_from_encoded(f, None, max_bytes)),
            Some(n) => read_trace_file_with(f, n, max_bytes, scores).map(|(h, r)| Self::new(h, r)),
            None => read_trace_from_with(f, size, max_bytes, scores).map(|(h, r)| Self::new(h, r)),
        }
        .map_err(|e| e.to_string())
    }

    /// The records, decoded.
    pub(crate) fn records(&self) -> &[TraceRecord] {
        match &self.body {
            Body::Records(r) => r,
            Body::Encoded { trace, decoded } => decoded.get_or_init(|| {
                // Every record's positions were checked when the trace was read
                // (`check_positions`), so decoding the same bytes again cannot fail.
                trace.decode().map(|(_, r)| r).unwrap_or_default()
            }),
        }
    }

    /// The encoded form, when the trace was read as one.
    pub(crate) fn encoded(&self) -> Option<&EncodedTrace> {
        match &self.body {
            Body::Encoded { trace, .. } => Some(trace),
            Body::Records(_) => None,
        }
    }

    /// Records, without decoding any.
    fn len(&self) -> usize {
        match &self.body {
            Body::Records(r) => r.len(),
            Body::Encoded { trace, .. } => trace.records().len(),
        }
    }
}

/// Ends a reader's wait in `open` on the FIFO at `path` that has no writer yet: this process
/// opens it for writing without blocking and closes it at once (the reader then sees an empty
/// stream and fails, its result dropped). Anything else at `path` is left alone.
fn release_fifo_reader(path: &Path) {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    if std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo()) {
        let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path);
    }
}

/// `x` as a contiguous int64 array, refused naming `arg` unless it holds integers.
fn int_array<'py>(arg: &str, x: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArrayDyn<'py, i64>> {
    let py = x.py();
    let np = py.import("numpy")?;
    let arr = np.call_method1("asarray", (x,))?;
    let dtype_kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    if dtype_kind != "i" && dtype_kind != "u" {
        let dtype = arr.getattr("dtype")?.str()?.to_string();
        return Err(kind(arg, format!("an array of {dtype}; positions are integers")));
    }
    // An unsigned array's values past int64 would wrap (2**64 - 1 to -1, the padding): refused.
    if dtype_kind == "u" && arr.getattr("size")?.extract::<usize>()? > 0 {
        let largest = arr.call_method0("max")?;
        if largest.gt(i64::MAX)? {
            return Err(value(arg, format!("{}: positions stay below 2^31 (-1 pads)", largest.str()?)));
        }
    }
    let arr = np.call_method1("ascontiguousarray", (arr, "int64"))?;
    arr.extract().map_err(|_| kind(arg, "not convertible to an int64 array"))
}

impl Trace {
    fn from_positions(
        selected: &PyReadonlyArrayDyn<'_, i64>,
        seq_lens: Option<&PyReadonlyArrayDyn<'_, i64>>,
        top_k: Option<u32>,
        row_bytes: u32,
        first_request: u64,
    ) -> PyResult<Self> {
        let shape: [usize; 4] = match *selected.shape() {
            [s, l, k] => [1, s, l, k],
            [r, s, l, k] => [r, s, l, k],
            ref other => {
                return Err(value(
                    "selected",
                    format!("shape {other:?}; expected (steps, layers, k) or (requests, steps, layers, k)"),
                ));
            }
        };
        let data = selected.as_slice().map_err(|_| value("selected", "not contiguous"))?;
        let lens = match seq_lens {
            Some(a) => {
                let want: &[usize] = if selected.ndim() == 3 { &[shape[1]] } else { &shape[..2] };
                if a.shape() != want {
                    return Err(value("seq_lens", format!("shape {:?}; expected {want:?}", a.shape())));
                }
                Some(a.as_slice().map_err(|_| value("seq_lens", "not contiguous"))?)
            }
            None => None,
        };
        let names = Names {
            selected: "selected",
            seq_lens: "seq_lens",
            first_request: "first_request",
            derived_seq_lens: false,
        };
        let (header, records) =
            records(&Positions { data, shape, seq_lens: lens, top_k, row_bytes, first_request, names })?;
        Ok(Self::new(header, records))
    }

    /// Writes the trace to `tmp`, a new file.
    fn write_to(&self, tmp: &Path) -> PyResult<()> {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(tmp).map_err(|e| io(tmp, e))?;
        let mut w = TraceWriter::new(std::io::BufWriter::new(f), self.header.clone()).map_err(|e| policy("path", e))?;
        for r in self.records() {
            w.write(r).map_err(|e| policy("path", e))?;
        }
        let mut f = w.finish().map_err(|e| policy("path", e))?;
        f.flush().map_err(|e| io(tmp, e))?;
        f.get_ref().sync_all().map_err(|e| io(tmp, e))
    }
}

#[pymethods]
impl Trace {
    /// Reads a trace file (binary `.hstrace` or JSON lines); a corrupt file raises ValueError
    /// naming where, a file over `max_bytes` (default: what this machine's available memory can
    /// decode) is refused before it is read. `scores=False`
    /// leaves the records' scores out (most of a scored trace's bytes; a version-3 file's are
    /// skipped unread, an older one's checked but not decoded),
    /// for replays whose policies and prefetchers read none; a binary file's positions then stay
    /// encoded (each checked here) until something needs them whole, and `simulate` replays
    /// LRU and FIFO without prefetch from them a record at a time.
    ///
    /// The file is read on a thread of its own: Ctrl-C (KeyboardInterrupt) stops the wait for
    /// a FIFO's writer or for a stalled one, as Python's own `open` does.
    #[staticmethod]
    #[pyo3(signature = (path, max_bytes = None, scores = true))]
    fn read(py: Python<'_>, path: PathBuf, max_bytes: Option<Bound<'_, PyAny>>, scores: bool) -> PyResult<Self> {
        let max_bytes = match max_bytes {
            Some(m) if !m.is_none() => uint::<u64>("max_bytes", &m, u64::MAX)?,
            // A trace is read whole and decoded to about DECODED_PER_TRACE_BYTE times its size.
            _ => {
                let per_byte = 1 + hisparse_policy::trace::DECODED_PER_TRACE_BYTE;
                hisparse_memory::available_memory().map_or(1 << 34, |a| a / per_byte)
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::Builder::new()
            .name("hisparse-trace-read".into())
            .spawn(move || {
                let _ = tx.send(Self::read_blocking(&p, max_bytes, scores));
            })
            .map_err(|e| io(&path, e))?;
        let tick = std::time::Duration::from_millis(20);
        // Only this thread receives; the lock lets the wait run with the interpreter released.
        let rx = std::sync::Mutex::new(rx);
        loop {
            let got = py.detach(|| match rx.lock() {
                Ok(rx) => rx.recv_timeout(tick),
                Err(_) => Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
            });
            match got {
                Ok(r) => return r.map_err(|e| value("path", format!("{}: {e}", path.display()))),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(value(
                        "path",
                        format!("{}: the reading thread ended without a result", path.display()),
                    ));
                }
            }
            if let Err(e) = py.check_signals() {
                release_fifo_reader(&path);
                return Err(e);
            }
        }
    }

    /// Writes the trace as a binary `.hstrace` file: into a temporary file beside `path`, then
    /// placed; an existing file is replaced only with `overwrite=True` (FileExistsError
    /// otherwise), and a failed write leaves nothing behind.
    #[pyo3(signature = (path, overwrite = false))]
    fn write(&self, py: Python<'_>, path: PathBuf, overwrite: bool) -> PyResult<()> {
        py.detach(|| {
            if !overwrite && path.symlink_metadata().is_ok() {
                return Err(exists(&path));
            }
            let name = path.file_name().ok_or_else(|| value("path", format!("{}: not a file name", path.display())))?;
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".{}.tmp", std::process::id()));
            let tmp = path.with_file_name(tmp_name);
            let placed = self.write_to(&tmp).and_then(|()| {
                if overwrite {
                    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
                } else {
                    // A hard link never replaces: a file made at `path` meanwhile is refused.
                    match std::fs::hard_link(&tmp, &path) {
                        Ok(()) => Ok(()),
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(exists(&path)),
                        Err(e) => Err(io(&path, e)),
                    }
                }
            });
            let _ = std::fs::remove_file(&tmp);
            placed
        })
    }

    /// A trace from positions: an integer array `(steps, layers, k)` for one request or
    /// `(requests, steps, layers, k)`, -1 padding unused entries (any order within a row).
    /// `seq_lens` (`(steps,)` or `(requests, steps)`) gives each step's sequence length; by
    /// default one past the largest position selected so far. `top_k` defaults to `k`.
    #[staticmethod]
    #[pyo3(signature = (selected, *, seq_lens = None, top_k = None, row_bytes = None, first_request = None))]
    fn from_array(
        selected: &Bound<'_, PyAny>,
        seq_lens: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
        row_bytes: Option<&Bound<'_, PyAny>>,
        first_request: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let top_k =
            top_k.filter(|k| !k.is_none()).map(|k| uint::<u32>("top_k", k, u64::from(MAX_TOP_K))).transpose()?;
        let row_bytes =
            row_bytes.map_or(Ok(DEFAULT_ROW_BYTES), |b| uint::<u32>("row_bytes", b, u64::from(u32::MAX)))?;
        let first_request = first_request.map_or(Ok(0), |r| uint::<u64>("first_request", r, u64::MAX))?;
        let sel = int_array("selected", selected)?;
        let lens = seq_lens.map(|s| int_array("seq_lens", s)).transpose()?;
        Self::from_positions(&sel, lens.as_ref(), top_k, row_bytes, first_request)
    }

    /// A trace from SGLang's `meta_info["indexer_topk"]` of one request (run with
    /// `--enable-return-indexer-topk`): base64 of int32 `(tokens, layers, top_k)`. Token `t`
    /// is decode step `t`, its sequence `prompt_tokens + t + 1` tokens long.
    #[staticmethod]
    #[pyo3(signature = (indexer_topk, *, layers, top_k, prompt_tokens, request = None, row_bytes = None))]
    fn from_sglang(
        indexer_topk: &Bound<'_, PyAny>,
        layers: &Bound<'_, PyAny>,
        top_k: &Bound<'_, PyAny>,
        prompt_tokens: &Bound<'_, PyAny>,
        request: Option<&Bound<'_, PyAny>>,
        row_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let layers = uint::<usize>("layers", layers, u64::from(MAX_LAYERS))?;
        let top_k = uint::<usize>("top_k", top_k, u64::from(MAX_TOP_K))?;
        let prompt_tokens = uint::<i64>("prompt_tokens", prompt_tokens, MAX_POSITION as u64)?;
        let request = request.map_or(Ok(0), |r| uint::<u64>("request", r, u64::MAX))?;
        let row_bytes =
            row_bytes.map_or(Ok(DEFAULT_ROW_BYTES), |b| uint::<u32>("row_bytes", b, u64::from(u32::MAX)))?;
        let b64: Vec<u8> = if indexer_topk.is_instance_of::<PyString>() {
            indexer_topk.extract::<String>()?.into_bytes()
        } else if let Ok(b) = indexer_topk.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            return Err(kind("indexer_topk", "expected the base64 text (str or bytes)"));
        };
        let data = sglang_positions(&b64, layers, top_k)?;
        let tokens = data.len() / (layers * top_k);
        // The last token's sequence must stay a position a trace holds.
        if prompt_tokens + tokens as i64 > MAX_POSITION {
            return Err(value(
                "prompt_tokens",
                format!("{prompt_tokens}: with {tokens} tokens the sequence passes 2^31 positions"),
            ));
        }
        let lens: Vec<i64> = (0..tokens).map(|t| prompt_tokens + t as i64 + 1).collect();
        let (header, records) = records(&Positions {
            data: &data,
            shape: [1, tokens, layers, top_k],
            seq_lens: Some(&lens),
            // Within MAX_TOP_K, checked above.
            top_k: Some(top_k as u32),
            row_bytes,
            first_request: request,
            names: Names {
                selected: "indexer_topk",
                seq_lens: "prompt_tokens",
                first_request: "request",
                derived_seq_lens: true,
            },
        })?;
        Ok(Self::new(header, records))
    }

    /// Positions a step selects per (request, layer).
    #[getter]
    fn top_k(&self) -> u32 {
        self.header.top_k
    }

    /// Layers of the model.
    #[getter]
    fn layers(&self) -> u32 {
        self.header.layers
    }

    /// Bytes of a KV row.
    #[getter]
    fn row_bytes(&self) -> u32 {
        self.header.row_bytes
    }

    /// Whether the records carry scores (a scored trace, version 3: what `score`, `score-lru`
    /// and `next-step` read); false for a trace read with `scores=False`.
    #[getter]
    fn has_scores(&self) -> bool {
        self.header.has_scores
    }

    /// The request ids, ascending.
    #[getter]
    fn requests(&self) -> Vec<u64> {
        let requests: BTreeSet<u64> = match &self.body {
            Body::Encoded { trace, .. } => trace.records().iter().map(|r| r.request).collect(),
            Body::Records(r) => r.iter().map(|r| r.request).collect(),
        };
        requests.into_iter().collect()
    }

    /// Records: one per (step, request, layer).
    fn __len__(&self) -> usize {
        self.len()
    }

    /// The records in file order, as `(step, request, layer, seq_len, selected)` tuples
    /// (`selected`: the positions, ascending) — a trace is its own reader.
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
        let rows = self.records().iter().map(|r| (r.step, r.request, r.layer, r.seq_len, r.selected.clone()));
        pyo3::types::PyList::new(py, rows)?.into_any().try_iter()
    }

    fn __repr__(&self) -> String {
        format!(
            "Trace({} records, {} requests, {} layers, top_k {}, scores {})",
            self.len(),
            self.requests().len(),
            self.header.layers,
            self.header.top_k,
            self.header.has_scores
        )
    }

    /// The records as NumPy arrays: `step`, `request`, `layer`, `seq_len` (one per record) and
    /// `selected` (`(records, top_k)` int32, -1 padded).
    fn to_arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let col = |f: &dyn Fn(&TraceRecord) -> i64| self.records().iter().map(f).collect::<Vec<i64>>();
        d.set_item("step", PyArray1::from_vec(py, col(&|r| i64::from(r.step))))?;
        d.set_item("request", PyArray1::from_vec(py, self.records().iter().map(|r| r.request).collect::<Vec<u64>>()))?;
        d.set_item("layer", PyArray1::from_vec(py, col(&|r| i64::from(r.layer))))?;
        d.set_item("seq_len", PyArray1::from_vec(py, col(&|r| i64::from(r.seq_len))))?;
        let k = self.header.top_k as usize;
        // records x top_k (a header may say top_k is a million): checked, and refused as
        // MemoryError rather than aborting the interpreter.
        let room = hisparse_memory::available_memory().map_or(u64::MAX, |a| a / 2) / 4;
        let n = self.len().checked_mul(k).filter(|&n| n as u64 <= room && n <= isize::MAX as usize / 4);
        let mut sel: Vec<i32> = Vec::new();
        if n.is_none_or(|n| sel.try_reserve_exact(n).is_err()) {
            return Err(pyo3::exceptions::PyMemoryError::new_err(format!(
                "to_arrays: {} records x top_k {k} positions do not fit this machine's memory",
                self.len()
            )));
        }
        sel.resize(n.unwrap_or(0), -1);
        for (row, r) in sel.chunks_exact_mut(k).zip(self.records()) {
            for (o, &p) in row.iter_mut().zip(&r.selected) {
                *o = p as i32;
            }
        }
        let arr = PyArray1::from_vec(py, sel).reshape([self.len(), k])?;
        let arr: Bound<'py, PyArray2<i32>> = arr;
        d.set_item("selected", arr)?;
        Ok(d)
    }
}
