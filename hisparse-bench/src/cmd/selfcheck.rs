//! `hisparse selfcheck`: runs every CPU kernel of a decode step on seeded random data of a preset's
//! shape, checks each against its oracle (f64 indexer, sort-based top-k, dense f64 attention, bf16
//! against fp8 rows), and times each against the host memcpy ceiling measured in the same run.

use hisparse_kernels::Kernels;
use std::path::PathBuf;

use half::bf16;
use hisparse_kernels::random::{self, decode_kv_rows, encode_kv_rows};
use hisparse_kernels::{AttentionBatch, CpuBackend, IndexerBatch, IndexerRequest, Span, dense_attention};
use hisparse_memory::{EmulatedDevice, KvGeometry, KvRowFormat};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::guard;
use crate::timing::{median_secs, memcpy_bandwidth};

/// Options of `hisparse selfcheck`.
#[derive(Debug, Clone, clap::Args)]
pub struct SelfcheckArgs {
    /// Model geometry preset: deepseek-v3.2, glm-5.1, glm-5.2 (with IndexShare), cpu-small,
    /// smollm2-135m or llama-3.1-8b.
    #[arg(long, default_value = "deepseek-v3.2", value_parser = crate::cmd::common::parse_preset)]
    pub preset: hisparse_memory::Preset,
    /// Requests in the batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Context length of every request (tokens).
    #[arg(long, default_value_t = 32768)]
    pub context: usize,
    /// Timed runs per kernel (the median is reported, after one warm-up run).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Seed of the random data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the report as JSON to this file (an existing file is refused unless
    /// --overwrite is given).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing --json file.
    #[arg(long)]
    pub overwrite: bool,
}

/// One kernel's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct KernelLine {
    /// Kernel name.
    pub kernel: String,
    /// What the check compared, and the worst difference found.
    pub check: String,
    /// Worst difference against the oracle (in the check's unit).
    pub max_error: f64,
    /// Tolerance the check enforces.
    pub tolerance: f64,
    /// Median seconds per call.
    pub median_s: f64,
    /// Bytes the kernel must read per call.
    pub bytes: f64,
    /// Floating-point operations per call.
    pub flops: f64,
}

