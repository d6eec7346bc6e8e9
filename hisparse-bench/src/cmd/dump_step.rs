//! `hisparse dump-step`: one decode step's inputs and outputs as a safetensors file, so that
//! anyone can check our arithmetic with their own tools, from the index keys to the attention
//! output. The tensors are listed in [`TENSORS`] (and by `hisparse dump-step --help`).
//!
//! Metadata: `geometry` (JSON), `mode`, `step`, `softmax_scale`, `requests` (ids, JSON), and
//! `row_format` (the byte layout of a row). The checks: `scores[t] = sum_h w_h relu(q_h .
//! key_t)` with `key_t = codes_t * scale_t` (the newest position set to +inf); the selections are
//! the `top_k` highest scores (ties to the lower position); for each request and head,
//! `softmax(scale * q . rows_f32) @ rows_f32[:, :d_v] == out` and
//! `logsumexp(scale * q . rows_f32) == lse`.

use std::collections::HashMap;
use std::path::PathBuf;

use hisparse_engine::RequestSpec;
use hisparse_memory::{Mode, RequestId};
use safetensors::{Dtype, tensor::TensorView};

use super::common::EngineArgs;
use super::run::ModeArg;
use crate::error::{BenchError, Result};
use crate::files::AtomicFile;
use crate::{guard, interrupt};

/// Every tensor of the file, per layer `l`: name, dtype, shape and meaning (also shown by
/// `--help`).
pub const TENSORS: &str = "\
Tensors, per layer l (dtype, shape: meaning):
  L{l}.index_queries      BF16 [batch, index_heads, index_dim]: indexer queries
  L{l}.index_weights      F32  [batch, index_heads]: indexer head weights
  L{l}.index_key_codes    U8   [sum of seq_lens, index_dim]: every position's index key, e4m3 codes
  L{l}.index_key_scales   F32  [sum of seq_lens]: each index key's scale (key = codes * scale)
  L{l}.scores             F32  [sum of seq_lens]: indexer scores, requests concatenated (newest = +inf)
  L{l}.seq_lens           I32  [batch]: positions per request (newest included)
  L{l}.selections         I32  [total selected]: selected positions, ascending per request; the
                                position of each row of selected_rows
  L{l}.selection_lens     I32  [batch]: selected positions per request
  L{l}.locations          I32  [total selected]: the pool row attention read for each selection
  L{l}.attention_queries  BF16 [batch, heads, d_qk]: attention queries
  L{l}.selected_rows      U8   [total selected, row_bytes]: the selected KV rows' bytes
  L{l}.selected_rows_f32  F32  [total selected, d_qk]: the same rows decoded
  L{l}.out                F32  [batch, heads, d_v]: attention output
  L{l}.lse                F32  [batch, heads]: natural-log sum of exp of the scaled logits";

/// Options of `hisparse dump-step`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = TENSORS)]
pub struct DumpStepArgs {
    /// Engine options.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Mode (resident or hisparse).
    #[arg(long, value_enum, default_value_t = ModeArg::Hisparse)]
    pub mode: ModeArg,
    /// Requests.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Which decode step to dump (from 1).
    #[arg(long, default_value_t = 3)]
    pub step: usize,
    /// The safetensors file to write (an existing file is refused unless --overwrite is given).
    #[arg(long, default_value = "results/step.safetensors")]
    pub out: PathBuf,
    /// Replace an existing --out file.
    #[arg(long)]
    pub overwrite: bool,
}

