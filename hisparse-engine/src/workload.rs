//! The synthetic workload: seeded, reproducible prompt KV rows, index keys and per-step queries
//! whose *real* indexer top-k selections have the locality real models show.
//!
//! # The process
//!
//! Every token `t` of a request has a latent 128-dim vector `z_t`; its index key in layer `l`
//! is `k = sqrt(1-b²) z_t + b e_lt` (`b` = `layer_noise`; `e` layer-specific). Indexer head `h`
//! of layer `l` queries with `q = sqrt(1-a²) μ_lh + a u_lh(step)`: a fixed direction `μ` (the
//! tokens a head always finds relevant; the heads' directions are orthogonal and of equal
//! norm, so that no request's heads overlap by chance) plus a direction `u` that drifts as an AR(1) process
//! with per-step persistence `rho` (`a` = `drift`). A fraction `fast_heads` of the heads drift
//! with `rho_fast` (a population of quickly changing relevance), the rest with `rho_slow`.
//! `μ` and the innovations of `u` are mostly shared across layers (again through `b`), which is
//! what makes adjacent layers select mostly the same tokens. Head weights vary around
//! `1/sqrt(H)`, with each population (fast, slow) keeping its share of the total, so a request's
//! locality does not depend on which heads its seed weighted. The score the indexer computes,
//! `sum_h w_h relu(q_h . k_t)`, is then a fixed part plus a drifting part per token, and the
//! top-k follows it: persistence and drift size set the consecutive-step overlap, the fast
//! population steepens the LRU miss curve. Layers marked `random` get fresh queries every step
//! (DeepSeek-V3.2's first layers overlap only 1–2% from step to step).
//!
//! Everything is a pure function of `(seed, request, layer, position or step)` except the AR(1)
//! states, which advance once per decode step of a request, so both serving modes see the same
//! data. KV rows and attention queries are uniform noise of unit variance (their values do not
//! affect locality).

use hisparse_kernels::unit_stream;
use hisparse_memory::KvGeometry;
use serde::{Deserialize, Serialize};

/// How the selections of one layer move.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalityParams {
    /// Weight of the drifting direction in slow heads' queries (0: frozen, 1: no fixed part).
    pub drift: f32,
    /// Weight of the drifting direction in fast heads' queries.
    pub fast_drift: f32,
    /// Per-step persistence of slow heads' drift.
    pub rho_slow: f32,
    /// Per-step persistence of fast heads' drift.
    pub rho_fast: f32,
    /// Fraction of heads that drift fast.
    pub fast_heads: f32,
    /// Layer-specific part of keys, fixed directions and drift (0: layers identical).
    pub layer_noise: f32,
    /// Fresh random queries every step (no persistence at all).
    pub random: bool,
}

impl LocalityParams {
    /// Parameters calibrated per preset (see `docs` in the crate README and BENCHMARKS.md).
    pub fn for_preset(geometry: &KvGeometry, layer: usize) -> Self {
        // glm-5.1 (and cpu-small): 3 of 32 indexer heads look mostly somewhere new every step,
        // the rest drift slowly around a fixed direction. Measured over three seeds of two
        // requests each (BENCHMARKS.md, "Workload calibration"): LRU misses 32.7-34.3 /
        // 12.5-13.9 / 5.5-6.3% at 1 / 2 / 4 x top-k slots; FIFO 17.1-18.6%, random 15.9-17.4%,
        // Belady 6.8-7.6% at 2x (published: 30 / 13.4 / 6.7%; 17.2, 16.1, 8.2%).
        let glm = Self {
            drift: 0.55,
            fast_drift: 0.82,
            rho_slow: 0.97,
            rho_fast: 0.0,
            fast_heads: 0.09,
            layer_noise: 0.1,
            random: false,
        };
        match geometry.name.as_str() {
            // deepseek-v3.2: faster drift (consecutive-step overlap 44-47% in deep layers over
            // three seeds, published 35-50%); layers 0 and 1 select afresh every step
            // (published 1-2%).
            "deepseek-v3.2" if layer < 2 => Self { random: true, ..glm },
            "deepseek-v3.2" => Self { drift: 0.9, fast_drift: 1.0, rho_slow: 0.85, fast_heads: 0.1, ..glm },
            _ => glm,
        }
    }
}

