//! The emulated model (as opposed to a real model, which `hisparse-model` runs): the
//! non-attention part of each layer of a real model (its projections, dense FFN and MoE experts)
//! as the GEMMs one GPU of its deployment runs per decode step, on random weights of the size that
//! GPU holds. Attention itself is real (the
//! engine's kernels); this part only makes step time grow with batch as the real model's does.
//! `EmulatedModel` holds a model's dimensions and its sharding and plans each layer's GEMMs;
//! `weights.rs` holds the weights on the device and launches the plan. The derivation (shapes,
//! sharding, MoE routing, what is not emulated) is in `MODEL.md` beside this file.
//!
//! Invariant: every GEMM with fp8 weights runs as a bf16 GEMM with half the output columns —
//! the same weight bytes read and the same tensor-core time (bf16's peak rate is half fp8's).

mod exchange;
mod weights;

use hisparse_memory::Preset;
use serde::Serialize;

pub use exchange::RankExchange;
pub use weights::EmulatedWeights;

use crate::error::{EngineError, Result};

/// A model's dimensions and how one GPU of its deployment holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EmulatedModel {
    /// Preset name.
    pub name: String,
    /// Transformer layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// The attention's projections: MLA with DSA's indexer, or grouped-query.
    pub attention: AttentionShape,
    /// How the weights are stored (the GEMMs read their bytes).
    pub weights: WeightFormat,
    /// Intermediate size of the dense FFN layers.
    pub dense_inter: usize,
    /// Leading layers with a dense FFN instead of MoE.
    pub dense_layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Shared experts per MoE layer.
    pub shared_experts: usize,
    /// Intermediate size of one expert.
    pub moe_inter: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// GPUs of the deployment: attention data-parallel (each GPU decodes its own requests with a
    /// full copy of the attention weights); FFN, experts and LM head split `ranks` ways over the
    /// tokens of all GPUs.
    pub ranks: usize,
}

/// The attention block's projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum AttentionShape {
    /// Multi-head latent attention with DSA's lightning indexer (GLM-5.1, DeepSeek-V3.2).
    Mla(MlaShape),
    /// Grouped-query attention: `heads` query heads over `kv_heads` KV heads of `head_dim`
    /// (Llama, Qwen, Mistral).
    Gqa {
        /// KV heads.
        kv_heads: usize,
        /// Dims of one head.
        head_dim: usize,
    },
}

/// MLA's low-rank projections and DSA's indexer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MlaShape {
    /// Query low-rank dimension.
    pub q_lora: usize,
    /// KV latent dimension.
    pub kv_lora: usize,
    /// Rotary dimensions per head.
    pub rope: usize,
    /// Non-rotary query/key dimensions per head.
    pub qk_nope: usize,
    /// Value dimensions per head.
    pub v_head: usize,
    /// Indexer heads.
    pub index_heads: usize,
    /// Indexer head dimension.
    pub index_dim: usize,
}

/// How a model's projection and FFN weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// One byte per weight: run as a bf16 GEMM with half the output columns (the invariant
    /// above).
    Fp8,
    /// Two bytes per weight.
    Bf16,
}

/// One GEMM of the plan (row-major `[m × k] · [k × n]`, `batch` of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedGemm {
    /// What it computes.
    pub name: &'static str,
    /// Rows (tokens).
    pub m: usize,
    /// Output columns as the GPU runs them (halved for fp8 weights).
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// GEMMs in the batch (heads, or experts touched).
    pub batch: usize,
    /// Weight matrices held for it (`batch` for heads; all experts for the routed experts).
    pub held: usize,
}

impl PlannedGemm {
    /// Weight bytes held on the GPU.
    pub fn weight_bytes(&self) -> u64 {
        2 * (self.k * self.n * self.held) as u64
    }
}

impl EmulatedModel {
    /// The presets that have an emulated model.
    pub const PRESETS: [Preset; 4] = [Preset::Glm51, Preset::Glm52, Preset::DeepseekV32, Preset::Llama31_8b];

