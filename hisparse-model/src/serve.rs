//! `ModelServer`: a real model serving requests with continuous batching through one
//! [`KvCache`]: requests wait in arrival order, are admitted while the cache has room (a request
//! that can never fit is rejected whole), decode greedily one token per step together, and
//! free what they hold when their output is done. What `hisparse run` and `sweep` drive when
//! their input is a model.
//!
//! A request's prompt is one of the server's prefilled prompts: several requests may share one
//! (admitting copies its rows, so each holds its own), which spares the prefill — minutes per
//! prompt of 8k tokens on a CPU — when only the decode is measured.

use std::collections::VecDeque;
use std::time::Instant;

use hisparse_engine::{Admission, Backend, EmulatedDevice, KvCache, RequestId, StepMetrics, TokenLatency};

use crate::decode::StepToken;
use crate::error::{ModelError, Result};
use crate::forced::argmax;
use crate::model::Llama;
use crate::prefill::PrefillOut;
use crate::trace::SelectionRecorder;

/// A request to serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeRequest {
    /// Its id (unique among the server's requests).
    pub id: RequestId,
    /// Which of the server's prompts it continues.
    pub prompt: usize,
    /// Decode steps it takes part in (tokens generated after the prompt's own next token).
    pub output: usize,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServeOutcome {
    /// It generated all its tokens: the prompt's next token, then one per decode step.
    Finished {
        /// The tokens, `output + 1` of them.
        tokens: Vec<u32>,
    },
    /// It could never fit the cache and was rejected whole.
    Rejected {
        /// Why.
        reason: String,
    },
}

/// What one step did.
#[derive(Clone, Debug, Default)]
pub struct ServedStep {
    /// Its metrics: `seconds` the decode (admission apart, in `stages.admission`), the model's
    /// own work (projections, MLP, logits) in `stages.model`.
    pub metrics: StepMetrics,
    /// The latency of every token it decoded (a request's first: since it was submitted).
    pub latencies: Vec<TokenLatency>,
    /// Every decoded request's logits, in batch order (with [`ModelServer::keep_logits`]).
    pub logits: Vec<(RequestId, Vec<f32>)>,
}

struct Running {
    id: RequestId,
    tokens: Vec<u32>,
    steps_left: usize,
    since: Instant,
}

/// A model serving requests through one cache.
pub struct ModelServer<'a, B: Backend<Memory = EmulatedDevice>> {
    model: &'a Llama,
    prompts: &'a [PrefillOut],
    cache: KvCache<B>,
    waiting: VecDeque<(ServeRequest, Instant)>,
    running: Vec<Running>,
    outcomes: Vec<(RequestId, ServeOutcome)>,
    max_running: usize,
    steps: u64,
    recorder: Option<SelectionRecorder>,
    keep_logits: bool,
}

impl<'a, B: Backend<Memory = EmulatedDevice>> ModelServer<'a, B> {
    /// A server of `model` over `cache` for requests continuing `prompts` (prefilled with the
    /// cache's layouts).
    pub fn new(model: &'a Llama, prompts: &'a [PrefillOut], cache: KvCache<B>) -> Self {
        Self {
            model,
            prompts,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            outcomes: Vec::new(),
            max_running: usize::MAX,
            steps: 0,
            recorder: None,
            keep_logits: false,
        }
    }

    /// The cache.
    pub fn cache(&self) -> &KvCache<B> {
        &self.cache
    }

    /// Decodes at most `n` requests per step (at least one); the others wait, holding nothing.
    pub fn set_max_running(&mut self, n: usize) {
        self.max_running = n.max(1);
    }

    /// Returns every step's logits (a vocabulary of floats per request and step).
    pub fn keep_logits(&mut self, keep: bool) {
        self.keep_logits = keep;
    }

    /// Records every layer's selections from now on into `recorder`.
    pub fn record(&mut self, recorder: SelectionRecorder) {
        self.recorder = Some(recorder);
    }

    /// The recorder, with what it recorded.
    pub fn take_recorder(&mut self) -> Option<SelectionRecorder> {
        self.recorder.take()
    }

