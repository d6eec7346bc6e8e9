//! A real model as the input of `hisparse run` and `hisparse sweep` (`--model smollm2` or
//! `--gguf FILE`): prompts are windows of a text (`--text`), prefilled once each; requests
//! continue them in turn (request i prompt i modulo `--prompts`) and decode greedily. The model
//! is the engine's client (`LlamaDecoder`), its projections on the host and its cache on the CPU
//! backend or, with `--backend cuda`, on the GPU (the projections too where the build has feature
//! `model-cuda`): scheduling, admission, arrivals
//! (`--arrival-rate`), the waiting queue (`--max-queued`), latencies, traces and metrics are the
//! engine's, as with the emulated workload. The engine flags that describe the cache apply
//! (`--device-memory`, `--device-buffer-size`, `--eviction-policy`, `--prefetcher`,
//! `--prefetch-budget`, `--kv-format`, `--index-format`); a device budget makes requests beyond
//! it wait.

use std::path::PathBuf;

use hisparse_engine::{
    CacheConfig, CpuBackend, Engine, EngineConfig, KvCache, KvRowFormat, Mode, RequestId, RequestSpec,
};
use hisparse_model::{AttentionKind, Llama, LlamaDecoder, PrefillOut, cache_config, cache_config_within};

use super::common::{BackendKind, EngineArgs, parse_bytes};
use super::model_args::{CombineArg, ModelArgs, check_selection, read_tokens, window_starts};
use super::model_source::ModelSource;
use super::run_args::{ModeRun, RunArgs, trace_file};
use super::run_output::write_outputs;
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, interrupt, progress};

/// The engine of a real model's run: its decoder over the prompts, on the CPU backend or, with
/// `--backend cuda`, the cache on the CUDA backend (the projections on the GPU too where the
/// build has feature `model-cuda`).
pub enum ModelEngine<'a> {
    /// On the CPU backend.
    Cpu(Box<Engine<CpuBackend, LlamaDecoder<'a>>>),
    /// The cache on the CUDA backend.
    #[cfg(feature = "cuda")]
    Cuda(Box<Engine<hisparse_kernels::cuda::CudaBackend, LlamaDecoder<'a, hisparse_memory::cuda::CudaMemory>>>),
}

impl ModelEngine<'_> {
    /// The engine, as the runs drive it.
    pub fn engine(&mut self) -> &mut dyn hisparse_engine::DecodeEngine {
        match self {
            Self::Cpu(e) => e.as_mut(),
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => e.as_mut(),
        }
    }

    /// The tokens of every request that left, in the order they left.
    pub fn finished(&self) -> &[(RequestId, Vec<u32>)] {
        match self {
            Self::Cpu(e) => e.model().finished(),
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => e.model().finished(),
        }
    }

    fn request(&mut self, id: RequestId, prompt: usize, output: usize) -> hisparse_model::Result<RequestSpec> {
        match self {
            Self::Cpu(e) => e.model_mut().request(id, prompt, output),
            #[cfg(feature = "cuda")]
            Self::Cuda(e) => e.model_mut().request(id, prompt, output),
        }
    }
}

/// A loaded model, its prompts and how its caches are made.
pub struct ModelInput {
    /// The model.
    pub model: Llama,
    /// The prefilled prompts.
    pub prompts: Vec<PrefillOut>,
    tokens: Vec<u32>,
    args: ModelArgs,
    top_k: usize,
    count: usize,
}