    /// Presets: `glm-5.1` (and `glm-5.2`, the same weights) and `deepseek-v3.2`, fp8 weights
    /// over 8 GPUs; `llama-3.1-8b`, bf16 weights on one GPU (see `MODEL.md`).
    pub fn preset(preset: Preset) -> Result<Self> {
        let name = preset.name();
        let mla = |q_lora, qk_nope, v_head, index_heads| MlaShape {
            q_lora,
            kv_lora: 512,
            rope: 64,
            qk_nope,
            v_head,
            index_heads,
            index_dim: 128,
        };
        let moe = |name: &str, layers, hidden, heads, attention, dense_inter, vocab| Self {
            name: name.to_owned(),
            layers,
            hidden,
            heads,
            attention: AttentionShape::Mla(attention),
            weights: WeightFormat::Fp8,
            dense_inter,
            dense_layers: 3,
            experts: 256,
            experts_per_token: 8,
            shared_experts: 1,
            moe_inter: 2048,
            vocab,
            ranks: 8,
        };
        match preset {
            // GLM-5.2's weights have GLM-5.1's shapes (its IndexShare changes the KV, not them).
            Preset::Glm51 | Preset::Glm52 => Ok(moe(name, 78, 6144, 64, mla(2048, 192, 256, 32), 12288, 154_880)),
            Preset::DeepseekV32 => Ok(moe(name, 61, 7168, 128, mla(1536, 128, 128, 64), 18432, 129_280)),
            Preset::Llama31_8b => Ok(Self {
                name: name.to_owned(),
                layers: 32,
                hidden: 4096,
                heads: 32,
                attention: AttentionShape::Gqa { kv_heads: 8, head_dim: 128 },
                weights: WeightFormat::Bf16,
                dense_inter: 14336,
                dense_layers: 32,
                experts: 0,
                experts_per_token: 0,
                shared_experts: 0,
                moe_inter: 0,
                vocab: 128_256,
                ranks: 1,
            }),
            Preset::CpuSmall | Preset::Smollm2_135m => Err(EngineError::Config {
                field: "emulated_model",
                value: name.to_owned(),
                reason: format!(
                    "no emulated model of that name (known: {})",
                    Self::PRESETS.map(Preset::name).join(", ")
                ),
            }),
        }
    }

