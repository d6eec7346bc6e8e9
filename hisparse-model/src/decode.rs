//! One decode step of a batch of requests: per layer the model's projections on the host, then
//! `DecodeStep::layer` for the attention (new rows and index keys written into the cache,
//! oracle selection, swap-in, sparse attention), then the output projection and the MLP; the
//! logits of every request at the end. An observer sees each layer's selections.

use half::bf16;
use hisparse_engine::{Backend, EmulatedDevice, KvCache, LayerInputs, LayerView, RequestId, StepMetrics};

use crate::error::{ModelError, Result};
use crate::math::{matmul, rms_norm};
use crate::model::Llama;

/// One request's token for a step: the token at its next position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepToken {
    /// The request.
    pub id: RequestId,
    /// The token at position `seq_len` of the request.
    pub token: u32,
}

/// What a step returns.
pub struct DecodeOut {
    /// Logits `[batch, vocab]`.
    pub logits: Vec<f32>,
    /// The cache's counters and stage times of the step.
    pub metrics: StepMetrics,
}

/// A layer's selections, as an observer of [`Llama::decode_step_observed`] sees them.
pub type LayerObserver<'o> = dyn FnMut(usize, &LayerView<'_, EmulatedDevice>) -> Result<()> + 'o;

impl Llama {
    /// Decodes one token of every request of `batch` through `cache`.
    pub fn decode_step<B: Backend<Memory = EmulatedDevice>>(
        &self,
        cache: &mut KvCache<B>,
        batch: &[StepToken],
    ) -> Result<DecodeOut> {
        self.decode_step_observed(cache, batch, None)
    }

    /// [`Llama::decode_step`], calling `observe` after every layer with its selections.
    pub fn decode_step_observed<B: Backend<Memory = EmulatedDevice>>(
        &self,
        cache: &mut KvCache<B>,
        batch: &[StepToken],
        mut observe: Option<&mut LayerObserver<'_>>,
    ) -> Result<DecodeOut> {
        self.check_stop()?;
        let c = self.config();
        let n = batch.len();
        let (hd, heads, kvh) = (c.head_dim, c.heads, c.kv_heads);
        let (kvd, group) = (kvh * hd, heads / kvh);
        let (kv_row, key) = cache.layouts();
        if kv_row.d_qk() != 2 * kvd || key.dim() != kvd || cache.config().geometry.layers != c.layers {
            return Err(ModelError::invalid(
                "cache",
                &cache.config().geometry.name,
                "its geometry is not this model's",
            ));
        }
        let mut positions = Vec::with_capacity(n);
        for t in batch {
            let p = cache.seq_len(t.id)?;
            self.check_position(p)?;
            positions.push(p);
        }
        let tokens: Vec<u32> = batch.iter().map(|t| t.token).collect();
        let ids: Vec<RequestId> = batch.iter().map(|t| t.id).collect();
        let mut x = self.embed(&tokens)?;
        let scale = 1.0 / (hd as f32).sqrt();
        let weights = vec![scale; n * heads];
        let mut step = cache.begin_step(&ids)?;
        let (mut out, mut lse) = (vec![0f32; n * heads * hd], vec![0f32; n * heads]);
        let mut vals = vec![0f32; 2 * kvd];
        for (l, b) in self.weights.blocks.iter().enumerate() {
            let h = rms_norm(&x, &b.attn_norm, c.rms_eps);
            let (mut q, mut k, v) = (matmul(&b.wq, &h, n)?, matmul(&b.wk, &h, n)?, matmul(&b.wv, &h, n)?);
            let (mut rows, mut keys) = (vec![0u8; n * kv_row.row_bytes()], vec![0u8; n * key.row_bytes()]);
            let mut index_q = vec![bf16::ZERO; n * heads * kvd];
            for (i, &p) in positions.iter().enumerate() {
                self.rope.apply(&mut q[i * heads * hd..][..heads * hd], p);
                self.rope.apply(&mut k[i * kvd..][..kvd], p);
                vals[..kvd].copy_from_slice(&k[i * kvd..][..kvd]);
                vals[kvd..].copy_from_slice(&v[i * kvd..][..kvd]);
                let enc = |e: hisparse_engine::MemoryError| ModelError::Engine(e.into());
                kv_row.encode(&vals, &mut rows[i * kv_row.row_bytes()..][..kv_row.row_bytes()]).map_err(enc)?;
                key.encode(&k[i * kvd..][..kvd], &mut keys[i * key.row_bytes()..][..key.row_bytes()]).map_err(enc)?;
                // The oracle's query of head h: q_h in its group's part of the index key.
                for hh in 0..heads {
                    let g = hh / group;
                    let dst = &mut index_q[(i * heads + hh) * kvd + g * hd..][..hd];
                    for (d, s) in dst.iter_mut().zip(&q[(i * heads + hh) * hd..][..hd]) {
                        *d = bf16::from_f32(*s);
                    }
                }
            }
            let attention_queries: Vec<bf16> = q.iter().map(|v| bf16::from_f32(*v)).collect();
            let inputs = LayerInputs {
                index_queries: Some(&index_q),
                index_weights: Some(&weights),
                new_index_keys: Some(&keys),
                attention_queries: &attention_queries,
                new_kv_rows: &rows,
            };
            if self.tensor_layers {
                self.layer_through_tensors(&mut step, l, &inputs, (&mut out, &mut lse))?;
            } else {
                step.layer(l, &inputs, &mut out, &mut lse)?;
            }
            if let Some(obs) = observe.as_deref_mut() {
                let view = step.view()?;
                obs(l, &view)?;
            }
            let o = matmul(&b.wo, &out, n)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            self.mlp(b, &mut x, n)?;
        }
        let metrics = step.end()?;
        let logits = matmul(&self.weights.output, &rms_norm(&x, &self.weights.norm, c.rms_eps), n)?;
        Ok(DecodeOut { logits, metrics })
    }
}

