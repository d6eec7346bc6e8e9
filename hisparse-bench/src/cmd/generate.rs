//! `hisparse generate`: a real model's text, streamed as it is decoded through the KV hierarchy
//! (greedy, or sampled with a temperature and a seed), with each step's hits and misses on
//! request. The model is the engine's client (`LlamaDecoder`), its cache on `--backend`'s
//! backend; each step's logits are sampled into the token the next step feeds.

use std::io::Write;

use clap::Args;
use hisparse_engine::{Backend, Engine, EngineConfig, RequestId};
use hisparse_model::{AttentionKind, Llama, LlamaDecoder, PrefillOut, argmax};
use rand::{Rng, SeedableRng};

use super::model_args::{ModelArgs, ModelBackend, check_selection};
use crate::console;
use crate::error::{BenchError, Result};
use crate::interrupt;

/// How attention reads the past.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionArg {
    /// Every position (no selection).
    Dense,
    /// The oracle's top-k, the whole KV on the device.
    SparseResident,
    /// The oracle's top-k through hot buffers and the host tier.
    Hisparse,
}

impl From<AttentionArg> for AttentionKind {
    fn from(a: AttentionArg) -> Self {
        match a {
            AttentionArg::Dense => Self::Dense,
            AttentionArg::SparseResident => Self::SparseResident,
            AttentionArg::Hisparse => Self::HiSparse,
        }
    }
}

/// `hisparse generate`'s flags.
#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// The user's message (wrapped in the model's chat template unless --raw).
    #[arg(long)]
    pub prompt: String,
    /// Use the prompt as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Tokens to generate at most (stops early at the end-of-sequence token).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Attention.
    #[arg(long, value_enum, default_value_t = AttentionArg::Hisparse)]
    pub attention: AttentionArg,
    /// Positions selected per layer and step.
    #[arg(long, default_value_t = 64)]
    pub top_k: usize,
    /// Regular hot-buffer slots per request and layer (hisparse; default: twice --top-k).
    #[arg(long)]
    pub device_buffer_size: Option<usize>,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print each step's hits and misses (standard error).
    #[arg(long)]
    pub show_misses: bool,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Samples from `logits / temperature` (the largest for a temperature of 0).
fn sample(logits: &[f32], temperature: f32, rng: &mut rand::rngs::StdRng) -> u32 {
    if temperature <= 0.0 {
        return argmax(logits);
    }
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let w: Vec<f64> = logits.iter().map(|&l| f64::from((l - m) / temperature).exp()).collect();
    let mut r = rng.random::<f64>() * w.iter().sum::<f64>();
    for (i, x) in w.iter().enumerate() {
        r -= x;
        if r <= 0.0 {
            return i as u32;
        }
    }
    argmax(logits)
}

/// Generates; the text goes to standard output as it is decoded. Returns the tokens generated.
pub fn run(args: &GenerateArgs) -> Result<usize> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(BenchError::flag("temperature", args.temperature, "must be finite and at least 0"));
    }
    let kind = AttentionKind::from(args.attention);
    let buffer = selection_flags(args, kind)?;
    args.model.one_index_format("generate")?;
    let m = args.model.load()?;
    let text = if args.raw { args.prompt.clone() } else { m.tokenizer.chat_prompt(&args.prompt)? };
    let ids = m.tokenizer.encode(&text)?;
    let positions = m.config().context;
    if ids.is_empty() {
        return Err(BenchError::flag("prompt", "\"\"", "has no tokens"));
    }
    if ids.len() >= positions {
        return Err(BenchError::flag(
            "prompt",
            format!("({} tokens)", ids.len()),
            format!("leaves no room to generate in the model's {positions} positions"),
        ));
    }
    if kind != AttentionKind::Dense {
        check_selection(m.config(), ("top-k", args.top_k), buffer.map(|b| ("device-buffer-size", b)))?;
    }
    // Generation stops at the model's last position (--max-tokens may ask for more).
    let max = ids.len().saturating_add(args.max_tokens).min(positions);
    let buffer = ("device-buffer-size", buffer.unwrap_or(0));
    let cfg = args.model.cache_config(m.config(), kind, args.top_k, buffer, max, 1)?;
    // The rows' and keys' layouts the cache will have (its geometry's), without making one.
    let layouts = cfg.geometry.kv_row().and_then(|kv| Ok((kv, cfg.geometry.index_key()?)));
    let (kv, key) =
        layouts.map_err(|e| super::model_args::named(hisparse_model::ModelError::Engine(e.into()), buffer.0))?;
    let prompts = [m.prefill(&ids, kv, key)?];
    let steps = max - ids.len();
    if args.max_tokens == 0 || steps == 0 {
        console::out("\n")?;
        return Ok(0);
    }
    let input = Generation { m: &m, prompts: &prompts, args, steps, cache: cfg };
    match args.model.backend {
        ModelBackend::Cpu => input.on(hisparse_engine::CpuBackend::new()),
        #[cfg(feature = "cuda")]
        ModelBackend::Cuda => input.on(super::model_args::cuda_backend()?),
        #[cfg(not(feature = "cuda"))]
        ModelBackend::Cuda => {
            Err(BenchError::flag("backend", "cuda", "this build has no CUDA support (feature `cuda`)"))
        }
    }
}

