//! Teacher-forced decoding: requests admitted from their prefilled prompts, then fed the
//! following tokens of their text one step at a time through a cache, every step's logits scored
//! against the true next token (negative log-likelihood, argmax) — what perplexity and agreement
//! with dense attention are measured on.

use std::time::Instant;

use hisparse_engine::{Admission, Backend, EmulatedDevice, KvCache, RequestId, SwapCounts};

use crate::decode::{LayerObserver, StepToken};
use crate::error::{ModelError, Result};
use crate::model::Llama;
use crate::prefill::PrefillOut;

/// What a teacher-forced run measured.
#[derive(Clone, Debug, Default)]
pub struct ForcedOut {
    /// Per request, per decoded token after the first: `-ln p(true next token)`.
    pub nll: Vec<Vec<f64>>,
    /// Per request, per step: the most likely next token.
    pub argmax: Vec<Vec<u32>>,
    /// Per request, per step: the logits (only when asked for).
    pub logits: Vec<Vec<Vec<f32>>>,
    /// The swap-in's counters over the run.
    pub counts: SwapCounts,
    /// Seconds spent in decode steps.
    pub decode_secs: f64,
    /// Seconds of those spent selecting: the index's scores and the top-k, every layer.
    pub select_secs: f64,
    /// Decode steps run.
    pub steps: usize,
}

/// `-ln softmax(logits)[target]`, in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let sum: f64 = logits.iter().map(|&l| f64::from(l - m).exp()).sum();
    let t = logits.get(target as usize).copied().unwrap_or(f32::NEG_INFINITY);
    sum.ln() - f64::from(t - m)
}

/// The index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Llama {
    /// Admits every prompt of `prompts` as requests `0..n` of `cache`, then decodes `next[i]`
    /// (all of one length) one token per step for all at once; frees the requests at the end.
    /// Step `s` feeds `next[i][s]`; its logits are scored against `next[i][s + 1]`.
    pub fn teacher_forced<B: Backend<Memory = EmulatedDevice>>(
        &self,
        cache: &mut KvCache<B>,
        prompts: &[PrefillOut],
        next: &[&[u32]],
        keep_logits: bool,
        observe: Option<&mut LayerObserver<'_>>,
    ) -> Result<ForcedOut> {
        let steps = next.first().map_or(0, |n| n.len());
        if next.len() != prompts.len() || next.iter().any(|n| n.len() != steps) {
            return Err(ModelError::invalid("next", next.len(), "one continuation per prompt, all of one length"));
        }
        let ids: Vec<RequestId> = (0..prompts.len() as u64).map(RequestId).collect();
        let mut out =
            ForcedOut { nll: vec![Vec::new(); ids.len()], argmax: vec![Vec::new(); ids.len()], ..Default::default() };
        out.logits = vec![Vec::new(); if keep_logits { ids.len() } else { 0 }];
        for (p, &id) in prompts.iter().zip(&ids) {
            match self.admit(cache, id, p, p.tokens + steps)? {
                Admission::Admitted => {}
                other => {
                    for &done in ids.iter().take_while(|&&d| d != id) {
                        cache.free(done)?;
                    }
                    return Err(ModelError::invalid(
                        "prompts",
                        prompts.len(),
                        format!("request {} was not admitted: {other:?}", id.0),
                    ));
                }
            }
        }
        let r = self.forced_steps(cache, &ids, next, &mut out, observe);
        for &id in &ids {
            cache.free(id)?;
        }
        r.map(|()| out)
    }

    fn forced_steps<B: Backend<Memory = EmulatedDevice>>(
        &self,
        cache: &mut KvCache<B>,
        ids: &[RequestId],
        next: &[&[u32]],
        out: &mut ForcedOut,
        mut observe: Option<&mut LayerObserver<'_>>,
    ) -> Result<()> {
        let vocab = self.config().vocab;
        let steps = next.first().map_or(0, |n| n.len());
        for s in 0..steps {
            let batch: Vec<StepToken> = ids.iter().zip(next).map(|(&id, n)| StepToken { id, token: n[s] }).collect();
            let t = Instant::now();
            let d = self.decode_step_observed(cache, &batch, observe.as_deref_mut())?;
            out.decode_secs += t.elapsed().as_secs_f64();
            out.steps += 1;
            out.counts += d.metrics.swap;
            out.select_secs += d.metrics.stages.indexer + d.metrics.stages.top_k;
            for (i, logits) in d.logits.chunks(vocab).enumerate() {
                out.argmax[i].push(argmax(logits));
                if let Some(&target) = next[i].get(s + 1) {
                    out.nll[i].push(nll(logits, target));
                }
                if let Some(keep) = out.logits.get_mut(i) {
                    keep.push(logits.to_vec());
                }
            }
        }
        Ok(())
    }
}