/// SplitMix64 step: the next state and its mixed output.
#[inline]
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(unit_stream::GOLDEN);
    unit_stream::mix(*state)
}

/// A seed for the stream named by `parts`.
fn stream_seed(parts: [u64; 5]) -> u64 {
    let mut s = 0x005e_ed0f_4150_a75e_u64;
    for p in parts {
        s ^= p;
        splitmix(&mut s);
        s = splitmix(&mut s);
    }
    s
}

/// Fills `out` with uniform values of unit variance (in `[-√3, √3)`), from the stream `parts`.
fn fill_unit(parts: [u64; 5], out: &mut [f32]) {
    unit_stream::fill_unit(stream_seed(parts), out);
}

// Stream kinds.
const KV_ROW: u64 = 1;
const LATENT: u64 = 2;
const KEY_NOISE: u64 = 3;
const FIXED_SHARED: u64 = 4;
const FIXED_LAYER: u64 = 5;
const INNOV_SHARED: u64 = 6;
const INNOV_LAYER: u64 = 7;
const ATTN_QUERY: u64 = 8;
const WEIGHTS: u64 = 9;
const RANDOM_QUERY: u64 = 10;
const RHO_START: u64 = 11;

/// The workload of one engine: geometry, seed and per-layer locality.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Seed of everything.
    pub seed: u64,
    /// Layers.
    pub layers: usize,
    /// Indexer heads.
    pub index_heads: usize,
    /// Indexer head dim.
    pub index_dim: usize,
    /// Attention query heads.
    pub q_heads: usize,
    /// Dims of a KV row (`d_qk`).
    pub d_qk: usize,
    /// Locality per layer.
    pub locality: Vec<LocalityParams>,
}

/// The AR(1) drift state of one request (advanced once per decode step).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestDrift {
    /// Steps taken.
    pub step: u32,
    shared: Vec<f32>,
    layer: Vec<f32>,
    /// Per layer, the query's fixed part `c μ_shared + b μ_layer` (it never changes; cached).
    fixed: Vec<f32>,
    /// Head weights (shared by all layers; cached).
    weights: Vec<f32>,
}

impl Workload {
    /// The calibrated workload for `geometry`.
    pub fn new(geometry: &KvGeometry, seed: u64) -> Self {
        Self {
            seed,
            layers: geometry.layers,
            index_heads: geometry.index_heads,
            index_dim: geometry.index_dim,
            q_heads: geometry.q_heads,
            d_qk: geometry.d_qk(),
            locality: (0..geometry.layers).map(|l| LocalityParams::for_preset(geometry, l)).collect(),
        }
    }

    /// The same workload with `params` in every layer (for calibration).
    pub fn with_locality(mut self, params: LocalityParams) -> Self {
        self.locality.iter_mut().for_each(|p| *p = params);
        self
    }

    fn parts(&self, kind: u64, req: u64, layer: usize, index: u64) -> [u64; 5] {
        [self.seed, kind, req, layer as u64, index]
    }

    /// The KV row values (`d_qk`) of `(req, layer, position)`: the unit stream seeded
    /// [`Workload::kv_row_seed`].
    pub fn kv_row(&self, req: u64, layer: usize, position: usize, out: &mut [f32]) {
        unit_stream::fill_unit(self.kv_row_seed(req, layer, position), out);
    }

    /// The unit-stream seed of [`Workload::kv_row`] (to generate the row where the kernels run:
    /// `Backend::fill_new_rows`).
    pub fn kv_row_seed(&self, req: u64, layer: usize, position: usize) -> u64 {
        stream_seed(self.parts(KV_ROW, req, layer, position as u64))
    }