/// One prompt generated from, through the engine (the model its client).
struct Generation<'a> {
    m: &'a Llama,
    prompts: &'a [PrefillOut],
    args: &'a GenerateArgs,
    /// Decode steps the request may take (to the model's last position or `--max-tokens`).
    steps: usize,
    cache: hisparse_engine::CacheConfig,
}

impl Generation<'_> {
    /// Generates on `backend`: each step's logits sampled into the token the next step feeds.
    fn on<B: Backend>(&self, backend: B) -> Result<usize>
    where
        B::Memory: Clone,
    {
        let (m, args) = (self.m, self.args);
        let cfg = EngineConfig { stop: interrupt::engine_stop(), ..EngineConfig::with_cache(self.cache.clone()) };
        let mut e = Engine::with_model(backend, cfg, LlamaDecoder::<B::Memory>::new(m, self.prompts))
            .map_err(|e| super::model_args::named(e.into(), "device-buffer-size"))?;
        e.model_mut().keep_logits(true);
        let id = RequestId(0);
        let spec = e.model_mut().request(id, 0, self.steps)?;
        e.submit(spec)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        let mut token = sample(&self.prompts[0].logits, args.temperature, &mut rng);
        let (mut out, mut shown, mut n) = (Vec::new(), 0usize, 0usize);
        let stdout = std::io::stdout();
        while n < args.max_tokens && token != m.tokenizer.eos() && n < self.steps {
            interrupt::check(|| "generating".into())?;
            e.model_mut().choose(id, token)?;
            out.push(token);
            n += 1;
            // Print what is complete so far (a multi-byte character may span tokens).
            let text = m.tokenizer.decode(&out)?;
            if text.len() > shown && !text.ends_with('\u{fffd}') {
                let mut lock = stdout.lock();
                lock.write_all(&text.as_bytes()[shown..]).and_then(|()| lock.flush()).map_err(BenchError::Stdout)?;
                shown = text.len();
            }
            let r = e.step()?;
            if r.metrics.running == 0 {
                return Err(BenchError::flag("max-tokens", args.max_tokens, "the request does not fit the cache"));
            }
            if args.show_misses {
                let c = r.metrics.swap;
                console::note(&format!("[step {n}: {} hits, {} misses]", c.hits, c.misses));
            }
            let logits = e.model_mut().take_logits();
            token = logits.last().map_or(token, |(_, l)| sample(l, args.temperature, &mut rng));
        }
        console::out("\n")?;
        if !e.is_idle() {
            e.abort(id)?;
        }
        Ok(n)
    }
}

/// The hot buffer `args` ask for (hisparse: `--device-buffer-size`, by default twice `--top-k`); a
/// selection flag the attention does not read is refused by name.
fn selection_flags(args: &GenerateArgs, kind: AttentionKind) -> Result<Option<usize>> {
    let unread = |flag| Err(BenchError::Unread { flag, when: format!("with --attention {}", kind_name(kind)) });
    match kind {
        AttentionKind::Dense if crate::deferred::given("top_k") => unread("top-k"),
        AttentionKind::Dense | AttentionKind::SparseResident if args.device_buffer_size.is_some() => {
            unread("device-buffer-size")
        }
        AttentionKind::Dense | AttentionKind::SparseResident => Ok(None),
        AttentionKind::HiSparse => match args.device_buffer_size {
            Some(b) => Ok(Some(b)),
            None => Ok(Some(hisparse_policy::default_device_buffer_size(args.top_k))),
        },
    }
}

fn kind_name(kind: AttentionKind) -> &'static str {
    match kind {
        AttentionKind::Dense => "dense",
        AttentionKind::SparseResident => "sparse-resident",
        AttentionKind::HiSparse => "hisparse",
    }
}