impl KernelLine {
    /// Whether the error is within tolerance (a NaN error fails).
    pub fn passed(&self) -> bool {
        self.max_error <= self.tolerance
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SelfcheckReport {
    /// Geometry used.
    pub geometry: KvGeometry,
    /// Requests per batch.
    pub batch: usize,
    /// Tokens per request.
    pub context: usize,
    /// rayon worker threads.
    pub threads: usize,
    /// Host memcpy bandwidth (read + write bytes/s), the in-run ceiling.
    pub memcpy_bytes_per_s: f64,
    /// One line per kernel.
    pub kernels: Vec<KernelLine>,
}

/// Runs the self-check; fails if any kernel is out of tolerance.
pub fn run(args: &SelfcheckArgs) -> Result<SelfcheckReport> {
    let g = args.preset.geometry();
    guard::at_least_one("batch", args.batch)?;
    guard::within("runs", args.runs, 1, 1000)?;
    if args.context < g.top_k {
        return Err(BenchError::flag(
            "context",
            args.context,
            format!("must be at least the preset's top_k = {}", g.top_k),
        ));
    }
    let (b, l, k) = (args.batch, args.context, g.top_k);
    // Per position: its index key, score, KV row and the row decoded for the oracle.
    let per = g.index_key()?.row_bytes() + 4 + g.kv_row()?.row_bytes() + 4 * g.d_qk();
    let bytes = guard::product(&[b, l.div_ceil(64) * 64, per]);
    // Name the flag that asks for more than its default.
    let (flag, value) = if b as f64 / 4.0 >= l as f64 / 32768.0 { ("batch", b) } else { ("context", l) };
    guard::memory(flag, value, "the batch's keys, scores and rows", bytes)?;
    // Checked for writability (and refused if it exists) before any work.
    let json = match &args.json {
        Some(p) => Some(crate::files::AtomicFile::create("json", p, args.overwrite)?),
        None => None,
    };
    let bar = ProgressBar::new(6).with_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let cpu = CpuBackend::new();
    let mut rng = random::rng(args.seed);
    let mut lines = Vec::new();

    crate::interrupt::check(|| "self-checking the CPU kernels (memcpy ceiling)".into())?;

    bar.set_message("memcpy ceiling");
    let memcpy = memcpy_bandwidth(256 << 20);
    bar.inc(1);

    // Indexer over every position of every request.
    crate::interrupt::check(|| "self-checking the CPU kernels (indexer)".into())?;
    bar.set_message("indexer");
    let key = g.index_key()?;
    // Whole pages of 64 keys per request; position t of request i is key i * pages + t.
    // Drawn in chunks (the same stream as one draw) so that a Ctrl-C is seen between them.
    let rows = b * l.div_ceil(64) * 64;
    let mut keys = Vec::new();
    for start in (0..rows).step_by(1 << 16) {
        crate::interrupt::check(|| "self-checking the CPU kernels (indexer inputs)".into())?;
        keys.extend(random::index_key_pool(&mut rng, key, (rows - start).min(1 << 16))?);
    }
    let (ih, dim) = (g.index_heads, g.index_dim);
    let q_idx = random::normal_bf16(&mut rng, b * ih * dim, 1.0);
    let w = random::head_weights(&mut rng, b * ih);
    let requests: Vec<IndexerRequest> =
        (0..b).map(|i| IndexerRequest { first_page: i * l.div_ceil(64), seq_len: l, score_offset: i * l }).collect();
    let page_table: Vec<u32> = (0..(b * l.div_ceil(64)) as u32).collect();
    let batch = IndexerBatch {
        heads: ih,
        key_layout: key,
        queries: &q_idx,
        weights: &w,
        keys: &keys,
        page_tokens: 64,
        page_table: &page_table,
        requests: &requests,
        pin_newest: false,
        queries_as: hisparse_kernels::IndexerQueries::Exact,
        score: hisparse_kernels::IndexScore::Lightning,
    };
    let mut scores = vec![0f32; b * l];
    let t = median_secs(1, args.runs, || cpu.indexer_scores(&batch, &mut scores));
    crate::interrupt::check(|| "self-checking the CPU kernels (indexer)".into())?;
    cpu.indexer_scores(&batch, &mut scores)?;
    let err = check_indexer(&scores, &batch)?;
    lines.push(KernelLine {
        kernel: "indexer".into(),
        check: format!("{b} x {l} positions, {ih} heads x {dim}; sampled positions vs f64 (relative to |w||q||k|)"),
        max_error: err,
        tolerance: 1e-5,
        median_s: t,
        bytes: (b * l * key.row_bytes()) as f64,
        flops: (2 * b * l * ih * dim) as f64,
    });
    bar.inc(1);

    // Top-k of every request.
    crate::interrupt::check(|| "self-checking the CPU kernels (top-k)".into())?;
    bar.set_message("top-k");
    let spans: Vec<Span> = (0..b).map(|i| Span::new(i * l, l)).collect();
    let mut top = vec![0i32; b * k];
    let t = median_secs(1, args.runs, || cpu.top_k(&scores, &spans, k, &mut top));
    crate::interrupt::check(|| "self-checking the CPU kernels (top-k)".into())?;
    cpu.top_k(&scores, &spans, k, &mut top)?;
    let wrong = check_top_k(&scores[..l], &top[..k]);
    lines.push(KernelLine {
        kernel: "top-k".into(),
        check: format!("{k} of {l} per request; request 0 vs a full sort (positions that differ)"),
        max_error: wrong as f64,
        tolerance: 0.0,
        median_s: t,
        bytes: (b * l * 4) as f64,
        flops: 0.0,
    });
    bar.inc(1);

    // Sparse attention over the selections, rows in the preset's format.
    crate::interrupt::check(|| "self-checking the CPU kernels (sparse attention)".into())?;
    bar.set_message("sparse attention");
    let layout = g.kv_row()?;
    let (pool, values) = random::kv_pool(&mut rng, layout, b * l)?;
    let q = random::normal_bf16(&mut rng, b * g.q_heads * g.d_qk(), 1.0);
    let locations: Vec<i32> = top.iter().enumerate().map(|(j, &p)| p + ((j / k) * l) as i32).collect();
    let sel: Vec<Span> = (0..b).map(|i| Span::new(i * k, k)).collect();
    let scale = g.default_softmax_scale();
    let attn = AttentionBatch {
        heads: g.q_heads,
        layout,
        softmax_scale: scale,
        queries: &q,
        rows: &pool,
        locations: &locations,
        selections: &sel,
    };
    let mut out = vec![0f32; b * g.q_heads * g.d_v()];
    let mut lse = vec![0f32; b * g.q_heads];
    let t = median_secs(1, args.runs, || cpu.sparse_attention(&attn, &mut out, &mut lse));
    crate::interrupt::check(|| "self-checking the CPU kernels (sparse attention)".into())?;
    cpu.sparse_attention(&attn, &mut out, &mut lse)?;
    bar.inc(1);
    crate::interrupt::check(|| "self-checking the CPU kernels (dense f64 oracle)".into())?;
    bar.set_message("dense f64 oracle");
    let sel_rows: Vec<u8> = locations[..k]
        .iter()
        .flat_map(|&r| pool[r as usize * layout.row_bytes()..(r as usize + 1) * layout.row_bytes()].to_vec())
        .collect();
    let decoded = decode_kv_rows(layout, &sel_rows)?;
    let q0: Vec<f32> = q[..g.q_heads * g.d_qk()].iter().map(|x| bf16::to_f32(*x)).collect();
    let (o_ref, l_ref) = dense_attention(&q0, &decoded, g.q_heads, g.d_qk(), g.d_v(), scale);
    let err = max_diff(&out[..g.q_heads * g.d_v()], &o_ref).max(max_diff(&lse[..g.q_heads], &l_ref));
    lines.push(KernelLine {
        kernel: format!("sparse attention ({})", layout.format()),
        check: format!("{b} x {k} rows, {} heads; request 0 vs dense f64 attention (abs)", g.q_heads),
        max_error: err,
        tolerance: 2e-5,
        median_s: t,
        bytes: (b * k * layout.row_bytes()) as f64,
        flops: (2 * b * g.q_heads * k * (g.d_qk() + g.d_v())) as f64,
    });
    bar.inc(1);

    // The same selected values in bf16 rows: how far fp8 moves the output.
    crate::interrupt::check(|| "self-checking the CPU kernels (fp8 vs bf16 rows)".into())?;
    bar.set_message("fp8 vs bf16 rows");
    let bf = g.clone().with_kv_format(KvRowFormat::Bf16).kv_row()?;
    let orig: Vec<f32> =
        locations[..k].iter().flat_map(|&r| values[r as usize * 576..(r as usize + 1) * 576].to_vec()).collect();
    let fp8 = g.clone().with_kv_format(KvRowFormat::Fp8).kv_row()?;
    let p8 = encode_kv_rows(fp8, &orig)?;
    let p16 = encode_kv_rows(bf, &orig)?;
    let lin: Vec<i32> = (0..k as i32).collect();
    let one = [Span::new(0, k)];
    let q0b = q[..g.q_heads * g.d_qk()].to_vec();
    let mut o8 = vec![0f32; g.q_heads * g.d_v()];
    let mut o16 = o8.clone();
    let mut l8 = vec![0f32; g.q_heads];
    let mut l16 = l8.clone();
    let a8 = AttentionBatch {
        heads: g.q_heads,
        layout: fp8,
        softmax_scale: scale,
        queries: &q0b,
        rows: &p8,
        locations: &lin,
        selections: &one,
    };
    cpu.sparse_attention(&a8, &mut o8, &mut l8)?;
    let a16 = AttentionBatch { rows: &p16, layout: bf, ..a8 };
    let t = median_secs(0, 1, || cpu.sparse_attention(&a16, &mut o16, &mut l16));
    crate::interrupt::check(|| "self-checking the CPU kernels (fp8 vs bf16 rows)".into())?;
    lines.push(KernelLine {
        kernel: "fp8 vs bf16 rows".into(),
        check: format!("request 0's {k} rows encoded both ways (abs output difference)"),
        max_error: max_diff(&o8, &o16),
        tolerance: 0.05,
        median_s: t,
        bytes: (k * bf.row_bytes()) as f64,
        flops: (2 * g.q_heads * k * (g.d_qk() + g.d_v())) as f64,
    });
    bar.inc(1);
    bar.finish_and_clear();

    let report = SelfcheckReport {
        geometry: g,
        batch: b,
        context: l,
        threads: rayon::current_num_threads(),
        memcpy_bytes_per_s: memcpy,
        kernels: lines,
    };
    if let Some(mut f) = json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Check(e.to_string()))?;
        std::io::Write::write_all(f.writer(), text.as_bytes()).map_err(|source| BenchError::Io {
            path: args.json.as_ref().map_or_else(String::new, |p| p.display().to_string()),
            source,
        })?;
        f.commit()?;
    }
    Ok(report)
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from((x - y).abs())).fold(0.0, f64::max)
}

