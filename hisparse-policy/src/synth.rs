//! Synthetic selection traces from a latent-relevance process, for trying the simulator and
//! for tests: each token has a fixed relevance plus a drifting part (an AR(1) process per step),
//! partly shared across layers; each step selects the `top_k` most relevant positions, the newest
//! always among them. Persistence (`rho`) and the drift's size set the consecutive-step overlap;
//! the shared fraction sets the adjacent-layer overlap.
//!
//! This generates selections directly; the engine's workload (hisparse-engine) instead builds
//! index keys and queries whose *real* indexer scores follow such a process.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::error::{PolicyError, Result};
use crate::trace::{TraceHeader, TraceRecord};

/// Parameters of a synthetic trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// Requests decoded together.
    pub requests: usize,
    /// Layers.
    pub layers: usize,
    /// Decode steps.
    pub steps: usize,
    /// Tokens in each request's prompt (the first step's sequence is one longer).
    pub prompt_tokens: usize,
    /// Positions selected per step.
    pub top_k: usize,
    /// Per-step persistence of the drifting part (0: fresh every step, 1: frozen).
    pub rho: f64,
    /// Size of the drifting part relative to the fixed part.
    pub drift: f64,
    /// Fraction of the drift's variance shared by all layers.
    pub layer_share: f64,
    /// Record the relevance of the selected positions as scores.
    pub scores: bool,
    /// Record the `score_margin` positions ranked just below the cut, with their relevance
    /// (a scored trace, version 3; 0: none).
    pub score_margin: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            requests: 4,
            layers: 4,
            steps: 200,
            prompt_tokens: 16_384,
            top_k: 2048,
            rho: 0.95,
            drift: 0.6,
            layer_share: 0.8,
            scores: false,
            score_margin: 0,
            seed: 1,
        }
    }
}

/// The header of the trace [`synth_trace`] writes for `cfg`.
pub fn synth_header(cfg: &SynthConfig, row_bytes: u32) -> TraceHeader {
    TraceHeader {
        top_k: cfg.top_k as u32,
        layers: cfg.layers as u32,
        row_bytes,
        has_scores: cfg.scores,
        // validate() keeps score_margin within MAX_TOP_K.
        score_margin: cfg.score_margin as u32,
        index_source: Vec::new(),
    }
}

impl SynthConfig {
    /// Checks every field; the error names the first at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, value: String, reason: &str| {
            Err(PolicyError::Invalid { field, value, reason: reason.into() })
        };
        for (field, v) in [("requests", self.requests), ("layers", self.layers), ("steps", self.steps)] {
            if v == 0 {
                return bad(field, v.to_string(), "must be at least 1");
            }
        }
        if self.layers > crate::trace::MAX_LAYERS as usize {
            return bad(
                "layers",
                self.layers.to_string(),
                &format!("a trace holds at most {} layers", crate::trace::MAX_LAYERS),
            );
        }
        if self.prompt_tokens.checked_add(self.steps).is_none_or(|n| n >= u32::MAX as usize) {
            let (field, v) = if self.steps > self.prompt_tokens {
                ("steps", self.steps)
            } else {
                ("prompt_tokens", self.prompt_tokens)
            };
            return bad(field, v.to_string(), "prompt + steps must stay below 2^32 positions");
        }
        if self.top_k == 0 || self.top_k > self.prompt_tokens + 1 {
            return bad("top_k", self.top_k.to_string(), "must be in 1..=prompt_tokens + 1");
        }
        if self.top_k > crate::trace::MAX_TOP_K as usize {
            return bad(
                "top_k",
                self.top_k.to_string(),
                &format!("a trace holds at most {} per record", crate::trace::MAX_TOP_K),
            );
        }
        if self.score_margin > crate::trace::MAX_TOP_K as usize {
            return bad("score_margin", self.score_margin.to_string(), "must be at most 2^20");
        }
        if !(0.0..=1.0).contains(&self.rho) {
            return bad("rho", self.rho.to_string(), "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.layer_share) {
            return bad("layer_share", self.layer_share.to_string(), "must be in [0, 1]");
        }
        if !(self.drift.is_finite() && self.drift >= 0.0) {
            return bad("drift", self.drift.to_string(), "must be a finite number >= 0");
        }
        Ok(())
    }

    /// Bytes the generator holds at once: every request's relevance state (`2 + layers` f64
    /// per position) and the scratch of one selection. `None` if the count overflows.
    pub fn memory_bytes(&self) -> Option<u64> {
        let len = self.prompt_tokens.checked_add(self.steps)? as u64;
        let state = (self.requests as u64).checked_mul((self.layers as u64).checked_add(2)?)?.checked_mul(len)?;
        state.checked_mul(8)?.checked_add(len.checked_mul(12)?)
    }

    /// Records the trace holds (`steps * requests * layers`), `None` if that overflows.
    pub fn records(&self) -> Option<u64> {
        (self.steps as u64).checked_mul(self.requests as u64)?.checked_mul(self.layers as u64)
    }
}

