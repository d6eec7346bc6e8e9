//! `hisparse trace synth|info|import`: write a synthetic selection trace, describe a trace
//! (header, streams, consecutive-step and adjacent-layer overlap), or import selections captured
//! from another engine (`trace_import.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use hisparse_policy::PolicyError;
use hisparse_policy::synth::{SynthConfig, synth_header, synth_trace};
use hisparse_policy::trace::{RecordHead, TraceData, TraceHeader, TraceRecord, TraceWriter, jsonl, selection_overlap};
use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::files::AtomicFile;
use crate::{guard, interrupt, progress};

/// `hisparse trace ...`
#[derive(Debug, clap::Subcommand)]
pub enum TraceCommand {
    /// Write a synthetic trace (latent-relevance selections).
    #[command(allow_negative_numbers = true)]
    Synth(SynthArgs),
    /// Describe a trace: header, streams, overlaps (a binary trace's scores are skipped, unread).
    Info {
        /// The trace (binary .hstrace or JSON lines).
        trace: PathBuf,
    },
    /// Import selections captured from another engine ([steps, layers, top_k] tensors per
    /// request, .npy or safetensors).
    Import(super::trace_import::ImportArgs),
}

/// Options of `hisparse trace synth`.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Output file (.hstrace; .jsonl writes JSON lines); an existing file is refused unless
    /// --overwrite is given.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing --out file.
    #[arg(long)]
    pub overwrite: bool,
    /// Requests.
    #[arg(long, default_value_t = 4)]
    pub requests: usize,
    /// Layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Decode steps.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 16384)]
    pub prompt: usize,
    /// Positions selected per step.
    #[arg(long, default_value_t = 2048)]
    pub top_k: usize,
    /// Per-step persistence of the drifting relevance (0..=1).
    #[arg(long, default_value_t = 0.95)]
    pub rho: f64,
    /// Size of the drifting relevance relative to the fixed part.
    #[arg(long, default_value_t = 0.6)]
    pub drift: f64,
    /// Fraction of the drift shared by all layers (0..=1).
    #[arg(long, default_value_t = 0.8)]
    pub layer_share: f64,
    /// Record scores of the selected positions.
    #[arg(long)]
    pub scores: bool,
    /// Record this many candidates ranked just below the cut, with their scores (trace
    /// version 3; what score-aware policies and next-step prefetch need).
    #[arg(long, default_value_t = 0)]
    pub score_margin: usize,
    /// Bytes per KV row written into the header (656: fp8 rows).
    #[arg(long, default_value_t = 656)]
    pub row_bytes: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Reads the trace given as `--flag` (or the argument `flag`): header first, then the rest,
/// within the memory this machine has for it and its decoded records; the records' scores
/// decoded only with `keep_scores`.
pub fn read_trace_arg_with(
    flag: &'static str,
    path: &std::path::Path,
    keep_scores: bool,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let input = crate::files::Input::open(flag, path)?;
    let size = input.len();
    read_input(flag, path, input, size, keep_scores)
}

/// Reads `input` (of `size` bytes, if a regular file) as [`read_trace_arg_with`] says.
fn read_input(
    flag: &'static str,
    path: &std::path::Path,
    input: crate::files::Input,
    size: Option<u64>,
    keep_scores: bool,
) -> Result<(TraceHeader, Vec<TraceRecord>)> {
    let limit = crate::files::input::memory_limit(1 + hisparse_policy::trace::DECODED_PER_TRACE_BYTE);
    let read = match size {
        // A regular file: a scored trace's score parts are skipped where nothing reads them.
        Some(n) => hisparse_policy::trace::read_trace_file_with(input, n, limit, keep_scores),
        None => hisparse_policy::trace::read_trace_from_with(input, size, limit, keep_scores),
    };
    read.map_err(|e| read_error(flag, path, e))
}

/// Reads the trace given as `--flag` without scores, as [`read_trace_arg_with`] does, but a
/// binary file's positions left encoded (decoded as a replay reads them).
pub fn read_trace_arg_encoded(flag: &'static str, path: &std::path::Path) -> Result<TraceData> {
    let input = crate::files::Input::open(flag, path)?;
    let limit = crate::files::input::memory_limit(1 + hisparse_policy::trace::DECODED_PER_TRACE_BYTE);
    match input.len() {
        Some(size) => hisparse_policy::trace::read_trace_file_encoded(input, size, limit),
        // A pipe: read whole.
        None => hisparse_policy::trace::read_trace_from_encoded(input, None, limit),
    }
    .map_err(|e| read_error(flag, path, e))
}