/// Worst relative error of sampled indexer scores against f64, each request's position `t` at
/// `scores[score_offset + t]` and its key where `batch`'s page table puts it.
fn check_indexer(scores: &[f32], batch: &IndexerBatch<'_, EmulatedDevice>) -> Result<f64> {
    let (key, heads, pt) = (batch.key_layout, batch.heads, batch.page_tokens);
    let (q, w) = (batch.queries, batch.weights);
    let dim = key.dim();
    let mut worst = 0f64;
    let mut kf = vec![0f32; dim];
    for (i, r) in batch.requests.iter().enumerate() {
        let l = r.seq_len;
        for t in (0..l).step_by((l / 256).max(1)) {
            let page = batch.page_table[r.first_page + t / pt] as usize;
            let row = (page * pt + t % pt) * key.row_bytes();
            key.decode(&batch.keys[row..row + key.row_bytes()], &mut kf)?;
            let (mut s, mut mag) = (0f64, 0f64);
            for h in 0..heads {
                let qh = &q[(i * heads + h) * dim..(i * heads + h + 1) * dim];
                let d: f64 = qh.iter().zip(&kf).map(|(a, b)| f64::from(a.to_f32()) * f64::from(*b)).sum();
                let m: f64 = qh.iter().zip(&kf).map(|(a, b)| (f64::from(a.to_f32()) * f64::from(*b)).abs()).sum();
                s += f64::from(w[i * heads + h]) * d.max(0.0);
                mag += f64::from(w[i * heads + h]) * m;
            }
            worst = worst.max((f64::from(scores[r.score_offset + t]) - s).abs() / mag.max(1e-30));
        }
    }
    Ok(worst)
}

