//! `LlamaDecoder`: the real model as a client of the engine ([`hisparse_engine::Engine`]
//! drives it through [`DecodeModel`]). The engine schedules, admits, times and traces; the
//! decoder makes each layer's inputs from its residual stream, applies what follows the
//! attention, and ends each step with the logits and every request's next token (greedy).
//!
//! A request continues one of the decoder's prefilled prompts, named by
//! [`LlamaDecoder::request`] (several requests may share one: admitting copies its rows, so each
//! holds its own), which spares the prefill — minutes per prompt of 8k tokens on a CPU — when
//! only the decode is measured.

use std::collections::HashMap;

use half::bf16;
use hisparse_engine::engine::{BatchEntry, DecodeModel, LayerTensors};
use hisparse_engine::{
    Admission, Backend, DecodeStep, DeviceMemory, EmulatedDevice, EngineError, KvCache, LayerInputs, Outcome,
    RequestId, RequestSpec,
};

use crate::decode::StepState;
use crate::error::{ModelError, Result};
use crate::forced::argmax;
use crate::model::Llama;
use crate::prefill::PrefillOut;

/// A model error as the engine carries it (the engine's own errors unwrapped; the caller's stop
/// seen by the model is the engine's stop).
fn engine_error(e: ModelError) -> EngineError {
    match e {
        ModelError::Engine(e) => e,
        ModelError::Stopped(_) => EngineError::Stopped,
        e => EngineError::Model(hisparse_engine::error::ModelFailure::new(e)),
    }
}

/// The real model decoding requests that continue its prefilled prompts; see the module
/// documentation.
pub struct LlamaDecoder<'a, M: DeviceMemory = EmulatedDevice> {
    model: &'a Llama,
    prompts: &'a [PrefillOut],
    /// Each submitted request's prompt and tokens (the prompt's next token first).
    requests: HashMap<RequestId, (usize, Vec<u32>)>,
    /// The tokens a teacher-forced request is fed, step by step (`LlamaDecoder::request_forced`).
    forced: HashMap<RequestId, Vec<u32>>,
    /// The tokens of requests that left, in the order they left.
    finished: Vec<(RequestId, Vec<u32>)>,
    step: StepState,
    /// Bumped whenever a buffer the layer inputs point into moved.
    generation: u64,
    keep_logits: bool,
    logits: Vec<(RequestId, Vec<f32>)>,
    /// The layer's inputs as the cache's backend reads them (copied from `step` each layer).
    device: Option<DeviceInputs<M>>,
    /// The attention's output as the model reads it (copied from the backend's each layer).
    out: Vec<f32>,
}

/// A layer's inputs in the backend's memory.
struct DeviceInputs<M: DeviceMemory> {
    index_q: M::Buffer<bf16>,
    weights: M::Buffer<f32>,
    keys: M::Buffer<u8>,
    attn_q: M::Buffer<bf16>,
    rows: M::Buffer<u8>,
}

impl<M: DeviceMemory> DeviceInputs<M> {
    /// Writes `st`'s inputs into `dev`, made (again) where a length changed; returns the
    /// inputs and whether they moved.
    fn write<'d>(dev: &'d mut Option<Self>, mem: &M, st: &StepState) -> hisparse_engine::Result<(&'d Self, bool)> {
        let fits = dev.as_ref().is_some_and(|d| {
            mem.len(&d.index_q) == st.index_q.len()
                && mem.len(&d.weights) == st.weights.len()
                && mem.len(&d.keys) == st.keys.len()
                && mem.len(&d.attn_q) == st.attn_q.len()
                && mem.len(&d.rows) == st.rows.len()
        });
        let d = match dev.take() {
            Some(d) if fits => d,
            _ => Self {
                index_q: mem.alloc_zeroed(st.index_q.len())?,
                weights: mem.alloc_zeroed(st.weights.len())?,
                keys: mem.alloc_zeroed(st.keys.len())?,
                attn_q: mem.alloc_zeroed(st.attn_q.len())?,
                rows: mem.alloc_zeroed(st.rows.len())?,
            },
        };
        let d = dev.insert(d);
        mem.write(&mut d.index_q, 0, &st.index_q)?;
        mem.write(&mut d.weights, 0, &st.weights)?;
        mem.write(&mut d.keys, 0, &st.keys)?;
        mem.write(&mut d.attn_q, 0, &st.attn_q)?;
        mem.write(&mut d.rows, 0, &st.rows)?;
        Ok((d, !fits))
    }

    fn inputs(&self) -> LayerInputs<'_, M> {
        LayerInputs {
            index_queries: Some(&self.index_q),
            index_weights: Some(&self.weights),
            new_index_keys: Some(&self.keys),
            attention_queries: &self.attn_q,
            new_kv_rows: &self.rows,
        }
    }
}

