//! `hisparse eval`: a real model's perplexity over real text, and its next-token agreement with
//! dense attention, for dense, sparse resident and hisparse attention at several contexts, top-k
//! and index formats; hisparse is checked bit for bit against sparse resident on the way. Each
//! window of text is prefilled densely to the context once (its keys encoded in every format),
//! then its next `--decode` tokens are fed one step at a time (teacher forcing) and scored.
//! Table on standard output; JSON, CSV and an SVG plot with `--out` (with several formats, a
//! second plot: perplexity against the index's bytes per token).

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use hisparse_engine::IndexKeyLayout;
use hisparse_model::{AttentionKind, ForcedOut, ModelError, PrefillOut};
use serde::Serialize;

use super::model_args::{ModelArgs, ModelBackend};
use crate::error::{BenchError, Result};
use crate::files::output::{AtomicFile, OutputDir};
use crate::report::plot::{Chart, Series, line_chart};
use crate::{guard, interrupt, progress};

/// `hisparse eval`'s flags.
#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// Text file(s) to score, read as UTF-8 and joined.
    #[arg(long = "text", required = true)]
    pub text: Vec<PathBuf>,
    /// Context lengths (tokens prefilled before scoring).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub contexts: Vec<usize>,
    /// Top-k values of the sparse runs.
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    pub top_k: Vec<usize>,
    /// Tokens decoded and scored per window.
    #[arg(long, default_value_t = 64)]
    pub decode: usize,
    /// Windows of text per context (decoded together, as one batch).
    #[arg(long, default_value_t = 2)]
    pub windows: usize,
    /// Hot-buffer slots per request and layer as a multiple of top-k (hisparse; default: the
    /// hot buffer's default, twice top-k).
    #[arg(long)]
    pub buffer_factor: Option<f64>,
    /// Folder for eval.json, eval.csv and eval.svg.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the hisparse run's real selections (every decode step, layer and window) as a
    /// selection trace for `hisparse simulate` (needs one context and one top-k).
    #[arg(long)]
    pub record_trace: Option<PathBuf>,
    /// With --record-trace: also keep the oracle's scores of the selected positions and of the
    /// N best unselected ones (a scored trace, version 3: what `next-step` prefetch replays from).
    #[arg(long, default_value_t = 0)]
    pub score_margin: usize,
    /// Replace an existing --record-trace file.
    #[arg(long)]
    pub overwrite: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct EvalRow {
    /// Tokens prefilled.
    pub context: usize,
    /// dense, sparse-resident or hisparse.
    pub attention: &'static str,
    /// Positions selected (0 for dense).
    pub top_k: usize,
    /// The sparse runs' index key format (`--index-format`; none for dense).
    pub index_format: Option<String>,
    /// The sparse runs' index bytes per token and layer, what the device keeps to select by.
    pub index_bytes: Option<usize>,
    /// exp(mean negative log-likelihood) of the scored tokens.
    pub perplexity: f64,
    /// Share of steps whose most likely token is dense attention's.
    pub agreement: f64,
    /// hisparse only: its logits equal sparse resident's bit for bit.
    pub identical_to_resident: Option<bool>,
    /// Tokens decoded per second (all windows together).
    pub tokens_per_s: f64,
    /// Milliseconds per decode step spent selecting (the index's scores and the top-k over every
    /// layer, for the step's whole batch of windows); 0 for dense.
    pub select_ms: f64,
    /// Selected rows found in the hot buffers (hisparse).
    pub hits: u64,
    /// Selected rows brought from the host tier (hisparse).
    pub misses: u64,
}

