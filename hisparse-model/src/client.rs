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

use hisparse_engine::engine::{BatchEntry, DecodeModel, LayerTensors};
use hisparse_engine::{
    Admission, Backend, DecodeStep, EmulatedDevice, EngineError, KvCache, LayerInputs, RequestId, RequestSpec,
};

use crate::decode::StepState;
use crate::error::{ModelError, Result};
use crate::forced::argmax;
use crate::model::Llama;
use crate::prefill::PrefillOut;

/// A model error as the engine carries it (the engine's own errors unwrapped).
fn engine_error(e: ModelError) -> EngineError {
    match e {
        ModelError::Engine(e) => e,
        e => EngineError::Model(hisparse_engine::error::ModelFailure::new(e)),
    }
}

/// The real model decoding requests that continue its prefilled prompts; see the module
/// documentation.
pub struct LlamaDecoder<'a> {
    model: &'a Llama,
    prompts: &'a [PrefillOut],
    /// Each submitted request's prompt and tokens (the prompt's next token first).
    requests: HashMap<RequestId, (usize, Vec<u32>)>,
    /// The tokens of requests that left, in the order they left.
    finished: Vec<(RequestId, Vec<u32>)>,
    step: StepState,
    /// Bumped whenever a buffer the layer inputs point into moved.
    generation: u64,
    keep_logits: bool,
    logits: Vec<(RequestId, Vec<f32>)>,
}

impl<'a> LlamaDecoder<'a> {
    /// A decoder of `model` for requests continuing `prompts` (prefilled with the cache's
    /// layouts).
    pub fn new(model: &'a Llama, prompts: &'a [PrefillOut]) -> Self {
        Self {
            model,
            prompts,
            requests: HashMap::new(),
            finished: Vec::new(),
            step: StepState::default(),
            generation: 0,
            keep_logits: false,
            logits: Vec::new(),
        }
    }

    /// Request `id` continuing prompt `prompt` for `output` decode steps, as the engine takes it
    /// ([`hisparse_engine::Engine::submit`]). Refused (nothing recorded) when the prompt does
    /// not exist, the id is in use, `output` is 0 or the request would pass the model's
    /// positions.
    pub fn request(&mut self, id: RequestId, prompt: usize, output: usize) -> Result<RequestSpec> {
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
        self.requests.insert(id, (prompt, vec![argmax(&p.logits)]));
        Ok(RequestSpec { id, prompt_tokens: p.tokens, output_tokens: output })
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

    /// The tokens of a request that has not left yet: its prompt's next token, then one per
    /// decode step so far.
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.requests.get(&id).map(|(_, t)| t.as_slice())
    }

    /// The tokens of every request that left (finished or aborted), in the order they left.
    pub fn finished(&self) -> &[(RequestId, Vec<u32>)] {
        &self.finished
    }
}

impl<B: Backend<Memory = EmulatedDevice>> DecodeModel<B> for LlamaDecoder<'_> {
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

    fn project(&mut self, cache: &KvCache<B>, l: usize) -> hisparse_engine::Result<LayerInputs<'_, EmulatedDevice>> {
        let st = &mut self.step;
        let before = [
            st.index_q.as_ptr() as usize,
            st.keys.as_ptr() as usize,
            st.rows.as_ptr() as usize,
            st.attn_q.as_ptr() as usize,
        ];
        self.model.project_layer(st, l, cache.layouts()).map_err(engine_error)?;
        let after = [
            st.index_q.as_ptr() as usize,
            st.keys.as_ptr() as usize,
            st.rows.as_ptr() as usize,
            st.attn_q.as_ptr() as usize,
        ];
        self.generation += u64::from(before != after);
        Ok(st.inputs())
    }

    fn after_attention(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        l: usize,
        out: &Vec<f32>,
        _lse: &Vec<f32>,
    ) -> hisparse_engine::Result<()> {
        let (model, st) = (self.model, &mut self.step);
        step.time_stages(hisparse_engine::KernelStage::Model, |_, _| {
            model.after_attention(st, l, out).map_err(engine_error)
        })
    }

    fn end_step(&mut self, _cache: &KvCache<B>, batch: &[BatchEntry]) -> hisparse_engine::Result<()> {
        let logits = self.model.logits(&self.step).map_err(engine_error)?;
        let vocab = self.model.config().vocab;
        for (e, l) in batch.iter().zip(logits.chunks(vocab)) {
            if let Some((_, tokens)) = self.requests.get_mut(&e.id) {
                tokens.push(argmax(l));
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
        out: &'t Vec<f32>,
        lse: &'t Vec<f32>,
    ) -> Option<LayerTensors<'t, EmulatedDevice>> {
        let s = &self.step;
        Some(LayerTensors { index_q: &s.index_q, index_w: &s.weights, attn_q: &s.attn_q, out, lse })
    }
}
