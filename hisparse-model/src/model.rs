//! `Llama`: a loaded model (weights, RoPE tables, tokenizer), and `cache_config`, the cache a
//! model decodes through in each attention kind (dense, sparse resident, hisparse).

use std::path::Path;

use candle_core::Device;

use hisparse_engine::{CacheConfig, Mode, StopFlag, StorageFormats};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::math::Rope;
use crate::tokenizer::TextTokenizer;
use crate::weights::{LlamaWeights, open};

/// A llama model ready to decode through a KV cache.
pub struct Llama {
    /// The weights (and the shape, `weights.config`).
    pub weights: LlamaWeights,
    /// The tokenizer of the same file.
    pub tokenizer: TextTokenizer,
    pub(crate) rope: Rope,
    stop: StopFlag,
    pub(crate) tensor_layers: bool,
}

impl Llama {
    /// Loads the weights and the tokenizer of the llama GGUF file at `path`, the projections
    /// on the CPU.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_on(path, &Device::Cpu)
    }

    /// Loads the weights and the tokenizer of the llama GGUF file at `path`, the projections on
    /// `device` (a CUDA device's, `Device::new_cuda`, where candle is built with `cuda`: this
    /// crate's `candle-cuda`), where their products run; everything else stays on the host.
    pub fn load_on(path: &Path, device: &Device) -> Result<Self> {
        let tokenizer = {
            let (content, _) = open(path)?;
            TextTokenizer::from_gguf(&content)?
        };
        let weights = LlamaWeights::load_on(path, device)?;
        let c = &weights.config;
        if tokenizer.vocab() != c.vocab {
            return Err(ModelError::invalid(
                "tokenizer.ggml.tokens",
                tokenizer.vocab(),
                format!("the embedding has {} rows", c.vocab),
            ));
        }
        let rope = Rope::new(c.head_dim, c.rope_base, c.context);
        Ok(Self { weights, tokenizer, rope, stop: StopFlag::never(), tensor_layers: false })
    }

    /// Observes `stop`: a prefill stops between layers and a decode step before it begins, with
    /// `EngineError::Stopped`, leaving the cache as it was.
    pub fn set_stop(&mut self, stop: StopFlag) {
        self.stop = stop;
    }

    /// Hands every decode layer's attention to `DecodeStep::layer_tensors` as candle tensors
    /// (`true`) instead of `DecodeStep::layer` with slices (the default): the same results bit
    /// for bit, the way a model written with candle calls the cache.
    pub fn use_tensor_layers(&mut self, on: bool) {
        self.tensor_layers = on;
    }

    /// Fails once a stop was asked for.
    pub(crate) fn check_stop(&self) -> Result<()> {
        Ok(self.stop.check()?)
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// Checks that a request may hold a token at `position`.
    pub(crate) fn check_position(&self, position: usize) -> Result<()> {
        if position >= self.rope.positions() {
            return Err(ModelError::invalid(
                "position",
                position,
                format!("the model has {} positions", self.rope.positions()),
            ));
        }
        Ok(())
    }
}

/// How a model's attention reads its past.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKind {
    /// Every position, the whole KV on the device (the cache's resident mode with top-k at
    /// least the longest request; the oracle is skipped, as nothing is left to select).
    Dense,
    /// The oracle's top-k, the whole KV on the device.
    SparseResident,
    /// The oracle's top-k through hisparse's hot buffers and host tier.
    HiSparse,
}

impl AttentionKind {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Dense => "dense",
            Self::SparseResident => "sparse-resident",
            Self::HiSparse => "hisparse",
        }
    }
}

/// A cache config for `config`'s model in `kind`: `requests` requests of at most `max_tokens`,
/// `top_k` selected per layer (ignored for dense), hot buffers of `buffer` slots (hisparse),
/// rows in `kv_format`. The (emulated) device holds every request's rows and keys with a
/// quarter to spare, the host tier eight times that; refused when the rows would not fit in the
/// memory the machine has (twice: the caller holds its prompts' rows too).
pub fn cache_config(
    config: &LlamaConfig,
    kind: AttentionKind,
    top_k: usize,
    buffer: usize,
    max_tokens: usize,
    formats: impl Into<StorageFormats>,
    requests: usize,
) -> Result<CacheConfig> {
    let mut cfg = base_config(config, kind, top_k, buffer, max_tokens, formats.into())?;
    let device = rows_bytes(&cfg, max_tokens, requests)?;
    check_memory(
        device.saturating_mul(2),
        requests,
        &format!("{requests} requests of {max_tokens} tokens need {device} B of rows, twice"),
    )?;
    cfg.hisparse.device_kv_bytes = device;
    Ok(cfg)
}