    /// The index-key values (`index_dim`) of `(req, layer, position)`: `c u + b w` with `(c, b)`
    /// = [`Workload::key_mix`] and `u`, `w` the streams seeded [`Workload::index_key_seeds`].
    pub fn index_key(&self, req: u64, layer: usize, position: usize, out: &mut [f32]) {
        let (c, b) = self.key_mix(layer);
        let [su, sw] = self.index_key_seeds(req, layer, position);
        let mut noise = vec![0f32; out.len()];
        unit_stream::fill_unit(su, out);
        unit_stream::fill_unit(sw, &mut noise);
        for (o, n) in out.iter_mut().zip(&noise) {
            *o = c * *o + b * n;
        }
    }

    /// The seeds of [`Workload::index_key`]'s two streams: the token's latent (shared by the
    /// layers) and the layer's noise.
    pub fn index_key_seeds(&self, req: u64, layer: usize, position: usize) -> [u64; 2] {
        [
            stream_seed(self.parts(LATENT, req, 0, position as u64)),
            stream_seed(self.parts(KEY_NOISE, req, layer, position as u64)),
        ]
    }

    /// The mix `(c, b)` of layer `layer`'s index keys: `b` its layer noise, `c = sqrt(1 - b²)`.
    pub fn key_mix(&self, layer: usize) -> (f32, f32) {
        let b = self.locality[layer].layer_noise;
        ((1.0 - b * b).sqrt(), b)
    }

    /// The attention query (`q_heads * d_qk`) of `(req, layer)` at decode `step`.
    pub fn attention_query(&self, req: u64, layer: usize, step: u32, out: &mut [f32]) {
        fill_unit(self.parts(ATTN_QUERY, req, layer, u64::from(step)), out);
    }

    /// The unit-stream seed of [`Workload::attention_query`] (to generate it on the device with
    /// `Backend::fill_unit_bf16`).
    pub fn attention_query_seed(&self, req: u64, layer: usize, step: u32) -> u64 {
        stream_seed(self.parts(ATTN_QUERY, req, layer, u64::from(step)))
    }

    /// A fresh drift state for a request (`step` 0: nothing drawn yet).
    pub fn start(&self, req: u64) -> RequestDrift {
        let n = self.index_heads * self.index_dim;
        let mut shared = vec![0f32; n];
        fill_unit(self.parts(RHO_START, req, usize::MAX, 0), &mut shared);
        let mut layer = vec![0f32; self.layers * n];
        for (l, chunk) in layer.chunks_mut(n).enumerate() {
            fill_unit(self.parts(RHO_START, req, l, 1), chunk);
        }
        let mut fixed = vec![0f32; self.layers * n];
        let (mut mu, mut mu_l) = (vec![0f32; n], vec![0f32; n]);
        fill_unit(self.parts(FIXED_SHARED, req, 0, 0), &mut mu);
        orthogonal_rows(&mut mu, self.index_dim);
        for (l, chunk) in fixed.chunks_mut(n).enumerate() {
            let b = self.locality[l].layer_noise;
            let c = (1.0 - b * b).sqrt();
            fill_unit(self.parts(FIXED_LAYER, req, l, 0), &mut mu_l);
            for ((f, m), ml) in chunk.iter_mut().zip(&mu).zip(&mu_l) {
                *f = c * m + b * ml;
            }
        }
        let mut weights = vec![0f32; self.index_heads];
        fill_unit(self.parts(WEIGHTS, req, 0, 0), &mut weights);
        let inv = 1.0 / (self.index_heads as f32).sqrt();
        for x in weights.iter_mut() {
            *x = (1.0 + 0.4 * *x / 1.732_050_8) * inv; // in [0.6, 1.4] / sqrt(H)
        }
        // Each population (fast heads first, then slow) keeps its share of the total weight:
        // the heads vary, the balance between changing and fixed relevance does not (it would
        // make a request's locality a matter of its seed).
        if let Some(p) = self.locality.last() {
            let fast = p.fast_count(self.index_heads);
            for range in [0..fast, fast..self.index_heads] {
                let n = range.len() as f32;
                let sum: f32 = weights[range.clone()].iter().sum();
                if sum > 0.0 {
                    weights[range].iter_mut().for_each(|x| *x *= n * inv / sum);
                }
            }
        }
        RequestDrift { step: 0, shared, layer, fixed, weights }
    }

