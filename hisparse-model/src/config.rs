//! `LlamaConfig`: a llama-architecture model's shape, read from a GGUF file's metadata and
//! checked before any tensor is read; the cache geometry it needs.

use candle_core::quantized::gguf_file::{Content, Value};
use hisparse_engine::{IndexKeyFormat, IndexKeyLayout, KvGeometry, KvRowLayout, StorageFormats};

use crate::error::{ModelError, Result};

/// The shape of a llama-architecture model (SmolLM2, Llama 2/3, Mistral without sliding window).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The `general.name` (or `llama`).
    pub name: String,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Dims per head (`hidden / heads`).
    pub head_dim: usize,
    /// Hidden size of the gated MLP.
    pub ffn: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Positions the model was trained for.
    pub context: usize,
}

/// Upper bounds on what a GGUF file may declare, so that no size from a file overflows or
/// asks for absurd memory before the tensors are checked against the file itself.
const MAX_DIM: usize = 1 << 16;
const MAX_LAYERS: usize = 1024;
const MAX_VOCAB: usize = 1 << 21;
const MAX_CONTEXT: usize = 1 << 22;

fn get<'a>(c: &'a Content, key: &str) -> Result<&'a Value> {
    c.metadata.get(key).ok_or_else(|| ModelError::invalid(key, "missing", "a llama GGUF file holds it"))
}

fn usize_of(c: &Content, key: &str, max: usize) -> Result<usize> {
    let v = get(c, key)?;
    let n = v.to_u64().or_else(|_| v.to_u32().map(u64::from))?;
    match usize::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ModelError::invalid(key, n, format!("must be between 1 and {max}"))),
    }
}