/// The error of reading the trace `path` (given as `--flag`) that failed with `e`.
fn read_error(flag: &'static str, path: &std::path::Path, e: PolicyError) -> BenchError {
    match e {
        _ if interrupt::requested() => BenchError::Interrupted(format!("reading {}", path.display())),
        PolicyError::TooLarge { bytes, limit } => BenchError::flag(
            flag,
            path.display(),
            format!(
                "the trace is {}; this machine has memory for {} of trace (it is read whole)",
                bytes.map_or_else(|| "longer than that".into(), guard::human_bytes),
                guard::human_bytes(limit)
            ),
        ),
        e => e.into(),
    }
}

/// The trace `path` described: its header as stored (scores and near-cut candidates as the
/// file says) and its records without scores, read as
/// [`read_trace_described`](hisparse_policy::trace::read_trace_described) reads them: a file's
/// score parts skipped, a stream's delimited, neither checked (the same verdict from a file and
/// from a pipe).
fn read_trace_described(flag: &'static str, path: &std::path::Path) -> Result<(TraceHeader, TraceData)> {
    let input = crate::files::Input::open(flag, path)?;
    let size = input.len();
    let limit = crate::files::input::memory_limit(1 + hisparse_policy::trace::DECODED_PER_TRACE_BYTE);
    hisparse_policy::trace::read_trace_described(input, size, limit).map_err(|e| read_error(flag, path, e))
}

/// Runs a trace command; returns what it prints.
pub fn run(cmd: &TraceCommand) -> Result<String> {
    match cmd {
        TraceCommand::Synth(a) => synth(a),
        TraceCommand::Import(a) => Ok(format!("{}\n", super::trace_import::run(a)?)),
        TraceCommand::Info { trace } => {
            let (header, read) = read_trace_described("trace", trace)?;
            // A long trace's description stops on Ctrl-C between records.
            let stop = || if interrupt::requested() { Err(PolicyError::Cancelled) } else { Ok(()) };
            let described = match &read {
                TraceData::Encoded(t) => describe(t.records(), |i, out| {
                    stop()?;
                    t.positions_into(i, out)
                }),
                TraceData::Records(_, r) => describe(r, |i, out| {
                    stop()?;
                    out.clone_from(&r[i].selected);
                    Ok(())
                }),
            };
            let info = described.map_err(|e| read_error("trace", trace, e))?;
            let records = match &read {
                TraceData::Encoded(t) => t.records().len(),
                TraceData::Records(_, r) => r.len(),
            };
            let mut s = String::new();
            s += &format!(
                "{}: top_k {}, {} layers, row {} B, scores: {}, near-cut candidates: {}\n",
                trace.display(),
                header.top_k,
                header.layers,
                header.row_bytes,
                header.has_scores,
                header.score_margin
            );
            if !header.index_source.is_empty() {
                let full: Vec<u32> = (0..header.layers).filter(|&l| header.source_of(l) == l).collect();
                s += &format!(
                    "layer structure: {} of {} layers full ({full:?}), the others share\n",
                    full.len(),
                    header.layers
                );
            }
            s += &format!(
                "{} records, {} streams (request x layer), steps {}..={}\n",
                records, info.streams, info.first_step, info.last_step
            );
            s += &format!(
                "mean consecutive-step overlap {:.1}%, adjacent-layer overlap {:.1}%\n",
                100.0 * info.step_overlap,
                100.0 * info.layer_overlap
            );
            Ok(s)
        }
    }
}

/// The flag of a synthetic-trace config field.
fn synth_flag(field: &str) -> &'static str {
    match field {
        "requests" => "requests",
        "layers" => "layers",
        "steps" => "steps",
        "prompt_tokens" => "prompt",
        "top_k" => "top-k",
        "rho" => "rho",
        "layer_share" => "layer-share",
        "drift" => "drift",
        "score_margin" => "score-margin",
        _ => "out",
    }
}