    /// Queues `r`; refused (nothing queued) when its prompt does not exist, its id is in use, its
    /// output is 0 or it would not fit the model's positions.
    pub fn submit(&mut self, r: ServeRequest) -> Result<()> {
        let p = self.prompts.get(r.prompt).ok_or_else(|| {
            ModelError::invalid("prompt", r.prompt, format!("the server has {} prompts", self.prompts.len()))
        })?;
        let in_use = self.running.iter().any(|x| x.id == r.id)
            || self.waiting.iter().any(|(x, _)| x.id == r.id)
            || self.outcomes.iter().any(|(x, _)| *x == r.id);
        if r.output == 0 {
            return Err(ModelError::invalid("output", 0, "a request decodes at least one step"));
        }
        if in_use {
            return Err(ModelError::invalid("id", r.id.0, "already submitted"));
        }
        let last =
            p.tokens.checked_add(r.output).ok_or_else(|| ModelError::invalid("output", r.output, "overflows"))?;
        self.model.check_position(last.saturating_sub(1)).map_err(|_| {
            ModelError::invalid(
                "output",
                r.output,
                format!(
                    "prompt {} tokens + output pass the model's {} positions",
                    p.tokens,
                    self.model.config().context
                ),
            )
        })?;
        self.waiting.push_back((r, Instant::now()));
        Ok(())
    }

    /// Nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// How the requests that ended so far ended.
    pub fn outcomes(&self) -> &[(RequestId, ServeOutcome)] {
        &self.outcomes
    }

    /// Admits what fits, then decodes one token of every running request.
    pub fn step(&mut self) -> Result<ServedStep> {
        let t = Instant::now();
        let admitted = self.admit()?;
        let admission = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut out = ServedStep::default();
        if self.running.is_empty() {
            let mut m = StepMetrics { admitted, ..StepMetrics::default() };
            m.stages.admission = admission;
            out.metrics = self.counts(m);
            return Ok(out);
        }
        let batch: Vec<StepToken> =
            self.running.iter().map(|r| StepToken { id: r.id, token: r.tokens.last().copied().unwrap_or(0) }).collect();
        let d = match self.recorder.as_mut() {
            Some(rec) => {
                rec.set_batch(&batch.iter().map(|b| b.id).collect::<Vec<_>>());
                let mut obs = |l: usize, v: &hisparse_engine::LayerView<'_, EmulatedDevice>| rec.observe(l, v);
                self.model.decode_step_observed(&mut self.cache, &batch, Some(&mut obs))?
            }
            None => self.model.decode_step(&mut self.cache, &batch)?,
        };
        let now = Instant::now();
        let vocab = self.model.config().vocab;
        for (r, logits) in self.running.iter_mut().zip(d.logits.chunks(vocab)) {
            r.tokens.push(argmax(logits));
            r.steps_left -= 1;
            let token = (r.tokens.len() - 2) as u32;
            out.latencies.push(TokenLatency { request: r.id, token, seconds: (now - r.since).as_secs_f64() });
            r.since = now;
            if self.keep_logits {
                out.logits.push((r.id, logits.to_vec()));
            }
        }
        let n = batch.len();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].steps_left == 0 {
                let r = self.running.swap_remove(i);
                self.cache.free(r.id)?;
                self.outcomes.push((r.id, ServeOutcome::Finished { tokens: r.tokens }));
            } else {
                i += 1;
            }
        }
        self.steps += 1;
        let m = StepMetrics {
            step: self.steps,
            seconds: t.elapsed().as_secs_f64(),
            tokens: n,
            running: n,
            admitted,
            ..d.metrics
        };
        out.metrics = self.counts(m);
        Ok(out)
    }

    /// Fills the step's queue, memory and outcome counts.
    fn counts(&self, mut m: StepMetrics) -> StepMetrics {
        m.queued = self.waiting.len();
        m.device_bytes_in_use = self.cache.device_bytes_in_use() as u64;
        m.host_bytes_in_use = self.cache.host_bytes_in_use() as u64;
        m.finished = self.outcomes.iter().filter(|(_, o)| matches!(o, ServeOutcome::Finished { .. })).count();
        m.rejected = self.outcomes.len() - m.finished;
        m
    }

    /// Admits waiting requests in order while they fit; rejects the ones that never can.
    fn admit(&mut self) -> Result<usize> {
        let mut admitted = 0;
        while self.running.len() < self.max_running
            && let Some(&(r, since)) = self.waiting.front()
        {
            let p = &self.prompts[r.prompt];
            match self.model.admit(&mut self.cache, r.id, p, p.tokens + r.output)? {
                Admission::Admitted => {
                    self.waiting.pop_front();
                    let first = argmax(&p.logits);
                    self.running.push(Running { id: r.id, tokens: vec![first], steps_left: r.output, since });
                    admitted += 1;
                }
                Admission::Rejected { reason } => {
                    self.waiting.pop_front();
                    self.outcomes.push((r.id, ServeOutcome::Rejected { reason }));
                }
                // Everything is free once nothing runs: a request that waits then never fits.
                Admission::Wait { short } if self.running.is_empty() => {
                    self.waiting.pop_front();
                    let reason = format!("{short} is short with the cache empty");
                    self.outcomes.push((r.id, ServeOutcome::Rejected { reason }));
                }
                Admission::Wait { .. } => break,
            }
        }
        Ok(admitted)
    }
}