impl LlamaConfig {
    /// Reads and checks the metadata of a GGUF file of architecture `llama`.
    pub fn from_gguf(c: &Content) -> Result<Self> {
        let arch = get(c, "general.architecture")?.to_string()?.clone();
        if arch != "llama" {
            return Err(ModelError::invalid(
                "general.architecture",
                arch,
                "only llama-architecture models are supported",
            ));
        }
        let name = c.metadata.get("general.name").and_then(|v| v.to_string().ok()).cloned().unwrap_or(arch);
        let layers = usize_of(c, "llama.block_count", MAX_LAYERS)?;
        let hidden = usize_of(c, "llama.embedding_length", MAX_DIM)?;
        let heads = usize_of(c, "llama.attention.head_count", MAX_DIM)?;
        let kv_heads = usize_of(c, "llama.attention.head_count_kv", MAX_DIM)?;
        let ffn = usize_of(c, "llama.feed_forward_length", 4 * MAX_DIM)?;
        let context = usize_of(c, "llama.context_length", MAX_CONTEXT)?;
        let rope_base = c.metadata.get("llama.rope.freq_base").map(|v| v.to_f32()).transpose()?.unwrap_or(10_000.0);
        let rms_eps = get(c, "llama.attention.layer_norm_rms_epsilon")?.to_f32()?;
        let vocab = match c.metadata.get("llama.vocab_size") {
            Some(_) => usize_of(c, "llama.vocab_size", MAX_VOCAB)?,
            None => get(c, "tokenizer.ggml.tokens")?.to_vec()?.len(),
        };
        if !hidden.is_multiple_of(heads) {
            return Err(ModelError::invalid(
                "llama.attention.head_count",
                heads,
                format!("must divide hidden {hidden}"),
            ));
        }
        if !heads.is_multiple_of(kv_heads) {
            return Err(ModelError::invalid(
                "llama.attention.head_count_kv",
                kv_heads,
                format!("must divide {heads} heads"),
            ));
        }
        let head_dim = hidden / heads;
        if !head_dim.is_multiple_of(2) {
            return Err(ModelError::invalid("llama.embedding_length", hidden, "heads need an even dim for RoPE"));
        }
        if let Some(v) = c.metadata.get("llama.rope.dimension_count") {
            let d = v.to_u32()?;
            if usize::try_from(d).ok() != Some(head_dim) {
                return Err(ModelError::invalid(
                    "llama.rope.dimension_count",
                    d,
                    format!("partial RoPE is not supported (head dim {head_dim})"),
                ));
            }
        }
        for (key, x) in [("llama.rope.freq_base", rope_base), ("llama.attention.layer_norm_rms_epsilon", rms_eps)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(ModelError::invalid(key, x, "must be finite and positive"));
            }
        }
        Ok(Self { name, layers, hidden, heads, kv_heads, head_dim, ffn, rope_base, rms_eps, vocab, context })
    }

    /// The index format this model's caches keep by default, by the rule BENCHMARKS.md states
    /// (issue 51: the smallest index within 1% of fp8 keys' perplexity at top-k 256 of 8k on
    /// legal text, code and prose): 16 of every 64 key values with their places
    /// (`channels:16:64`, 100 B a token and layer for SmolLM2 against fp8's 196) where the
    /// model's keys (every KV head's, one after another) hold whole groups of 64; fp8 keys
    /// otherwise.
    pub fn default_index_format(&self) -> IndexKeyFormat {
        let channels = IndexKeyFormat::Channels { keep: 16, group: 64 };
        match IndexKeyLayout::with_format(self.kv_heads * self.head_dim, channels) {
            Ok(_) => channels,
            Err(_) => IndexKeyFormat::Fp8,
        }
    }

    /// The cache geometry of this model: its GQA rows and index keys in `formats` (a
    /// [`KvRowFormat`](hisparse_engine::KvRowFormat) alone: fp8 index keys), `top_k` selected per layer by the oracle.
    pub fn geometry(&self, top_k: usize, formats: impl Into<StorageFormats>) -> Result<KvGeometry> {
        let StorageFormats { kv: kv_format, index } = formats.into();
        let name = if self.name.to_lowercase().contains("smollm2") { "smollm2-135m" } else { "llama-gguf" };
        // A row holds a token's keys and values of every KV head: a format that cannot store
        // them (fp8 keeps blocks of 128 values) is refused by its own name, in the model's terms.
        if let Err(e) = KvRowLayout::gqa(kv_format, self.kv_heads, self.head_dim) {
            let (kv, hd) = (self.kv_heads, self.head_dim);
            let reason = match e {
                hisparse_engine::MemoryError::InvalidField { reason, .. } => reason,
                e => e.to_string(),
            };
            return Err(ModelError::invalid(
                "kv_format",
                kv_format,
                format!("a token's row holds 2 x {kv} KV heads x {hd} values, and {reason}: use bf16"),
            ));
        }
        KvGeometry::gqa(name, self.layers, self.heads, self.kv_heads, self.head_dim, top_k, kv_format)
            .and_then(|g| g.with_index_format(index))
            .map_err(|e| ModelError::Engine(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kv_heads: usize, head_dim: usize) -> LlamaConfig {
        LlamaConfig {
            name: "test".into(),
            layers: 2,
            hidden: 4 * kv_heads * head_dim,
            heads: 4 * kv_heads,
            kv_heads,
            head_dim,
            ffn: 64,
            rope_base: 1e4,
            rms_eps: 1e-5,
            vocab: 100,
            context: 256,
        }
    }

    #[test]
    fn the_default_index_is_top_channels_where_keys_hold_whole_groups_of_64() {
        let channels = IndexKeyFormat::Channels { keep: 16, group: 64 };
        // SmolLM2 (3 KV heads of 64), Llama-3.1-8B (8 of 128); then keys of 32 and 96 values.
        assert_eq!(shape(3, 64).default_index_format(), channels);
        assert_eq!(shape(8, 128).default_index_format(), channels);
        assert_eq!(shape(2, 16).default_index_format(), IndexKeyFormat::Fp8);
        assert_eq!(shape(3, 32).default_index_format(), IndexKeyFormat::Fp8);
        // The default makes a geometry.
        assert!(
            shape(3, 64)
                .geometry(16, StorageFormats { kv: hisparse_engine::KvRowFormat::Bf16, index: channels })
                .is_ok()
        );
    }
}
