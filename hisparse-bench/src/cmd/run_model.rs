//! A real model as the input of `hisparse run` and `hisparse sweep` (`--model smollm2` or
//! `--gguf FILE`): prompts are windows of a text (`--text`), prefilled once each; requests
//! continue them in turn and decode greedily, served with continuous batching through one cache
//! per mode (`ModelServer`) on the CPU. The engine flags that describe the cache apply
//! (`--device-memory`, `--device-buffer-size`, `--eviction-policy`, `--prefetcher`,
//! `--prefetch-budget`, `--kv-format`); a device budget makes requests beyond it wait.

use std::path::PathBuf;

use hisparse_engine::{CpuBackend, KvCache, KvRowFormat, LatencySummary, Mode, RequestId, RunSummary};
use hisparse_model::{
    AttentionKind, Llama, ModelServer, PrefillOut, SelectionRecorder, ServeOutcome, ServeRequest, cache_config,
    cache_config_within,
};
use hisparse_policy::trace::TraceWriter;

use super::common::{BackendKind, EngineArgs, parse_bytes};
use super::model_args::{CombineArg, ModelArgs, check_selection, read_tokens, window_starts};
use super::model_source::ModelSource;
use super::run_args::{ModeRun, RunArgs, trace_file};
use super::run_output::write_outputs;
use crate::error::{BenchError, Result};
use crate::files::OutputDir;
use crate::{guard, interrupt, progress};

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
        if engine.backend == BackendKind::Cuda {
            return Err(BenchError::flag(
                "backend",
                "cuda",
                "a real model runs on the CPU backend (GQA rows have no CUDA kernels yet)",
            ));
        }
        guard::within("prompts", source.prompts, 1, hisparse_engine::DEFAULT_MAX_QUEUED)?;
        let kv_format = engine.kv_format.unwrap_or(KvRowFormat::Bf16);
        let args = ModelArgs {
            gguf: source.gguf.clone(),
            kv_format,
            index_format: engine.index_format.unwrap_or_default(),
            policy: engine.eviction_policy.unwrap_or(hisparse_engine::BuiltinPolicy::Lru),
            combine: CombineArg::Sum,
            sink: 0,
            window: 0,
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
        cache_config(self.model.config(), AttentionKind::Dense, 0, 0, context, self.args.formats(), self.count)
            .map_err(|e| match e {
                hisparse_model::ModelError::Invalid { field, reason, .. } if field == "requests" => {
                    BenchError::flag("prompts", self.count, reason)
                }
                e => e.into(),
            })?;
        let starts = window_starts(self.tokens.len(), context, self.count)?;
        let probe =
            self.args.cache(self.model.config(), AttentionKind::Dense, 0, ("device-buffer-size", 0), context, 1)?;
        let (kv, key) = probe.layouts();
        drop(probe);
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

    /// A cache of `mode` for `requests` requests of at most `max_tokens`: within
    /// `--device-memory` when given (more requests wait), else holding them all.
    pub fn cache(
        &self,
        engine: &EngineArgs,
        mode: Mode,
        max_tokens: usize,
        requests: usize,
    ) -> Result<KvCache<CpuBackend>> {
        let kind = match mode {
            Mode::Resident => AttentionKind::SparseResident,
            Mode::HiSparse => AttentionKind::HiSparse,
        };
        let buffer = match engine.device_buffer_size {
            Some(b) => b,
            None => hisparse_policy::default_buffer_slots(self.top_k),
        };
        let (c, k, f) = (self.model.config(), self.top_k, self.args.formats());
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
        cfg.hisparse.eviction_policy = self.args.policy.into();
        if let Some(p) = engine.prefetcher {
            cfg.hisparse.prefetcher = p.into();
        }
        if let Some(b) = engine.prefetch_budget {
            cfg.hisparse.prefetch_budget = b;
        }
        self.args.cache_from(cfg, "device-buffer-size")
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

/// `hisparse run` with a model: each mode's requests served to the end; when both modes ran,
/// hisparse must have generated resident's tokens, every one (else the run fails).
pub fn run(a: &RunArgs) -> Result<(Vec<ModeRun>, PathBuf)> {
    if let Some(r) = a.arrival_rate {
        return Err(BenchError::flag("arrival-rate", r, "a model's requests are submitted at once"));
    }
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
    for mode in a.mode.modes() {
        let cache = input.cache(&a.engine, mode, max_tokens, a.concurrency)?;
        let (row_bytes, geometry) = (cache.layouts().0.row_bytes(), cache.config().geometry.clone());
        let mut server = ModelServer::new(&input.model, &input.prompts, cache);
        for i in 0..a.concurrency {
            let output = a.output[i % a.output.len()];
            server.submit(ServeRequest { id: RequestId(i as u64), prompt: i % input.prompts.len(), output })?;
        }
        let recording = mode == Mode::HiSparse && trace_file.is_some();
        if recording {
            server.record(SelectionRecorder::with_scores(a.source.score_margin)?);
        }
        let all: u64 = (0..a.concurrency).map(|i| a.output[i % a.output.len()] as u64).sum();
        let bar = progress::bar(all, &format!("{mode} tokens"));
        let mut summary = RunSummary::default();
        let (mut steps, mut latencies) = (Vec::new(), Vec::new());
        while !server.is_idle() {
            interrupt::check(|| format!("decoding the {mode} run (step {})", steps.len() + 1))?;
            let s = server.step()?;
            bar.inc(s.metrics.tokens as u64);
            summary.add(&s.metrics);
            steps.push(s.metrics);
            latencies.extend(s.latencies);
        }
        bar.finish_and_clear();
        server.cache().check()?;
        if let (true, Some(file), Some(rec)) = (recording, trace_file.as_mut(), server.take_recorder()) {
            let mut w = TraceWriter::new(file.writer(), rec.trace_header(&geometry, row_bytes))?;
            for r in &rec.records {
                w.write(r)?;
            }
            w.finish()?;
        }
        let (mut tokens, mut rejected) = (Vec::new(), Vec::new());
        for (id, o) in server.outcomes() {
            match o {
                ServeOutcome::Finished { tokens: t } => tokens.push((id.0, t.clone())),
                ServeOutcome::Rejected { reason } => rejected.push((id.0, reason.clone())),
            }
        }
        tokens.sort_unstable();
        generated.push(tokens);
        runs.push(ModeRun {
            mode,
            summary,
            steps,
            rejected,
            refused: Vec::new(),
            latency: LatencySummary::of(&latencies),
            gpus: 1,
            exchange_mb_per_step: 0.0,
            timing_only: None,
        });
    }
    // Requests both modes finished (one may have rejected some the other could fit), by id.
    if let [resident, hisparse] = generated.as_slice()
        && let Some((id, _)) = hisparse
            .iter()
            .find(|(id, t)| resident.binary_search_by_key(id, |(r, _)| *r).is_ok_and(|i| resident[i].1 != *t))
    {
        return Err(BenchError::Check(format!(
            "request {id}: hisparse generated other tokens than sparse resident (the attention is not lossless)"
        )));
    }
    write_outputs(&out, &runs)?;
    if let Some(f) = trace_file {
        f.commit()?;
    }
    Ok((runs, out.commit()?))
}