impl<'a, M: DeviceMemory> LlamaDecoder<'a, M> {
    /// A decoder of `model` for requests continuing `prompts` (prefilled with the cache's
    /// layouts).
    pub fn new(model: &'a Llama, prompts: &'a [PrefillOut]) -> Self {
        Self {
            model,
            prompts,
            requests: HashMap::new(),
            forced: HashMap::new(),
            finished: Vec::new(),
            step: StepState::default(),
            generation: 0,
            keep_logits: false,
            logits: Vec::new(),
            device: None,
            out: Vec::new(),
        }
    }

    /// Request `id` continuing prompt `prompt` for `output` decode steps, as the engine takes it
    /// ([`hisparse_engine::Engine::submit`]). Refused (nothing recorded) when the prompt does
    /// not exist, the id is in use, `output` is 0 or the request would pass the model's
    /// positions.
    pub fn request(&mut self, id: RequestId, prompt: usize, output: usize) -> Result<RequestSpec> {
        let spec = self.check_request(id, prompt, output)?;
        let first = argmax(&self.prompts[prompt].logits);
        self.requests.insert(id, (prompt, vec![first]));
        Ok(spec)
    }

    /// Request `id` continuing prompt `prompt` teacher-forced: step `s` feeds `next[s]` (not the
    /// model's own choice), `next.len()` steps; the logits of step `s` predict `next[s + 1]`.
    /// Refused as [`LlamaDecoder::request`] is, and when `next` is empty.
    pub fn request_forced(&mut self, id: RequestId, prompt: usize, next: &[u32]) -> Result<RequestSpec> {
        let &first =
            next.first().ok_or_else(|| ModelError::invalid("next", 0, "a request decodes at least one step"))?;
        let spec = self.check_request(id, prompt, next.len())?;
        self.requests.insert(id, (prompt, vec![first]));
        self.forced.insert(id, next.to_vec());
        Ok(spec)
    }

    /// The spec of request `id` (prompt `prompt`, `output` steps) if it may be made.
    fn check_request(&self, id: RequestId, prompt: usize, output: usize) -> Result<RequestSpec> {
        let p = self.prompts.get(prompt).ok_or_else(|| {
            ModelError::invalid("prompt", prompt, format!("the decoder has {} prompts", self.prompts.len()))
        })?;
        if output == 0 {
            return Err(ModelError::invalid("output", 0, "a request decodes at least one step"));
        }
        if self.requests.contains_key(&id) || self.finished.iter().any(|(x, _)| *x == id) {
            return Err(ModelError::invalid("id", id.0, "already submitted"));
        }
        let last = p.tokens.checked_add(output).ok_or_else(|| ModelError::invalid("output", output, "overflows"))?;
        self.model.check_position(last.saturating_sub(1)).map_err(|_| {
            ModelError::invalid(
                "output",
                output,
                format!(
                    "prompt {} tokens + output pass the model's {} positions",
                    p.tokens,
                    self.model.config().context
                ),
            )
        })?;
        Ok(RequestSpec { id, prompt_tokens: p.tokens, output_tokens: output })
    }

    /// Makes `token` the one request `id` feeds at its next step, in place of the decoder's
    /// greedy choice at the last step's end (a caller sampling from the kept logits). Refused by
    /// name for a request the decoder does not hold.
    pub fn choose(&mut self, id: RequestId, token: u32) -> Result<()> {
        let vocab = self.model.config().vocab;
        if token as usize >= vocab {
            return Err(ModelError::invalid("token", token, format!("the vocabulary has {vocab} tokens")));
        }
        match self.requests.get_mut(&id).and_then(|(_, t)| t.last_mut()) {
            Some(last) => {
                *last = token;
                Ok(())
            }
            None => Err(ModelError::invalid("id", id.0, "not a request of this decoder")),
        }
    }