    /// Checks that every dimension the plan divides is whole and non-zero.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, v: usize, why: &str| {
            Err(EngineError::Config { field, value: v.to_string(), reason: why.into() })
        };
        for (f, v) in [
            ("emulated_model.layers", self.layers),
            ("emulated_model.hidden", self.hidden),
            ("emulated_model.heads", self.heads),
            ("emulated_model.ranks", self.ranks),
        ] {
            if v == 0 {
                return bad(f, v, "must be at least 1");
            }
        }
        if self.experts_per_token > self.experts {
            return bad("emulated_model.experts_per_token", self.experts_per_token, "more than the experts");
        }
        for (f, v) in [
            ("emulated_model.dense_inter", self.dense_inter),
            ("emulated_model.moe_inter", self.moe_inter),
            ("emulated_model.vocab", self.vocab),
        ] {
            if !v.is_multiple_of(2 * self.ranks) {
                return bad(f, v, "must split into 2 x ranks whole parts");
            }
        }
        if !self.hidden.is_multiple_of(2) {
            return bad("emulated_model.hidden", self.hidden, "must be even");
        }
        if let AttentionShape::Gqa { kv_heads, head_dim } = self.attention {
            if kv_heads == 0 || !self.heads.is_multiple_of(kv_heads) {
                return bad("emulated_model.kv_heads", kv_heads, "must divide the query heads");
            }
            if head_dim == 0 {
                return bad("emulated_model.head_dim", head_dim, "must be at least 1");
            }
        }
        Ok(())
    }

    /// Experts a step's `tokens` touch on average when each picks `experts_per_token` of them
    /// uniformly: `E · (1 − (1 − k/E)^T)`, rounded, at least 1.
    pub fn experts_touched(&self, tokens: usize) -> usize {
        if self.experts == 0 || tokens == 0 {
            return 0;
        }
        let (e, k) = (self.experts as f64, self.experts_per_token as f64);
        let u = e * (1.0 - (1.0 - k / e).powf(tokens as f64));
        (u.round() as usize).clamp(1, self.experts)
    }

    /// The GEMMs of layer `l` for a batch of `batch` requests on this GPU (every GPU of the
    /// deployment decoding as many). With `batch` 0 the plan still lists every weight held.
    pub fn plan(&self, l: usize, batch: usize) -> Vec<PlannedGemm> {
        let (h, r) = (self.hidden, self.ranks);
        let tokens = batch * r;
        // Output columns as the GEMM runs them: halved for fp8 weights (the invariant above).
        let cols = |n: usize| match self.weights {
            WeightFormat::Fp8 => n / 2,
            WeightFormat::Bf16 => n,
        };
        let g = |name, m, n, k, batch, held| PlannedGemm { name, m, n, k, batch, held };
        let mut p = Vec::new();
        match self.attention {
            AttentionShape::Mla(a) => p.extend([
                g("q_a", batch, cols(a.q_lora), h, 1, 1),
                g("q_b", batch, cols(self.heads * (a.qk_nope + a.rope)), a.q_lora, 1, 1),
                g("kv_a", batch, cols(a.kv_lora + a.rope), h, 1, 1),
                // The absorbed key and value up-projections, per head, kept in bf16 (as SGLang
                // does).
                g("w_uk", batch, a.kv_lora, a.qk_nope, self.heads, self.heads),
                g("w_uv", batch, a.v_head, a.kv_lora, self.heads, self.heads),
                g("o_proj", batch, cols(h), self.heads * a.v_head, 1, 1),
                g("index_q", batch, cols(a.index_heads * a.index_dim), a.q_lora, 1, 1),
                g("index_k", batch, cols(a.index_dim + a.index_heads), h, 1, 1),
            ]),
            AttentionShape::Gqa { kv_heads, head_dim } => {
                if l == 0 {
                    // The token embedding: held, read by a lookup, not a GEMM (m = 0).
                    p.push(g("embed", 0, h, self.vocab, 1, 1));
                }
                p.extend([
                    g("q_proj", batch, cols(self.heads * head_dim), h, 1, 1),
                    g("kv_proj", batch, cols(2 * kv_heads * head_dim), h, 1, 1),
                    g("o_proj", batch, cols(h), self.heads * head_dim, 1, 1),
                ]);
            }
        }
        if l < self.dense_layers {
            p.push(g("ffn_gate_up", tokens, cols(2 * self.dense_inter / r), h, 1, 1));
            p.push(g("ffn_down", tokens, cols(h), self.dense_inter / r, 1, 1));
        } else {
            let per = self.moe_inter / r;
            let touched = self.experts_touched(tokens);
            let rows = if touched == 0 { 0 } else { (tokens * self.experts_per_token).div_ceil(touched) };
            // The router's weights are not quantised.
            p.push(g("router", tokens, self.experts, h, 1, 1));
            p.push(g("shared_gate_up", tokens, cols(2 * per * self.shared_experts), h, 1, 1));
            p.push(g("shared_down", tokens, cols(h), per * self.shared_experts, 1, 1));
            p.push(g("experts_gate_up", rows, cols(2 * per), h, touched, self.experts));
            p.push(g("experts_down", rows, cols(h), per, touched, self.experts));
        }
        if l + 1 == self.layers {
            // The LM head, split over the vocabulary, in bf16.
            p.push(g("lm_head", tokens, self.vocab / r, h, 1, 1));
        }
        p
    }

    /// Weight bytes one GPU holds (fp8 weights at one byte each, bf16 at two).
    pub fn weight_bytes(&self) -> u64 {
        (0..self.layers).flat_map(|l| self.plan(l, 0)).map(|g| g.weight_bytes()).sum()
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        let held = if self.ranks == 1 {
            "the whole model on one GPU".to_owned()
        } else {
            format!("one GPU of {} (attention data-parallel, FFN/experts split {} ways)", self.ranks, self.ranks)
        };
        format!(
            "emulated {} non-attention layers: cuBLAS GEMMs on random weights, {held}, {:.1} GB of weights",
            self.name,
            self.weight_bytes() as f64 / 1e9
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm_5_1_weighs_what_one_of_eight_gpus_holds() {
        let m = EmulatedModel::preset(Preset::Glm51).unwrap();
        m.validate().unwrap();
        // 744B parameters: attention (~13.6 GB) on every GPU, experts and FFN split 8 ways.
        let gb = m.weight_bytes() as f64 / 1e9;
        assert!((100.0..110.0).contains(&gb), "{gb} GB");
        let d = EmulatedModel::preset(Preset::DeepseekV32).unwrap();
        let gb = d.weight_bytes() as f64 / 1e9;
        assert!((90.0..105.0).contains(&gb), "{gb} GB");
        assert!(EmulatedModel::preset(Preset::CpuSmall).unwrap_err().to_string().contains("cpu-small"));
    }

    #[test]
    fn llama_3_1_8b_weighs_its_bf16_checkpoint() {
        let m = EmulatedModel::preset(Preset::Llama31_8b).unwrap();
        m.validate().unwrap();
        // 8.03B parameters in bf16 (16.06 GB): every one held but the norms', the embedding
        // included.
        assert_eq!(m.weight_bytes(), 2 * (8_030_261_248 - 32 * 2 * 4096 - 4096), "{}", m.weight_bytes());
        // Every layer's FFN is dense, nothing is split, and no GEMM is halved.
        let p = m.plan(5, 4);
        let names: Vec<&str> = p.iter().map(|g| g.name).collect();
        assert_eq!(names, ["q_proj", "kv_proj", "o_proj", "ffn_gate_up", "ffn_down"]);
        assert_eq!((p[0].m, p[0].n, p[0].k), (4, 4096, 4096));
        assert_eq!((p[3].m, p[3].n, p[3].k), (4, 2 * 14336, 4096));
        assert!(m.plan(0, 4).iter().any(|g| g.name == "embed" && g.m == 0));
        assert!(m.describe().contains("the whole model on one GPU"), "{}", m.describe());
        // Grouped-query heads must split evenly over the KV heads; a head has dims.
        let bad = EmulatedModel { attention: AttentionShape::Gqa { kv_heads: 5, head_dim: 128 }, ..m.clone() };
        assert!(bad.validate().unwrap_err().to_string().contains("emulated_model.kv_heads"));
        let bad = EmulatedModel { attention: AttentionShape::Gqa { kv_heads: 8, head_dim: 0 }, ..m };
        assert!(bad.validate().unwrap_err().to_string().contains("emulated_model.head_dim"));
    }

    #[test]
    fn a_larger_batch_touches_more_experts_and_reads_more_weights() {
        let m = EmulatedModel::preset(Preset::Glm51).unwrap();
        let touched: Vec<usize> = [1, 4, 16, 64].iter().map(|&b| m.experts_touched(b * 8)).collect();
        assert!(touched.windows(2).all(|w| w[0] < w[1]), "{touched:?}");
        assert_eq!(m.experts_touched(8 * 64), 256);
        assert_eq!(m.experts_touched(1), 8);
        let read = |b: usize| -> u64 { m.plan(10, b).iter().map(|g| 2 * (g.k * g.n * g.batch) as u64).sum() };
        assert!(read(1) < read(16) && read(16) < read(64));
        // Every expert GEMM carries all the step's tokens routed to it.
        let p = m.plan(10, 4);
        let e = p.iter().find(|g| g.name == "experts_gate_up").unwrap();
        assert!(e.m * e.batch >= 4 * 8 * 8);
    }
}