fn check(args: &EvalArgs, context_max: usize) -> Result<()> {
    if args.decode < 2 {
        return Err(BenchError::flag(
            "decode",
            args.decode,
            "must be at least 2 (the first step scores the second token)",
        ));
    }
    if args.windows == 0 {
        return Err(BenchError::flag("windows", 0, "must be at least 1"));
    }
    if let Some(f) = args.buffer_factor
        && !(f.is_finite() && f >= 1.0)
    {
        return Err(BenchError::flag("buffer-factor", f, "must be at least 1"));
    }
    if args.decode >= context_max {
        return Err(BenchError::flag(
            "decode",
            args.decode,
            format!("context + decode must be within the model's {context_max} positions"),
        ));
    }
    for &c in &args.contexts {
        if c == 0 || guard::sum(("contexts", c), ("decode", args.decode))? > context_max {
            return Err(BenchError::flag(
                "contexts",
                c,
                format!("context + decode must be within the model's {context_max} positions"),
            ));
        }
    }
    guard::once_each("index-format", &args.model.index_format)?;
    if let Some(&k) = args.top_k.iter().find(|&&k| k < 2) {
        return Err(BenchError::flag("top-k", k, "must be at least 2"));
    }
    // A hot buffer past the model's positions holds nothing more (and its size must stay finite).
    if let Some(&k) = args.top_k.iter().find(|&&k| device_buffer_size(args, k) > context_max) {
        let reason = format!(
            "top-k {k}'s hot buffer of {} slots passes the model's {context_max} positions",
            device_buffer_size(args, k)
        );
        return Err(match args.buffer_factor {
            Some(f) => BenchError::flag("buffer-factor", format!("{f:?}"), reason),
            None => BenchError::flag("top-k", k, reason),
        });
    }
    super::model_source::check_score_margin(args.score_margin, args.record_trace.is_some())?;
    if let Some(p) = &args.record_trace
        && (args.contexts.len() != 1 || args.top_k.len() != 1 || args.model.index_format.len() > 1)
    {
        return Err(BenchError::flag(
            "record-trace",
            p.display(),
            "records one run: give one --contexts, one --top-k and one --index-format",
        ));
    }
    Ok(())
}

fn row(
    context: usize,
    kind: AttentionKind,
    (top_k, key): (usize, IndexKeyLayout),
    run: &ForcedOut,
    dense: Option<&ForcedOut>,
) -> EvalRow {
    let nll: Vec<f64> = run.nll.iter().flatten().copied().collect();
    let steps: usize = run.argmax.iter().map(Vec::len).sum();
    let agree = match dense {
        Some(d) => {
            let same: usize =
                run.argmax.iter().zip(&d.argmax).map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x == y).count()).sum();
            same as f64 / steps.max(1) as f64
        }
        None => 1.0,
    };
    EvalRow {
        context,
        attention: kind.name(),
        top_k,
        index_format: (top_k > 0).then(|| key.format().name()),
        index_bytes: (top_k > 0).then(|| key.bytes_per_position()),
        perplexity: (nll.iter().sum::<f64>() / nll.len().max(1) as f64).exp(),
        agreement: agree,
        identical_to_resident: None,
        tokens_per_s: steps as f64 / run.decode_secs.max(1e-9),
        select_ms: 1e3 * run.select_secs / run.steps.max(1) as f64,
        hits: run.counts.hits,
        misses: run.counts.misses,
    }
}

/// [`hisparse_model::Llama::teacher_forced_by_engine`] on the CUDA backend of GPU 0.
#[cfg(feature = "cuda")]
fn forced_on_cuda(
    m: &hisparse_model::Llama,
    cfg: hisparse_engine::CacheConfig,
    (prompts, next): (&[PrefillOut], &[&[u32]]),
    keep: bool,
    how: (hisparse_engine::StopFlag, Option<hisparse_model::TraceSink>),
) -> Result<ForcedOut> {
    Ok(m.teacher_forced_by_engine(super::model_args::cuda_backend()?, cfg, prompts, next, keep, how)?)
}

#[cfg(not(feature = "cuda"))]
fn forced_on_cuda(
    _m: &hisparse_model::Llama,
    _cfg: hisparse_engine::CacheConfig,
    _prompts: (&[PrefillOut], &[&[u32]]),
    _keep: bool,
    _how: (hisparse_engine::StopFlag, Option<hisparse_model::TraceSink>),
) -> Result<ForcedOut> {
    Err(BenchError::flag("backend", "cuda", "this build has no CUDA support (feature `cuda`)"))
}