    /// Advances `d` by one decode step (AR(1) with each head's persistence).
    pub fn advance(&self, req: u64, d: &mut RequestDrift) {
        d.step += 1;
        let (h, dim) = (self.index_heads, self.index_dim);
        let n = h * dim;
        let mut innov = vec![0f32; n];
        // The shared innovation uses the deepest layer's head speeds (layers share them).
        if let Some(p) = self.locality.last() {
            fill_unit(self.parts(INNOV_SHARED, req, usize::MAX, u64::from(d.step)), &mut innov);
            ar1(&mut d.shared, &innov, h, dim, p);
        }
        for (l, chunk) in d.layer.chunks_mut(n).enumerate() {
            fill_unit(self.parts(INNOV_LAYER, req, l, u64::from(d.step)), &mut innov);
            ar1(chunk, &innov, h, dim, &self.locality[l]);
        }
    }

    /// The indexer query (`index_heads * index_dim`) and head weights (`index_heads`) of
    /// `(req, layer)` for the drift state `d`.
    pub fn indexer_query(&self, req: u64, layer: usize, d: &RequestDrift, q: &mut [f32], w: &mut [f32]) {
        let p = self.locality[layer];
        let n = self.index_heads * self.index_dim;
        w.copy_from_slice(&d.weights);
        if p.random {
            fill_unit(self.parts(RANDOM_QUERY, req, layer, u64::from(d.step)), q);
            return;
        }
        let b = p.layer_noise;
        let c = (1.0 - b * b).sqrt();
        let fixed = &d.fixed[layer * n..(layer + 1) * n];
        let u_l = &d.layer[layer * n..(layer + 1) * n];
        let fast = p.fast_count(self.index_heads);
        for hd in 0..self.index_heads {
            let da = if hd < fast { p.fast_drift } else { p.drift };
            let fa = (1.0 - da * da).max(0.0).sqrt();
            for i in hd * self.index_dim..(hd + 1) * self.index_dim {
                let drift = c * d.shared[i] + b * u_l[i];
                q[i] = fa * fixed[i] + da * drift;
            }
        }
    }
}

impl LocalityParams {
    /// How many of `heads` heads drift fast (the first ones).
    pub fn fast_count(&self, heads: usize) -> usize {
        ((self.fast_heads * heads as f32).round() as usize).min(heads)
    }
}

/// Makes the rows of `m` (each `dim` long) orthogonal (Gram-Schmidt, in order) and of norm
/// `sqrt(dim)` (what a row of unit-variance entries has on average), so that the heads' fixed
/// directions neither overlap nor differ in strength by chance. Rows beyond `dim` keep their
/// direction and get the norm.
fn orthogonal_rows(m: &mut [f32], dim: usize) {
    let rows = m.len() / dim.max(1);
    let target = (dim as f64).sqrt();
    let mut done: Vec<Vec<f64>> = Vec::new();
    for r in 0..rows {
        let mut v: Vec<f64> = m[r * dim..(r + 1) * dim].iter().map(|&x| f64::from(x)).collect();
        if done.len() < dim {
            for u in &done {
                let d: f64 = v.iter().zip(u).map(|(a, b)| a * b).sum::<f64>() / (target * target);
                v.iter_mut().zip(u).for_each(|(a, b)| *a -= d * b);
            }
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x *= target / norm);
        }
        m[r * dim..(r + 1) * dim].iter_mut().zip(&v).for_each(|(o, &x)| *o = x as f32);
        done.push(v);
    }
}

/// AR(1) step of `state` (`heads x dim`) with innovation `innov`: fast heads first.
fn ar1(state: &mut [f32], innov: &[f32], heads: usize, dim: usize, p: &LocalityParams) {
    let fast = p.fast_count(heads);
    for h in 0..heads {
        let rho = if p.random {
            0.0
        } else if h < fast {
            p.rho_fast
        } else {
            p.rho_slow
        };
        let s = (1.0 - rho * rho).sqrt();
        for (x, e) in state[h * dim..(h + 1) * dim].iter_mut().zip(&innov[h * dim..(h + 1) * dim]) {
            *x = rho * *x + s * e;
        }
    }
}