impl Llama {
    /// Layer `l` of `step` through `DecodeStep::layer_tensors`: `inputs` as candle CPU tensors,
    /// the outputs copied back into `out` and `lse`.
    fn layer_through_tensors<B: Backend<Memory = EmulatedDevice>>(
        &self,
        step: &mut hisparse_engine::DecodeStep<'_, B>,
        l: usize,
        inputs: &LayerInputs<'_, EmulatedDevice>,
        (out, lse): (&mut [f32], &mut [f32]),
    ) -> Result<()> {
        use candle_core::{Device, Tensor};
        let n = step.batch().len();
        let cpu = &Device::Cpu;
        let t = |v: &[bf16], d: usize| Tensor::from_slice(v, (n, v.len() / n.max(1) / d, d), cpu);
        let c = self.config();
        let iq = inputs.index_queries.map(|v| t(v, c.kv_heads * c.head_dim)).transpose()?;
        let iw = inputs.index_weights.map(|v| Tensor::from_slice(v, (n, v.len() / n.max(1)), cpu)).transpose()?;
        let ik = inputs.new_index_keys.map(|v| Tensor::from_slice(v, (n, v.len() / n.max(1)), cpu)).transpose()?;
        let q = t(inputs.attention_queries, c.head_dim)?;
        let rows = Tensor::from_slice(inputs.new_kv_rows, (n, inputs.new_kv_rows.len() / n.max(1)), cpu)?;
        let got = step.layer_tensors(
            l,
            &hisparse_engine::TensorInputs {
                index_queries: iq.as_ref(),
                index_weights: iw.as_ref(),
                new_index_keys: ik.as_ref(),
                attention_queries: &q,
                new_kv_rows: &rows,
            },
        )?;
        out.copy_from_slice(&got.out.flatten_all()?.to_vec1::<f32>()?);
        lse.copy_from_slice(&got.lse.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    }
}
