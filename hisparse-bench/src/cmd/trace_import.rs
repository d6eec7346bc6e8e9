//! `hisparse trace import`: selections captured from another engine — per request a tensor of
//! selected positions `[steps, layers, top_k]` in a `.npy` file or a safetensors file — written
//! as a trace the simulator replays (format: the policy crate's README).

use std::path::PathBuf;

use hisparse_policy::trace::import::{ImportOptions, RequestSelections, import, parse_npy, parse_safetensors};
use hisparse_policy::trace::{TraceWriter, jsonl};

use crate::error::{BenchError, Result};
use crate::files::AtomicFile;
use crate::{guard, interrupt};

/// Options of `hisparse trace import`.
#[derive(Debug, Clone, clap::Args)]
pub struct ImportArgs {
    /// Input tensors: one .safetensors file (a tensor per request), or .npy files (one per
    /// request, numbered in the order given).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output trace (.hstrace; .jsonl for JSON lines); an existing file is refused unless
    /// --overwrite is given.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace an existing --out file.
    #[arg(long)]
    pub overwrite: bool,
    /// Prompt tokens per request: step s (from 1) has prompt + s tokens. Default: the tensor's
    /// NAME.seq_len companion, else the largest position selected so far plus one.
    #[arg(long, allow_negative_numbers = true)]
    pub prompt_len: Option<u32>,
    /// Bytes per KV row written into the header (656: fp8 rows).
    #[arg(long, default_value_t = 656, allow_negative_numbers = true)]
    pub row_bytes: u32,
    /// Record the layer structure of this preset (e.g. glm-5.2: which layers share a
    /// selection), so cross-layer prefetch can be simulated.
    #[arg(long, conflicts_with = "index_source", value_parser = crate::cmd::common::parse_preset)]
    pub index_preset: Option<hisparse_memory::Preset>,
    /// Record this layer structure: per layer, the layer whose selection it uses.
    #[arg(long, value_delimiter = ',')]
    pub index_source: Vec<u32>,
}

/// Reads every input whole (not mapped: a file another process shrinks meanwhile gives a short
/// read, refused by the tensor's checks, never a SIGBUS), within the memory the inputs and the
/// records made from them may take together.
fn read_inputs(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>> {
    let mut left = crate::files::input::memory_limit(3);
    paths
        .iter()
        .map(|p| {
            let bytes = crate::files::Input::open("inputs", p)?.read_all("the tensor file", left)?;
            left = left.saturating_sub(bytes.len() as u64);
            Ok(bytes)
        })
        .collect()
}

/// Runs the import; returns what it wrote, as a line.
pub fn run(a: &ImportArgs) -> Result<String> {
    guard::within("row-bytes", a.row_bytes as usize, 1, 1 << 20)?;
    let index_source = match &a.index_preset {
        Some(p) => {
            let g = p.geometry();
            (0..g.layers).map(|l| g.index_source(l) as u32).collect()
        }
        None => a.index_source.clone(),
    };
    let maps = read_inputs(&a.inputs)?;
    let safetensors = a.inputs.iter().any(|p| p.extension().is_some_and(|e| e == "safetensors"));
    let requests: Vec<RequestSelections<'_>> = if safetensors {
        if maps.len() != 1 {
            return Err(BenchError::flag("inputs", maps.len(), "give one .safetensors file (a tensor per request)"));
        }
        parse_safetensors(&maps[0]).map_err(|e| BenchError::flag("inputs", a.inputs[0].display(), e.to_string()))?
    } else {
        maps.iter()
            .zip(&a.inputs)
            .enumerate()
            .map(|(i, (m, p))| {
                let tensor = parse_npy(m).map_err(|e| BenchError::flag("inputs", p.display(), e.to_string()))?;
                Ok(RequestSelections { request: i as u64, tensor, seq_lens: None })
            })
            .collect::<Result<_>>()?
    };
    // The records: per selected position 4 bytes, plus each record's own fields.
    let bytes = requests.iter().try_fold(0u64, |acc, r| {
        let [s, l, k] = r.tensor.shape;
        let recs = (s as u64).checked_mul(l as u64)?;
        acc.checked_add(recs.checked_mul((k as u64).checked_mul(4)?.checked_add(96)?)?)
    });
    guard::memory("inputs", a.inputs[0].display(), "the imported selections", bytes)?;
    let opts = ImportOptions { prompt_len: a.prompt_len, row_bytes: a.row_bytes, index_source };
    let (header, records) = import(&requests, &opts).map_err(|e| match e {
        hisparse_policy::PolicyError::Invalid { field: "index_source", value, reason } => {
            BenchError::flag("index-source", value, reason)
        }
        e => {
            let names: Vec<String> = a.inputs.iter().map(|p| p.display().to_string()).collect();
            BenchError::flag("inputs", names.join(" "), e.to_string())
        }
    })?;
    interrupt::check(|| "importing the selections".to_string())?;
    let mut file = AtomicFile::create("out", &a.out, a.overwrite)?;
    if a.out.extension().is_some_and(|e| e == "jsonl") {
        jsonl::write(file.writer(), &header, &records)?;
    } else {
        let mut w = TraceWriter::new(file.writer(), header.clone())?;
        for r in &records {
            w.write(r)?;
        }
        w.finish()?;
    }
    let path = file.commit()?;
    Ok(format!(
        "wrote {} ({} records: {} requests, {} layers, top_k {})",
        path.display(),
        records.len(),
        requests.len(),
        header.layers,
        header.top_k
    ))
}