/// [`cache_config`] with a device budget: `device_bytes` for the rows, keys and hot buffers, the
/// host tier sized to hold all `requests` whole (what hisparse keeps there); refused when the
/// device tier and (hisparse) the host tier would not fit the machine's memory. Requests beyond
/// what the budget holds wait for room.
#[allow(clippy::too_many_arguments)] // The shape of a cache: each argument is one of its sizes.
pub fn cache_config_within(
    config: &LlamaConfig,
    kind: AttentionKind,
    top_k: usize,
    buffer: usize,
    max_tokens: usize,
    formats: impl Into<StorageFormats>,
    requests: usize,
    device_bytes: u64,
) -> Result<CacheConfig> {
    let mut cfg = base_config(config, kind, top_k, buffer, max_tokens, formats.into())?;
    let host = rows_bytes(&cfg, max_tokens, requests)?;
    let need = if kind == AttentionKind::HiSparse { device_bytes.saturating_add(host) } else { device_bytes };
    check_memory(need, requests, &format!("a device tier of {device_bytes} B and a host tier of {host} B"))?;
    cfg.hisparse.device_kv_bytes = device_bytes;
    cfg.hisparse.host_tier_bytes = host;
    Ok(cfg)
}

fn base_config(
    config: &LlamaConfig,
    kind: AttentionKind,
    top_k: usize,
    buffer: usize,
    max_tokens: usize,
    formats: StorageFormats,
) -> Result<CacheConfig> {
    if max_tokens > config.context {
        return Err(ModelError::invalid(
            "max_tokens",
            max_tokens,
            format!("the model has {} positions", config.context),
        ));
    }
    let (mode, k) = match kind {
        AttentionKind::Dense => (Mode::Resident, max_tokens.max(1)),
        AttentionKind::SparseResident => (Mode::Resident, top_k),
        AttentionKind::HiSparse => (Mode::HiSparse, top_k),
    };
    let g = config.geometry(k, formats)?;
    let mut cfg = CacheConfig::new(g, mode, 0);
    // No request is longer than the positions asked for; the cache's own rule then sizes it
    // (and keeps no index keys where top-k holds every position).
    cfg.hisparse.max_request_tokens = max_tokens;
    if kind == AttentionKind::HiSparse {
        cfg.hisparse.device_buffer_size = buffer;
    }
    Ok(cfg.sized_for(max_tokens, max_tokens))
}

/// Bytes of `requests` requests' rows and keys (none where dense attention keeps no index) of
/// `max_tokens`, with a quarter to spare.
fn rows_bytes(cfg: &CacheConfig, max_tokens: usize, requests: usize) -> Result<u64> {
    let g = &cfg.geometry;
    let memory = |e: hisparse_engine::MemoryError| ModelError::Engine(e.into());
    let keys = if cfg.keeps_index() { g.index_bytes_per_token().map_err(memory)? } else { 0 };
    let per_token = g.kv_bytes_per_token().map_err(memory)? + keys;
    (per_token as u64)
        .checked_mul(requests as u64)
        .and_then(|b| b.checked_mul(max_tokens as u64 + 64))
        .and_then(|b| b.checked_add(b / 4 + (8 << 20)))
        .ok_or_else(|| ModelError::invalid("requests", requests, "their rows overflow a 64-bit size"))
}

/// Refuses (naming `requests`) when `bytes` pass the machine's available memory.
fn check_memory(bytes: u64, requests: usize, what: &str) -> Result<()> {
    if let Some(have) = hisparse_engine::available_memory()
        && bytes > have
    {
        return Err(ModelError::invalid("requests", requests, format!("{what}; the machine has {have} B")));
    }
    Ok(())
}