/// Generates the trace, handing each record to `sink` in (step, request, layer) order.
pub fn synth_trace(cfg: &SynthConfig, mut sink: impl FnMut(TraceRecord) -> Result<()>) -> Result<()> {
    cfg.validate()?;
    let max_len = cfg.prompt_tokens + cfg.steps;
    let innov = (1.0 - cfg.rho * cfg.rho).sqrt();
    let (ws, wl) = (cfg.layer_share.sqrt(), (1.0 - cfg.layer_share).sqrt());
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let n = |rng: &mut StdRng| rng.sample::<f64, _>(StandardNormal);
    struct Req {
        base: Vec<f64>,
        shared: Vec<f64>,
        layer: Vec<Vec<f64>>,
    }
    let mut reqs: Vec<Req> = (0..cfg.requests)
        .map(|_| Req {
            base: (0..max_len).map(|_| n(&mut rng)).collect(),
            shared: (0..max_len).map(|_| n(&mut rng)).collect(),
            layer: (0..cfg.layers).map(|_| (0..max_len).map(|_| n(&mut rng)).collect()).collect(),
        })
        .collect();
    let mut rel = vec![0f64; max_len];
    let mut idx: Vec<u32> = Vec::with_capacity(max_len);
    for step in 1..=cfg.steps {
        let seq_len = cfg.prompt_tokens + step;
        for (r, req) in reqs.iter_mut().enumerate() {
            for x in &mut req.shared[..seq_len] {
                *x = cfg.rho * *x + innov * n(&mut rng);
            }
            for l in 0..cfg.layers {
                let lay = &mut req.layer[l];
                for x in &mut lay[..seq_len] {
                    *x = cfg.rho * *x + innov * n(&mut rng);
                }
                for t in 0..seq_len {
                    rel[t] = req.base[t] + cfg.drift * (ws * req.shared[t] + wl * lay[t]);
                }
                rel[seq_len - 1] = f64::INFINITY; // the newest token is always selected
                idx.clear();
                idx.extend(0..seq_len as u32);
                let k = cfg.top_k;
                let by_rel = |a: &u32, b: &u32| rel[*b as usize].total_cmp(&rel[*a as usize]).then(a.cmp(b));
                if k < seq_len {
                    idx.select_nth_unstable_by(k - 1, by_rel);
                }
                let near = (cfg.score_margin > 0).then(|| {
                    let m = cfg.score_margin.min(seq_len - k);
                    let rest = &mut idx[k..];
                    if m > 0 && m < rest.len() {
                        rest.select_nth_unstable_by(m - 1, by_rel);
                    }
                    let near = &mut rest[..m];
                    near.sort_unstable_by(by_rel);
                    near.iter().map(|&t| (t, rel[t as usize] as f32)).collect()
                });
                let mut selected = idx[..k].to_vec();
                selected.sort_unstable();
                let scores = cfg
                    .scores
                    .then(|| selected.iter().map(|&t| rel[t as usize].min(f64::from(f32::MAX)) as f32).collect());
                sink(TraceRecord {
                    step: step as u32,
                    request: r as u64,
                    layer: l as u32,
                    seq_len: seq_len as u32,
                    selected,
                    scores,
                    near,
                })?;
            }
        }
    }
    Ok(())
}