/// Number of positions where `top` differs from a full sort's top-k.
fn check_top_k(scores: &[f32], top: &[i32]) -> usize {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut want: Vec<i32> = idx[..top.len()].iter().map(|&i| i as i32).collect();
    want.sort_unstable();
    want.iter().zip(top).filter(|(a, b)| a != b).count()
}

/// The report as a table for the terminal.
pub fn render(r: &SelfcheckReport) -> String {
    let mut s = format!(
        "hisparse selfcheck: {} ({} layers of which one is run), batch {}, context {}, {} threads\n\
         host memcpy ceiling: {:.1} GB/s (read + write)\n\n",
        r.geometry.name,
        r.geometry.layers,
        r.batch,
        r.context,
        r.threads,
        r.memcpy_bytes_per_s / 1e9
    );
    s += &format!(
        "{:<26} {:>10} {:>10} {:>11} {:>9} {:>10}  check\n",
        "kernel", "max err", "tolerance", "median", "GB/s", "GFLOP/s"
    );
    for k in &r.kernels {
        let ok = if k.max_error <= k.tolerance { "ok" } else { "FAIL" };
        s += &format!(
            "{:<26} {:>10.2e} {:>10.1e} {:>9.2} ms {:>9.2} {:>10.2}  {ok}: {}\n",
            k.kernel,
            k.max_error,
            k.tolerance,
            k.median_s * 1e3,
            k.bytes / k.median_s / 1e9,
            k.flops / k.median_s / 1e9,
            k.check
        );
    }
    s
}

/// The kernels out of tolerance, as one line, or `None`.
pub fn failures(r: &SelfcheckReport) -> Option<String> {
    let bad: Vec<String> = r
        .kernels
        .iter()
        .filter(|k| !k.passed())
        .map(|k| format!("{} error {:.3e} > {:.1e}", k.kernel, k.max_error, k.tolerance))
        .collect();
    (!bad.is_empty()).then(|| bad.join("; "))
}