fn synth(a: &SynthArgs) -> Result<String> {
    let cfg = SynthConfig {
        requests: a.requests,
        layers: a.layers,
        steps: a.steps,
        prompt_tokens: a.prompt,
        top_k: a.top_k,
        rho: a.rho,
        drift: a.drift,
        layer_share: a.layer_share,
        scores: a.scores,
        score_margin: a.score_margin,
        seed: a.seed,
    };
    // Every flag is checked before --out is touched.
    cfg.validate().map_err(|e| match e {
        PolicyError::Invalid { field, value, reason } => BenchError::flag(synth_flag(field), value, reason),
        e => e.into(),
    })?;
    let (flag, value) = guard::largest(&[
        ("requests", a.requests, 4),
        ("layers", a.layers, 4),
        ("prompt", a.prompt, 16_384),
        ("steps", a.steps, 200),
    ]);
    guard::memory(flag, value, "the generator's state (requests x (layers + 2) x positions)", cfg.memory_bytes())?;
    let records = cfg.records().ok_or_else(|| BenchError::flag(flag, value, "steps x requests x layers overflows"))?;
    let jsonl = a.out.extension().is_some_and(|e| e == "jsonl");
    if jsonl {
        // JSON lines are written whole at the end: the records are held in memory.
        let per = (a.top_k as u64).saturating_mul(12).saturating_add(64);
        guard::memory("steps", a.steps, "the JSON-lines trace held in memory", records.checked_mul(per))?;
    }
    let mut file = AtomicFile::create("out", &a.out, a.overwrite)?;
    let header = synth_header(&cfg, a.row_bytes);
    let bar = progress::bar(records, "records");
    let stop = |r: &TraceRecord| {
        interrupt::check(|| format!("writing the trace (step {})", r.step)).map_err(|_| PolicyError::Cancelled)
    };
    let run = |w: &mut std::io::BufWriter<std::fs::File>| -> std::result::Result<(), PolicyError> {
        if jsonl {
            let mut held = Vec::new();
            synth_trace(&cfg, |r| {
                stop(&r)?;
                bar.inc(1);
                held.push(r);
                Ok(())
            })?;
            jsonl::write(w, &header, &held)
        } else {
            let mut tw = TraceWriter::new(w, header)?;
            synth_trace(&cfg, |r| {
                stop(&r)?;
                bar.inc(1);
                tw.write(&r)
            })?;
            tw.finish().map(|_| ())
        }
    };
    match run(file.writer()) {
        Err(PolicyError::Cancelled) => return Err(BenchError::Interrupted("writing the trace".into())),
        r => r?,
    }
    bar.finish_and_clear();
    let path = file.commit()?;
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    Ok(format!("wrote {} ({records} records, {:.1} MB)\n", path.display(), size as f64 / 1e6))
}

/// Overlap statistics of a trace.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceInfo {
    /// (request, layer) streams.
    pub streams: usize,
    /// First step.
    pub first_step: u32,
    /// Last step.
    pub last_step: u32,
    /// Mean `|S_t ∩ S_{t-1}| / |S_t|` over consecutive records of a stream (newest excluded).
    pub step_overlap: f64,
    /// Mean `|S_l ∩ S_{l-1}| / |S_l|` over adjacent layers of one request and step.
    pub layer_overlap: f64,
}

/// Overlaps of a trace's records (`heads`), each record's positions read by `positions`
/// (decoded into the buffer it is given) when it is compared.
pub fn describe<R: RecordHead>(
    heads: &[R],
    positions: impl Fn(usize, &mut Vec<u32>) -> hisparse_policy::Result<()>,
) -> hisparse_policy::Result<TraceInfo> {
    let mut by: BTreeMap<(u64, u32), Vec<usize>> = BTreeMap::new();
    let mut by_step: BTreeMap<(u64, u32), BTreeMap<u32, usize>> = BTreeMap::new();
    for (i, r) in heads.iter().enumerate() {
        by.entry((r.request(), r.layer())).or_default().push(i);
        by_step.entry((r.request(), r.step())).or_default().insert(r.layer(), i);
    }
    let mean = |v: Vec<f64>| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    // Each record compared with the one before it in its group: two positions buffers, the
    // last record's and this one's.
    let (mut last, mut this) = (Vec::new(), Vec::new());
    let mut steps = Vec::new();
    for recs in by.values_mut() {
        recs.sort_by_key(|&i| heads[i].step());
        for (k, &i) in recs.iter().enumerate() {
            positions(i, &mut this)?;
            if k > 0 {
                steps.extend(selection_overlap(&this, heads[i].seq_len(), &last));
            }
            std::mem::swap(&mut last, &mut this);
        }
    }
    let mut layers = Vec::new();
    for ls in by_step.values() {
        let mut previous: Option<u32> = None;
        for (&layer, &i) in ls {
            positions(i, &mut this)?;
            if previous.is_some_and(|p| layer == p + 1) {
                layers.extend(selection_overlap(&this, heads[i].seq_len(), &last));
            }
            std::mem::swap(&mut last, &mut this);
            previous = Some(layer);
        }
    }
    Ok(TraceInfo {
        streams: by.len(),
        first_step: heads.iter().map(RecordHead::step).min().unwrap_or(0),
        last_step: heads.iter().map(RecordHead::step).max().unwrap_or(0),
        step_overlap: mean(steps),
        layer_overlap: mean(layers),
    })
}
