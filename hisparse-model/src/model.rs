//! `Llama`: a loaded model (weights, RoPE tables, tokenizer), and `cache_config`, the cache a
//! model decodes through in each attention kind (dense, sparse resident, hisparse).

use std::path::Path;

use hisparse_engine::{CacheConfig, KvRowFormat, Mode};

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
}

impl Llama {
    /// Loads the weights and the tokenizer of the llama GGUF file at `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let tokenizer = {
            let (content, _) = open(path)?;
            TextTokenizer::from_gguf(&content)?
        };
        let weights = LlamaWeights::load(path)?;
        let c = &weights.config;
        if tokenizer.vocab() != c.vocab {
            return Err(ModelError::invalid(
                "tokenizer.ggml.tokens",
                tokenizer.vocab(),
                format!("the embedding has {} rows", c.vocab),
            ));
        }
        let rope = Rope::new(c.head_dim, c.rope_base, c.context);
        Ok(Self { weights, tokenizer, rope })
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

/// A cache config for `config`'s model in `kind`: requests of at most `max_tokens`, `top_k`
/// selected per layer (ignored for dense), hot buffers of `buffer` slots (hisparse), rows in
/// `kv_format`, `device_bytes` of (emulated) device memory.
pub fn cache_config(
    config: &LlamaConfig,
    kind: AttentionKind,
    top_k: usize,
    buffer: usize,
    max_tokens: usize,
    kv_format: KvRowFormat,
    device_bytes: u64,
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
    let g = config.geometry(k, kv_format)?;
    let mut cfg = CacheConfig::new(g, mode, device_bytes);
    cfg.hisparse.max_request_tokens = max_tokens;
    if kind == AttentionKind::HiSparse {
        cfg.hisparse.device_buffer_size = buffer;
    }
    Ok(cfg)
}