impl ModelInput {
    /// Loads the model (checking the flags a model run reads); no prompts yet.
    pub fn load(source: &ModelSource, engine: &EngineArgs) -> Result<Self> {
        if source.text.is_empty() {
            return Err(BenchError::flag("text", "", "a model's prompts are windows of a text: give --text FILE"));
        }
        if engine.backend == BackendKind::Cuda && !cfg!(feature = "cuda") {
            return Err(BenchError::flag("backend", "cuda", "this build has no CUDA support (feature `cuda`)"));
        }
        guard::within("prompts", source.prompts, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
        let kv_format = engine.kv_format.unwrap_or(KvRowFormat::Bf16);
        let args = ModelArgs {
            gguf: source.gguf.clone(),
            kv_format,
            index_format: engine.index_format.into_iter().collect(),
            policy: engine.eviction_policy.unwrap_or(hisparse_engine::BuiltinPolicy::Lru),
            combine: CombineArg::Sum,
            sink: 0,
            window: 0,
            backend: match engine.backend {
                BackendKind::Cuda => super::model_args::ModelBackend::Cuda,
                _ => super::model_args::ModelBackend::Cpu,
            },
        };
        let model = args.load()?;
        let buffer = engine.device_buffer_size.map(|b| ("device-buffer-size", b));
        let top_k = engine.top_k.unwrap_or(super::model_source::MODEL_TOP_K);
        check_selection(model.config(), ("top-k", top_k), buffer)?;
        let tokens = read_tokens(&source.text, &model)?;
        Ok(Self { model, prompts: Vec::new(), tokens, args, top_k, count: source.prompts })
    }

    /// Prefills the prompts: windows of `context` tokens spread over the text (`flag` names
    /// the context in errors), replacing the earlier ones.
    pub fn prefill(&mut self, context: usize, flag: &'static str) -> Result<()> {
        let positions = self.model.config().context;
        if context == 0 || context >= positions {
            return Err(BenchError::flag(
                flag,
                context,
                format!("a prompt must leave room for output in the model's {positions} positions"),
            ));
        }
        // The prompts' rows are held whole: refused before any is made if the machine lacks them.
        cache_config(
            self.model.config(),
            AttentionKind::Dense,
            0,
            0,
            context,
            self.args.formats(self.model.config()),
            self.count,
        )
        .map_err(|e| match e {
            hisparse_model::ModelError::Invalid { field, reason, .. } if field == "requests" => {
                BenchError::flag("prompts", self.count, reason)
            }
            e => super::model_args::named(e, "device-buffer-size"),
        })?;
        let starts = window_starts(self.tokens.len(), context, self.count)?;
        let probe = self.args.cache_config(
            self.model.config(),
            AttentionKind::Dense,
            0,
            ("device-buffer-size", 0),
            context,
            1,
        )?;
        let (kv, key) = ModelArgs::layouts(&probe, "device-buffer-size")?;
        self.prompts.clear();
        let bar = progress::bar(self.count as u64, &format!("prefilling prompts of {context} tokens"));
        for s in starts {
            interrupt::check(|| "prefilling the prompts".into())?;
            self.prompts.push(self.model.prefill(&self.tokens[s..s + context], kv, key)?);
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// Positions each layer selects.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The model's name in reports: its file's name without the extension.
    pub fn name(&self) -> String {
        let file = self.args.gguf.clone().unwrap_or_else(|| PathBuf::from(hisparse_model::fetch::SMOLLM2_FILE));
        file.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    }

    /// The config of a cache of `mode` for `requests` requests of at most `max_tokens`: within
    /// `--device-memory` when given (more requests wait), else holding them all.
    pub fn cache_config(
        &self,
        engine: &EngineArgs,
        mode: Mode,
        max_tokens: usize,
        requests: usize,
    ) -> Result<CacheConfig> {
        let kind = match mode {
            Mode::Resident => AttentionKind::SparseResident,
            Mode::HiSparse => AttentionKind::HiSparse,
            Mode::Hybrid => {
                return Err(BenchError::flag(
                    "mode",
                    "hybrid",
                    "hybrid placement runs the emulated model only, for now",
                ));
            }
        };
        let buffer = match engine.device_buffer_size {
            Some(b) => b,
            None => hisparse_policy::default_device_buffer_size(self.top_k),
        };
        let (c, k, f) = (self.model.config(), self.top_k, self.args.formats(self.model.config()));
        let mut cfg = match &engine.device_memory {
            Some(s) => {
                cache_config_within(c, kind, k, buffer, max_tokens, f, requests, parse_bytes("device-memory", s)?)
            }
            None => cache_config(c, kind, k, buffer, max_tokens, f, requests),
        }
        .map_err(|e| match e {
            hisparse_model::ModelError::Invalid { field, reason, .. } if field == "requests" => {
                BenchError::flag("concurrency", requests, reason)
            }
            e => super::model_args::named(e, "device-buffer-size"),
        })?;
        cfg.hisparse.eviction = self.args.policy.into();
        cfg.hisparse.prefetch =
            cfg.hisparse.prefetch.overridden(engine.prefetcher.map(Into::into), engine.prefetch_budget).map_err(
                |e| {
                    let e = hisparse_model::ModelError::Engine(hisparse_engine::EngineError::Policy(e));
                    super::model_args::named(e, "device-buffer-size")
                },
            )?;
        self.args.with_oracle(cfg)
    }

    /// [`ModelInput::cache_config`]'s cache.
    pub fn cache(
        &self,
        engine: &EngineArgs,
        mode: Mode,
        max_tokens: usize,
        requests: usize,
    ) -> Result<KvCache<CpuBackend>> {
        let cfg = self.cache_config(engine, mode, max_tokens, requests)?;
        KvCache::with_named_policies(CpuBackend::new(), cfg)
            .map_err(|e| super::model_args::named(e.into(), "device-buffer-size"))
    }

    /// An engine of `mode` decoding this model over [`ModelInput::cache_config`]'s cache, with
    /// `requests` requests made (request i continues prompt i modulo the prompts, decoding
    /// `output(i)` steps): the engine and their specs, in id order, to submit.
    pub fn engine(
        &self,
        engine: &EngineArgs,
        mode: Mode,
        (max_tokens, requests): (usize, usize),
        output: impl Fn(usize) -> usize,
    ) -> Result<(ModelEngine<'_>, Vec<RequestSpec>)> {
        let cache = self.cache_config(engine, mode, max_tokens, requests)?;
        let cfg = EngineConfig {
            max_queued: guard::at_least_one("max-queued", engine.max_queued)?,
            stop: interrupt::engine_stop(),
            ..EngineConfig::with_cache(cache)
        };
        let named = |e: hisparse_engine::EngineError| super::model_args::named(e.into(), "device-buffer-size");
        let mut e = match engine.backend {
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                let backend = engine.cuda_backend(&cfg.cache.hisparse)?;
                let decoder = LlamaDecoder::new(&self.model, &self.prompts);
                ModelEngine::Cuda(Box::new(Engine::with_model(backend, cfg, decoder).map_err(named)?))
            }
            _ => {
                let decoder = LlamaDecoder::new(&self.model, &self.prompts);
                ModelEngine::Cpu(Box::new(Engine::with_model(CpuBackend::new(), cfg, decoder).map_err(named)?))
            }
        };
        let specs = (0..requests)
            .map(|i| e.request(RequestId(i as u64), i % self.prompts.len(), output(i)))
            .collect::<hisparse_model::Result<Vec<_>>>()?;
        Ok((e, specs))
    }

    /// Refuses, before any decoding, a `--device-memory` that holds no request of `max_tokens`
    /// in any of `modes` (a run that could admit nothing); a mode that holds none beside one
    /// that does runs, rejecting its requests (what the comparison shows).
    pub fn refuse_a_budget_holding_nothing(
        &self,
        engine: &EngineArgs,
        modes: &[Mode],
        max_tokens: usize,
        requests: usize,
    ) -> Result<()> {
        let Some(budget) = &engine.device_memory else { return Ok(()) };
        let mut reasons = Vec::new();
        for &mode in modes {
            match self.cache(engine, mode, max_tokens, requests)?.decide(max_tokens) {
                hisparse_engine::Admission::Rejected { reason } => reasons.push(format!("{mode}: {reason}")),
                _ => return Ok(()),
            }
        }
        Err(BenchError::flag(
            "device-memory",
            budget,
            format!("holds no request of {max_tokens} tokens ({})", reasons.join("; ")),
        ))
    }
}

/// `hisparse run` with a model: each mode's requests decoded to the end by the engine (at once,
/// or arriving by `--arrival-rate`); when both modes ran, hisparse must have generated resident's
/// tokens, every one (else the run fails).
pub fn run(a: &RunArgs) -> Result<(Vec<ModeRun>, PathBuf)> {
    if let Some(n) = a.gpus {
        return Err(BenchError::flag("gpus", n, "a model is served by one CPU engine"));
    }
    let &[context] = a.context.as_slice() else {
        return Err(BenchError::flag("context", a.context.len(), "a model's prompts have one length: give one"));
    };
    guard::within("concurrency", a.concurrency, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
    for &o in &a.output {
        guard::at_least_one("output", o)?;
    }
    super::run_engine::check_arrival_rate(a)?;
    let out = OutputDir::prepare("out", a.out.as_deref().unwrap_or(std::path::Path::new("results/run")))?;
    let mut trace_file = trace_file(a)?;
    let mut input = ModelInput::load(&a.source, &a.engine)?;
    input.prefill(context, "context")?;
    let longest = a.output.iter().copied().max().unwrap_or(1);
    let max_tokens = guard::sum(("context", context), ("output", longest))?;
    if max_tokens > input.model.config().context {
        return Err(BenchError::flag(
            "output",
            longest,
            format!("context {context} + output pass the model's {} positions", input.model.config().context),
        ));
    }
    input.refuse_a_budget_holding_nothing(&a.engine, &a.mode.modes(), max_tokens, a.concurrency)?;
    let mut runs = Vec::new();
    let mut generated: Vec<Vec<(u64, Vec<u32>)>> = Vec::new();
    let modes = a.mode.modes();
    for (rate, mode) in a.loads().into_iter().flat_map(|r| modes.iter().map(move |&m| (r, m))) {
        let output = |i: usize| a.output[i % a.output.len()];
        let (mut e, specs) = input.engine(&a.engine, mode, (max_tokens, a.concurrency), output)?;
        let times = rate.map(|r| super::arrivals::poisson_times(specs.len(), r, a.engine.seed));
        let mut run = super::run_engine::run_mode(a, mode, e.engine(), &specs, times.as_deref(), trace_file.as_mut())?;
        run.arrival_rate = rate;
        let mut tokens: Vec<(u64, Vec<u32>)> = e.finished().iter().map(|(id, t)| (id.0, t.clone())).collect();
        tokens.sort_unstable();
        generated.push(tokens);
        runs.push(run);
    }
    // At each load, requests both modes finished (one may have rejected some the other could
    // fit), by id.
    for pair in generated.chunks(modes.len()) {
        if let [resident, hisparse] = pair
            && let Some((id, _)) = hisparse
                .iter()
                .find(|(id, t)| resident.binary_search_by_key(id, |(r, _)| *r).is_ok_and(|i| resident[i].1 != *t))
        {
            return Err(BenchError::Check(format!(
                "request {id}: hisparse generated other tokens than sparse resident (the attention is not lossless)"
            )));
        }
    }
    write_outputs(&out, &runs)?;
    if let Some(f) = trace_file {
        f.commit()?;
    }
    Ok((runs, out.commit()?))
}
