//! One decode step of a batch of requests: per layer the model's projections on the host, then
//! `DecodeStep::layer` for the attention (new rows and index keys written into the cache,
//! oracle selection, swap-in, sparse attention), then the output projection and the MLP; the
//! logits of every request at the end. An observer sees each layer's selections. The step's
//! pieces (`StepState` and the functions that advance it) are what the engine's client
//! (`client.rs`) decodes through too.

use half::bf16;
use hisparse_engine::{
    Backend, EmulatedDevice, IndexKeyLayout, KvCache, KvRowLayout, LayerInputs, LayerView, RequestId, StepMetrics,
};

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

/// One step's host state of a batch: the residual stream and the layer's inputs for the cache,
/// reused from layer to layer (what [`Llama::decode_step`] and the engine's client
/// [`crate::LlamaDecoder`] both decode through).
#[derive(Default)]
pub(crate) struct StepState {
    /// The residual stream, `[n, hidden]`.
    pub x: Vec<f32>,
    /// Each request's position of its new token.
    pub positions: Vec<usize>,
    /// The oracle's head weights (the attention's scale), `[n, heads]`.
    pub weights: Vec<f32>,
    /// Layer inputs: the oracle's queries (`[n, heads, kv dims]`, each head in its group's part),
    /// the new index keys and KV rows, the attention queries.
    pub index_q: Vec<bf16>,
    pub keys: Vec<u8>,
    pub rows: Vec<u8>,
    pub attn_q: Vec<bf16>,
}

impl StepState {
    /// Layer inputs for the cache, as last projected.
    pub fn inputs(&self) -> LayerInputs<'_, EmulatedDevice> {
        LayerInputs {
            index_queries: Some(&self.index_q),
            index_weights: Some(&self.weights),
            new_index_keys: Some(&self.keys),
            attention_queries: &self.attn_q,
            new_kv_rows: &self.rows,
        }
    }
}

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
        self.check_cache(cache)?;
        let c = self.config();
        let n = batch.len();
        let mut positions = Vec::with_capacity(n);
        for t in batch {
            positions.push(cache.seq_len(t.id)?);
        }
        let tokens: Vec<u32> = batch.iter().map(|t| t.token).collect();
        let ids: Vec<RequestId> = batch.iter().map(|t| t.id).collect();
        let mut st = self.begin_step(&tokens, positions)?;
        let layouts = cache.layouts();
        let mut step = cache.begin_step(&ids)?;
        let (mut out, mut lse) = (vec![0f32; n * c.heads * c.head_dim], vec![0f32; n * c.heads]);
        for l in 0..c.layers {
            self.project_layer(&mut st, l, layouts)?;
            if self.tensor_layers {
                self.layer_through_tensors(&mut step, l, &st.inputs(), (&mut out, &mut lse))?;
            } else {
                step.layer(l, &st.inputs(), &mut out, &mut lse)?;
            }
            if let Some(obs) = observe.as_deref_mut() {
                let view = step.view()?;
                obs(l, &view)?;
            }
            self.after_attention(&mut st, l, &out)?;
        }
        let metrics = step.end()?;
        let logits = self.logits(&st)?;
        Ok(DecodeOut { logits, metrics })
    }

    /// Refuses a cache whose geometry is not this model's.
    pub(crate) fn check_cache<B: Backend>(&self, cache: &KvCache<B>) -> Result<()>
    where
        B::Memory: Clone,
    {
        let c = self.config();
        let kvd = c.kv_heads * c.head_dim;
        let (kv_row, key) = cache.layouts();
        if kv_row.row_dims() != 2 * kvd || key.dim() != kvd || cache.config().geometry.layers != c.layers {
            return Err(ModelError::invalid(
                "cache",
                &cache.config().geometry.name,
                "its geometry is not this model's",
            ));
        }
        Ok(())
    }

    /// A step of `tokens` at `positions`: their embeddings, the oracle's head weights.
    pub(crate) fn begin_step(&self, tokens: &[u32], positions: Vec<usize>) -> Result<StepState> {
        for &p in &positions {
            self.check_position(p)?;
        }
        let c = self.config();
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        Ok(StepState {
            x: self.embed(tokens)?,
            weights: vec![scale; tokens.len() * c.heads],
            positions,
            ..StepState::default()
        })
    }

    /// Layer `l`'s projections of the step's residual stream into its inputs for the cache
    /// (rows and keys in the cache's `layouts`).
    pub(crate) fn project_layer(
        &self,
        st: &mut StepState,
        l: usize,
        (kv_row, key): (KvRowLayout, IndexKeyLayout),
    ) -> Result<()> {
        let c = self.config();
        let b = self.weights.blocks.get(l).ok_or_else(|| ModelError::invalid("layer", l, "past the model's layers"))?;
        let n = st.positions.len();
        let (hd, heads, kvh) = (c.head_dim, c.heads, c.kv_heads);
        let (kvd, group) = (kvh * hd, heads / kvh);
        let h = rms_norm(&st.x, &b.attn_norm, c.rms_eps);
        let (mut q, mut k, v) = (matmul(&b.wq, &h, n)?, matmul(&b.wk, &h, n)?, matmul(&b.wv, &h, n)?);
        st.rows.clear();
        st.rows.resize(n * kv_row.row_bytes(), 0);
        st.keys.clear();
        st.keys.resize(n * key.row_bytes(), 0);
        st.index_q.clear();
        st.index_q.resize(n * heads * kvd, bf16::ZERO);
        let mut vals = vec![0f32; 2 * kvd];
        let enc = |e: hisparse_engine::MemoryError| ModelError::Engine(e.into());
        for (i, &p) in st.positions.iter().enumerate() {
            self.rope.apply(&mut q[i * heads * hd..][..heads * hd], p);
            self.rope.apply(&mut k[i * kvd..][..kvd], p);
            vals[..kvd].copy_from_slice(&k[i * kvd..][..kvd]);
            vals[kvd..].copy_from_slice(&v[i * kvd..][..kvd]);
            kv_row.encode(&vals, &mut st.rows[i * kv_row.row_bytes()..][..kv_row.row_bytes()]).map_err(enc)?;
            key.encode(&k[i * kvd..][..kvd], &mut st.keys[i * key.row_bytes()..][..key.row_bytes()]).map_err(enc)?;
            // The oracle's query of head h: q_h in its group's part of the index key.
            for hh in 0..heads {
                let g = hh / group;
                let dst = &mut st.index_q[(i * heads + hh) * kvd + g * hd..][..hd];
                for (d, s) in dst.iter_mut().zip(&q[(i * heads + hh) * hd..][..hd]) {
                    *d = bf16::from_f32(*s);
                }
            }
        }
        st.attn_q.clear();
        st.attn_q.extend(q.iter().map(|v| bf16::from_f32(*v)));
        Ok(())
    }

    /// What follows layer `l`'s attention output `out` (`[n, heads, head_dim]`): the output
    /// projection into the residual stream, then the MLP.
    pub(crate) fn after_attention(&self, st: &mut StepState, l: usize, out: &[f32]) -> Result<()> {
        let b = self.weights.blocks.get(l).ok_or_else(|| ModelError::invalid("layer", l, "past the model's layers"))?;
        let n = st.positions.len();
        let o = matmul(&b.wo, out, n)?;
        st.x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        self.mlp(b, &mut st.x, n)
    }

    /// The step's logits, `[n, vocab]`.
    pub(crate) fn logits(&self, st: &StepState) -> Result<Vec<f32>> {
        let c = self.config();
        matmul(&self.weights.output, &rms_norm(&st.x, &self.weights.norm, c.rms_eps), st.positions.len())
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