    /// Keeps every step's logits (a vocabulary of floats per request), taken by
    /// [`LlamaDecoder::take_logits`].
    pub fn keep_logits(&mut self, keep: bool) {
        self.keep_logits = keep;
    }

    /// The logits kept since the last call, in batch order per step.
    pub fn take_logits(&mut self) -> Vec<(RequestId, Vec<f32>)> {
        std::mem::take(&mut self.logits)
    }

    /// The tokens of a request that has not left yet: its prompt's next token (a forced
    /// request's first), then one per decode step so far.
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.requests.get(&id).map(|(_, t)| t.as_slice())
    }

    /// The tokens of every request that left (finished or aborted), in the order they left.
    pub fn finished(&self) -> &[(RequestId, Vec<u32>)] {
        &self.finished
    }
}

impl<B: Backend> DecodeModel<B> for LlamaDecoder<'_, B::Memory>
where
    B::Memory: Clone,
{
    fn admit(
        &mut self,
        cache: &mut KvCache<B>,
        spec: &RequestSpec,
        total: usize,
    ) -> hisparse_engine::Result<Admission> {
        let (prompt, _) = self.requests.get(&spec.id).ok_or_else(|| EngineError::Request {
            id: spec.id.0,
            reason: "not made by LlamaDecoder::request".into(),
        })?;
        let p = &self.prompts[*prompt];
        if p.tokens != spec.prompt_tokens {
            return Err(EngineError::Input {
                field: "prompt_tokens".into(),
                value: spec.prompt_tokens.to_string(),
                reason: format!("request {}'s prompt has {} tokens", spec.id.0, p.tokens),
            });
        }
        self.model.check_cache(cache).map_err(engine_error)?;
        self.model.admit(cache, spec.id, p, total).map_err(engine_error)
    }

    fn finish(&mut self, id: RequestId) {
        self.forced.remove(&id);
        if let Some((_, tokens)) = self.requests.remove(&id) {
            self.finished.push((id, tokens));
        }
    }

    fn prepare(&mut self, _cache: &KvCache<B>, batch: &[BatchEntry]) -> hisparse_engine::Result<bool> {
        self.model.check_stop().map_err(engine_error)?;
        let tokens = batch
            .iter()
            .map(|e| {
                let t = self.requests.get(&e.id).and_then(|(_, t)| t.last().copied());
                t.ok_or(EngineError::Request { id: e.id.0, reason: "not made by LlamaDecoder::request".into() })
            })
            .collect::<hisparse_engine::Result<Vec<u32>>>()?;
        let positions = batch.iter().map(|e| e.position).collect();
        self.step = self.model.begin_step(&tokens, positions).map_err(engine_error)?;
        Ok(false)
    }

    fn project(&mut self, cache: &KvCache<B>, l: usize) -> hisparse_engine::Result<LayerInputs<'_, B::Memory>> {
        self.model.project_layer(&mut self.step, l, cache.layouts()).map_err(engine_error)?;
        let (d, moved) = DeviceInputs::write(&mut self.device, cache.backend().memory(), &self.step)?;
        self.generation += u64::from(moved);
        Ok(d.inputs())
    }

    fn after_attention(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        l: usize,
        out: &<B::Memory as DeviceMemory>::Buffer<f32>,
        _lse: &<B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> hisparse_engine::Result<()> {
        let (model, st, host) = (self.model, &mut self.step, &mut self.out);
        step.time_stages(hisparse_engine::KernelStage::Model, |b, _| {
            let mem = b.memory();
            host.resize(mem.len(out), 0.0);
            mem.read(out, 0, host)?;
            model.after_attention(st, l, host).map_err(engine_error)
        })
    }

    fn end_step(&mut self, _cache: &KvCache<B>, batch: &[BatchEntry]) -> hisparse_engine::Result<()> {
        let logits = self.model.logits(&self.step).map_err(engine_error)?;
        let vocab = self.model.config().vocab;
        for (e, l) in batch.iter().zip(logits.chunks(vocab)) {
            if let Some((_, tokens)) = self.requests.get_mut(&e.id) {
                // A forced request is fed its text's next token (its last step's logits predict
                // past the text: the model's own choice ends its tokens).
                let forced = self.forced.get(&e.id).and_then(|f| f.get(tokens.len()).copied());
                tokens.push(forced.unwrap_or_else(|| argmax(l)));
            }
            if self.keep_logits {
                self.logits.push((e.id, l.to_vec()));
            }
        }
        Ok(())
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn tensors<'t>(
        &'t self,
        _l: usize,
        out: &'t <B::Memory as DeviceMemory>::Buffer<f32>,
        lse: &'t <B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> Option<LayerTensors<'t, B::Memory>> {
        let d = self.device.as_ref()?;
        Some(LayerTensors { index_q: &d.index_q, index_w: &d.weights, attn_q: &d.attn_q, out, lse })
    }
}

/// Where an engine writes its selection trace, and its score margin.
pub type TraceSink = (Box<dyn std::io::Write + Send>, usize);

impl Llama {
    /// Teacher forcing through the engine: the engine over a cache of `cache` (on `backend`,
    /// observing `stop`) serves one request per prompt of `prompts`, request `i` fed
    /// `next[i]` (all of one length) one step at a time; every step's logits are scored against
    /// the true next token. With `trace`, the engine records the run's selections into its
    /// writer (with the oracle's scores at its margin). What [`Llama::teacher_forced`] measures
    /// through the cache's own API, here with the engine's admission, scheduling and traces.
    pub fn teacher_forced_by_engine<B: Backend>(
        &self,
        backend: B,
        cache: hisparse_engine::CacheConfig,
        prompts: &[PrefillOut],
        next: &[&[u32]],
        keep_logits: bool,
        (stop, trace): (hisparse_engine::StopFlag, Option<TraceSink>),
    ) -> Result<crate::forced::ForcedOut>
    where
        B::Memory: Clone,
    {
        use crate::forced::{ForcedOut, nll};
        let steps = next.first().map_or(0, |n| n.len());
        if next.len() != prompts.len() || next.iter().any(|n| n.len() != steps) {
            return Err(ModelError::invalid("next", next.len(), "one continuation per prompt, all of one length"));
        }
        let cfg = hisparse_engine::EngineConfig { stop, ..hisparse_engine::EngineConfig::with_cache(cache) };
        let mut e = hisparse_engine::Engine::with_model(backend, cfg, LlamaDecoder::<B::Memory>::new(self, prompts))?;
        e.model_mut().keep_logits(true);
        let n = prompts.len();
        for (i, nx) in next.iter().enumerate() {
            let spec = e.model_mut().request_forced(RequestId(i as u64), i, nx)?;
            e.submit(spec)?;
        }
        if let Some((w, margin)) = trace {
            e.record_trace(w, margin)?;
        }
        let mut out = ForcedOut { nll: vec![Vec::new(); n], argmax: vec![Vec::new(); n], ..ForcedOut::default() };
        out.logits = vec![Vec::new(); if keep_logits { n } else { 0 }];
        while !e.is_idle() {
            let r = e.step()?;
            if r.metrics.tokens > 0 {
                out.steps += 1;
            }
            out.decode_secs += r.metrics.seconds;
            out.select_secs += r.metrics.stages.indexer + r.metrics.stages.top_k;
            out.counts += r.metrics.swap;
            for (id, logits) in e.model_mut().take_logits() {
                let i = id.0 as usize;
                let s = out.argmax[i].len();
                out.argmax[i].push(argmax(&logits));
                if let Some(&target) = next[i].get(s + 1) {
                    out.nll[i].push(nll(&logits, target));
                }
                if let Some(keep) = out.logits.get_mut(i) {
                    keep.push(logits);
                }
            }
        }
        e.finish_trace()?;
        if let Some((id, o)) = e.outcomes().iter().find(|(_, o)| !matches!(o, Outcome::Finished { .. })) {
            return Err(ModelError::invalid("prompts", n, format!("request {} was not served: {o:?}", id.0)));
        }
        Ok(out)
    }
}