/// Runs the evaluation; returns the rows and the output folder, if any.
pub fn run(args: &EvalArgs) -> Result<(Vec<EvalRow>, Option<PathBuf>)> {
    let m = args.model.load()?;
    check(args, m.config().context)?;
    let out = args.out.as_ref().map(|d| OutputDir::prepare("out", d)).transpose()?;
    let mut trace =
        args.record_trace.as_ref().map(|p| AtomicFile::create("record-trace", p, args.overwrite)).transpose()?;
    let tokens = super::model_args::read_tokens(&args.text, &m)?;
    let formats = &args.model.index_formats(m.config());
    let runs_per_context = 1 + 2 * args.top_k.len() * formats.len();
    let bar = progress::bar((args.contexts.len() * (1 + runs_per_context)) as u64, "prefill and decode");
    let mut rows = Vec::new();
    for &c in &args.contexts {
        let need = c + args.decode;
        // The windows' rows must fit the machine, a copy of each window's prompt per index
        // format (checked by the config, before anything is allocated; the flag the user gave is
        // --windows).
        let held = args.windows.saturating_mul(formats.len());
        let probe = args
            .model
            .cache_config(m.config(), AttentionKind::Dense, 0, ("buffer-factor", 0), need, held)
            .map_err(|e| match e {
                BenchError::Model(ModelError::Invalid { field, reason, .. }) if field == "requests" => {
                    let per = if formats.len() > 1 {
                        format!(" (its prompts once per index format: {held})")
                    } else {
                        String::new()
                    };
                    BenchError::flag("windows", args.windows, format!("{reason}{per}"))
                }
                e => e,
            })?;
        let starts = super::model_args::window_starts(tokens.len(), need, args.windows)?;

        let (kv, first) = (probe.geometry.kv_row()?, probe.geometry.index_key()?);
        let keys = formats
            .iter()
            .map(|&f| {
                IndexKeyLayout::with_format(first.dim(), f)
                    .map_err(|e| BenchError::flag("index-format", f, e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        // Per format, each window's prompt (one forward pass for all formats).
        let mut prompts: Vec<Vec<PrefillOut>> = keys.iter().map(|_| Vec::new()).collect();
        for &s in &starts {
            interrupt::check(|| "prefilling".into())?;
            for (of_format, p) in prompts.iter_mut().zip(m.prefill_keyed(&tokens[s..s + c], kv, &keys)?) {
                of_format.push(p);
            }
        }
        bar.inc(1);
        let next: Vec<&[u32]> = starts.iter().map(|&s| &tokens[s + c..s + need]).collect();
        let mut forced = |kind: AttentionKind, k: usize, keep: bool, f: usize| -> Result<ForcedOut> {
            interrupt::check(|| "decoding".into())?;
            let buffer = device_buffer_size(args, k);
            let model = args.model.with_index_format(formats[f]);
            let cfg = model.cache_config(m.config(), kind, k, ("buffer-factor", buffer), need, args.windows)?;
            // The hisparse run (one context and one top-k with --record-trace) records its
            // selections through the engine, into a handle on the trace's temporary file.
            let record = match (kind, trace.as_mut()) {
                (AttentionKind::HiSparse, Some(f)) => Some((f.second_writer()?, args.score_margin)),
                _ => None,
            };
            let how = (interrupt::engine_stop(), record);
            let r = match args.model.backend {
                ModelBackend::Cpu => {
                    m.teacher_forced_by_engine(hisparse_engine::CpuBackend::new(), cfg, &prompts[f], &next, keep, how)?
                }
                ModelBackend::Cuda => forced_on_cuda(&m, cfg, (&prompts[f], &next), keep, how)?,
            };
            bar.inc(1);
            Ok(r)
        };
        let dense = forced(AttentionKind::Dense, 0, false, 0)?;
        rows.push(row(c, AttentionKind::Dense, (0, first), &dense, None));
        for (f, &key) in keys.iter().enumerate() {
            for &k in &args.top_k {
                let resident = forced(AttentionKind::SparseResident, k, true, f)?;
                let hs = forced(AttentionKind::HiSparse, k, true, f)?;
                rows.push(row(c, AttentionKind::SparseResident, (k, key), &resident, Some(&dense)));
                let mut r = row(c, AttentionKind::HiSparse, (k, key), &hs, Some(&dense));
                r.identical_to_resident = Some(hs.logits == resident.logits);
                rows.push(r);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(file) = trace {
        file.commit()?;
    }
    let placed = match out {
        Some(dir) => {
            dir.write_json("eval.json", &rows)?;
            dir.write("eval.csv", csv(&rows).as_bytes())?;
            dir.write("eval.svg", plot(&rows)?.as_bytes())?;
            if formats.len() > 1 {
                dir.write("eval-bytes.svg", plot_bytes(&rows)?.as_bytes())?;
            }
            Some(dir.commit()?)
        }
        None => None,
    };
    Ok((rows, placed))
}

fn csv(rows: &[EvalRow]) -> String {
    let mut s = String::from(
        "context,attention,top_k,perplexity,agreement,identical_to_resident,tokens_per_s,hits,misses,index_format,\
         index_bytes,select_ms\n",
    );
    for r in rows {
        let id = r.identical_to_resident.map_or(String::new(), |b| b.to_string());
        let (f, b) =
            (r.index_format.clone().unwrap_or_default(), r.index_bytes.map_or(String::new(), |b| b.to_string()));
        let _ = writeln!(
            s,
            "{},{},{},{:.4},{:.4},{id},{:.2},{},{},{f},{b},{:.3}",
            r.context, r.attention, r.top_k, r.perplexity, r.agreement, r.tokens_per_s, r.hits, r.misses, r.select_ms
        );
    }
    s
}

/// The index formats of the sparse rows, in order of first appearance.
fn formats_of(rows: &[EvalRow]) -> Vec<&str> {
    let mut fs: Vec<&str> = Vec::new();
    for f in rows.iter().filter_map(|r| r.index_format.as_deref()) {
        if !fs.contains(&f) {
            fs.push(f);
        }
    }
    fs
}

/// Perplexity against top-k, one line per context (and index format, where several), dense as
/// a dashed reference.
fn plot(rows: &[EvalRow]) -> Result<String> {
    let mut series = Vec::new();
    let mut contexts: Vec<usize> = rows.iter().map(|r| r.context).collect();
    contexts.dedup();
    let formats = formats_of(rows);
    let ks: Vec<f64> = rows.iter().filter(|r| r.top_k > 0).map(|r| r.top_k as f64).collect();
    let (lo, hi) = ks.iter().fold((f64::MAX, 0f64), |(a, b), &k| (a.min(k), b.max(k)));
    for (i, &c) in contexts.iter().enumerate() {
        for (j, &f) in formats.iter().enumerate() {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.context == c && r.attention == "hisparse" && r.index_format.as_deref() == Some(f))
                .map(|r| (r.top_k as f64, r.perplexity))
                .collect();
            let label = match formats.len() {
                1 => format!("hisparse, context {c}"),
                _ => format!("hisparse, context {c}, keys {f}"),
            };
            series.push(Series { label, points: pts, color: Some(i * formats.len() + j), ..Default::default() });
        }
        if let Some(d) = rows.iter().find(|r| r.context == c && r.top_k == 0) {
            series.push(Series {
                label: format!("dense, context {c}"),
                points: vec![(lo, d.perplexity), (hi, d.perplexity)],
                dashed: true,
                color: Some(i * formats.len()),
                ..Default::default()
            });
        }
    }
    let chart = Chart {
        title: "Perplexity against top-k (real text)",
        x_label: "top-k",
        y_label: "perplexity",
        log_x: true,
        markers: &[],
    };
    line_chart(&chart, &series)
}

/// Perplexity against the index's device bytes per token and layer, one line per context and
/// top-k (hisparse, which equals sparse resident), dense as a dashed reference per context.
fn plot_bytes(rows: &[EvalRow]) -> Result<String> {
    let mut series = Vec::new();
    let mut lines: Vec<(usize, usize)> = Vec::new();
    for r in rows.iter().filter(|r| r.attention == "hisparse") {
        if !lines.contains(&(r.context, r.top_k)) {
            lines.push((r.context, r.top_k));
        }
    }
    let bytes: Vec<f64> = rows.iter().filter_map(|r| r.index_bytes).map(|b| b as f64).collect();
    let (lo, hi) = bytes.iter().fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
    for (i, &(c, k)) in lines.iter().enumerate() {
        let mut pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| (r.context, r.top_k) == (c, k) && r.attention == "hisparse")
            .filter_map(|r| Some((r.index_bytes? as f64, r.perplexity)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(Series {
            label: format!("context {c}, top-k {k}"),
            points: pts,
            color: Some(i),
            ..Default::default()
        });
    }
    let mut contexts: Vec<usize> = rows.iter().map(|r| r.context).collect();
    contexts.dedup();
    for (i, &c) in contexts.iter().enumerate() {
        if let Some(d) = rows.iter().find(|r| r.context == c && r.top_k == 0) {
            series.push(Series {
                label: format!("dense, context {c} (no index)"),
                points: vec![(lo, d.perplexity), (hi, d.perplexity)],
                dashed: true,
                color: Some(lines.len() + i),
                ..Default::default()
            });
        }
    }
    let chart = Chart {
        title: "Perplexity against the index's bytes (real text)",
        x_label: "index bytes per token and layer",
        y_label: "perplexity",
        log_x: false,
        markers: &[],
    };
    line_chart(&chart, &series)
}

/// The table, after a line naming the sparse runs' index keys.
pub fn render(rows: &[EvalRow], out: &Option<PathBuf>) -> String {
    let mut s = String::new();
    let formats = formats_of(rows);
    let bytes_of = |f: &str| rows.iter().find(|r| r.index_format.as_deref() == Some(f)).and_then(|r| r.index_bytes);
    match formats.as_slice() {
        [] => {}
        [f] => {
            let _ = writeln!(
                s,
                "sparse runs select by index keys of {f}: {} B per token and layer",
                bytes_of(f).unwrap_or(0)
            );
        }
        fs => {
            let each: Vec<String> = fs.iter().map(|f| format!("{f} ({} B)", bytes_of(f).unwrap_or(0))).collect();
            let _ = writeln!(s, "sparse runs select by index keys of {} per token and layer", each.join(", "));
        }
    }
    let several = formats.len() > 1;
    s.push_str(
        "context  attention        top-k  perplexity  agreement  identical  tokens/s  select ms     hits   misses",
    );
    s.push_str(if several { "  keys\n" } else { "\n" });
    for r in rows {
        let id = match r.identical_to_resident {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        let _ = writeln!(
            s,
            "{:>7}  {:<15} {:>6}  {:>10.3}  {:>8.1}%  {:>9}  {:>8.1}  {:>9.2}  {:>7}  {:>7}",
            r.context,
            r.attention,
            if r.top_k == 0 { "all".to_string() } else { r.top_k.to_string() },
            r.perplexity,
            100.0 * r.agreement,
            id,
            r.tokens_per_s,
            r.select_ms,
            r.hits,
            r.misses
        );
        if several {
            // The row's line without its newline, then its keys.
            s.pop();
            let _ = writeln!(s, "  {}", r.index_format.as_deref().unwrap_or("-"));
        }
    }
    if let Some(d) = out {
        let plots = if several { "eval.svg, eval-bytes.svg" } else { "eval.svg" };
        let _ = writeln!(s, "wrote {}/eval.json, eval.csv, {plots}", d.display());
    }
    s
}

/// The hot buffer's regular slots for top-k `k`: `--buffer-factor` times `k` (rounded up; a
/// factor past any count saturates, which the model's positions then refuse), else the hot
/// buffer's default.
fn device_buffer_size(args: &EvalArgs, k: usize) -> usize {
    match args.buffer_factor {
        Some(f) => (k as f64 * f).ceil() as usize,
        None => hisparse_policy::default_device_buffer_size(k),
    }
}