/// The little-endian bytes of `v` (every target we build for is little-endian).
fn bytes_of<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Runs up to the step and writes the file; returns its path and the tensor count.
pub fn run(a: &DumpStepArgs) -> Result<(PathBuf, usize)> {
    let mode = match a.mode {
        ModeArg::Resident => Mode::Resident,
        ModeArg::Hisparse => Mode::HiSparse,
        ModeArg::Hybrid => Mode::Hybrid,
        many @ (ModeArg::Both | ModeArg::All) => {
            let name = if many == ModeArg::All { "all" } else { "both" };
            return Err(BenchError::flag("mode", name, "dump-step dumps one mode: resident, hisparse or hybrid"));
        }
    };
    guard::within("concurrency", a.concurrency, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
    guard::at_least_one("step", a.step)?;
    guard::at_least_one("context", a.context)?;
    let total = guard::sum(("context", a.context), ("step", a.step))?;
    if total > u32::MAX as usize / 2 {
        let (flag, v) = if a.context > a.step { ("context", a.context) } else { ("step", a.step) };
        return Err(BenchError::flag(flag, v, "a request (context + step) must stay below 2^31 tokens"));
    }
    // The folder (made if missing, removed again if this fails) and the file are checked for
    // writability, and an existing file refused, before any work.
    let mut file = AtomicFile::create_with_folders("out", &a.out, a.overwrite)?;
    // A request too long for the tiers is refused naming the larger of the two flags.
    let (flag, value) = if a.step > a.context { ("step", a.step) } else { ("context", a.context) };
    let g = a.engine.geometry()?;
    a.engine.check_request_fits(&g, &a.engine.hisparse(&g)?, Mode::HiSparse, flag, value, total)?;
    let mut e = a.engine.engine(mode, (total, total), flag)?;
    for i in 0..a.concurrency {
        e.submit(RequestSpec { id: RequestId(i as u64), prompt_tokens: a.context, output_tokens: a.step })?;
    }
    for s in 1..a.step {
        interrupt::check(|| format!("running up to step {} (at step {s})", a.step))?;
        e.step()?;
        if e.is_idle() {
            break;
        }
    }
    e.capture_next_step();
    let rep = e.step()?;
    if rep.dump.is_empty() {
        return Err(BenchError::flag(
            "concurrency",
            a.concurrency,
            "no request was decoding at that step (did the tiers reject them? see `hisparse run`)",
        ));
    }
    let g = e.config().cache.geometry.clone();
    let layout = g.kv_row()?;
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for d in &rep.dump {
        let b = d.requests.len();
        let total: usize = d.selection_lens.iter().map(|&x| x as usize).sum();
        let l = d.layer;
        let i32s = |v: &[u32]| bytes_of(&v.iter().map(|&x| x as i32).collect::<Vec<_>>());
        let mut decoded = vec![0f32; total * layout.row_dims()];
        for (row, o) in d.selected_rows.chunks(layout.row_bytes()).zip(decoded.chunks_mut(layout.row_dims())) {
            layout.decode(row, o)?;
        }
        tensors.push((
            format!("L{l}.index_queries"),
            Dtype::BF16,
            vec![b, g.index_heads, g.index_dim],
            bytes_of(&d.index_queries),
        ));
        tensors.push((format!("L{l}.index_weights"), Dtype::F32, vec![b, g.index_heads], bytes_of(&d.index_weights)));
        let kb = g.index_key()?.row_bytes();
        let positions = d.index_keys.len() / kb.max(1);
        let (mut codes, mut key_scales) = (Vec::with_capacity(positions * g.index_dim), Vec::with_capacity(positions));
        for row in d.index_keys.chunks_exact(kb) {
            codes.extend_from_slice(&row[..g.index_dim]);
            let s = row
                .get(g.index_dim..g.index_dim + 4)
                .ok_or_else(|| BenchError::Check("index key row too short".into()))?;
            key_scales.push(f32::from_le_bytes([s[0], s[1], s[2], s[3]]));
        }
        tensors.push((format!("L{l}.index_key_codes"), Dtype::U8, vec![positions, g.index_dim], codes));
        tensors.push((format!("L{l}.index_key_scales"), Dtype::F32, vec![positions], bytes_of(&key_scales)));
        tensors.push((format!("L{l}.scores"), Dtype::F32, vec![d.scores.len()], bytes_of(&d.scores)));
        tensors.push((format!("L{l}.seq_lens"), Dtype::I32, vec![b], i32s(&d.seq_lens)));
        tensors.push((format!("L{l}.selections"), Dtype::I32, vec![total], i32s(&d.selections)));
        tensors.push((format!("L{l}.selection_lens"), Dtype::I32, vec![b], i32s(&d.selection_lens)));
        tensors.push((format!("L{l}.locations"), Dtype::I32, vec![d.locations.len()], bytes_of(&d.locations)));
        tensors.push((
            format!("L{l}.attention_queries"),
            Dtype::BF16,
            vec![b, g.q_heads, g.d_qk()],
            bytes_of(&d.attention_queries),
        ));
        tensors.push((
            format!("L{l}.selected_rows"),
            Dtype::U8,
            vec![total, layout.row_bytes()],
            d.selected_rows.clone(),
        ));
        tensors.push((
            format!("L{l}.selected_rows_f32"),
            Dtype::F32,
            vec![total, layout.row_dims()],
            bytes_of(&decoded),
        ));
        tensors.push((format!("L{l}.out"), Dtype::F32, vec![b, g.q_heads, g.d_v()], bytes_of(&d.out)));
        tensors.push((format!("L{l}.lse"), Dtype::F32, vec![b, g.q_heads], bytes_of(&d.lse)));
    }
    let views = tensors
        .iter()
        .map(|(n, dt, shape, data)| {
            TensorView::new(*dt, shape.clone(), data)
                .map(|v| (n.clone(), v))
                .map_err(|e| BenchError::Check(format!("tensor {n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut meta = HashMap::new();
    meta.insert("geometry".to_string(), serde_json::to_string(&g).unwrap_or_default());
    meta.insert("mode".to_string(), mode.to_string());
    meta.insert("step".to_string(), a.step.to_string());
    meta.insert("softmax_scale".to_string(), format!("{:e}", g.default_softmax_scale()));
    meta.insert("requests".to_string(), serde_json::to_string(&rep.dump[0].requests).unwrap_or_default());
    meta.insert(
        "row_format".to_string(),
        match layout.format() {
            hisparse_memory::KvRowFormat::Fp8 => {
                "fp8: 512 e4m3 latent, 4 fp32 scales (one per 128), 64 bf16 rope; little-endian".into()
            }
            hisparse_memory::KvRowFormat::Bf16 => {
                "bf16: 576 bf16 values (512 latent then 64 rope); little-endian".into()
            }
        },
    );
    let bytes =
        safetensors::serialize(views, Some(meta)).map_err(|e| BenchError::Check(format!("safetensors: {e}")))?;
    std::io::Write::write_all(file.writer(), &bytes)
        .map_err(|source| BenchError::Io { path: a.out.display().to_string(), source })?;
    let path = file.commit()?;
    Ok((path, tensors.len()))
}
