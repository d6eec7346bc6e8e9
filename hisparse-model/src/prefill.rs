//! Prefill: a prompt through the model at once, attention dense and causal over the keys and
//! values as the cache stores them (encoded, then decoded), so that decoding later reads exactly
//! the rows the prompt's attention read. Its KV rows and index keys go into a cache with
//! [`Llama::admit`].

use candle_core::{D, Device, Tensor};
use hisparse_engine::{Admission, Backend, IndexKeyLayout, KvCache, KvRowLayout, Prompt, RequestId, Rows};

use crate::error::{ModelError, Result};
use crate::math::{matmul, matmul_f32, rms_norm, silu};

/// A matmul of `rows` rows through a weight.
type MatMul = fn(&crate::projection::Projection, &[f32], usize) -> Result<Vec<f32>>;
use crate::model::Llama;

/// Query positions whose attention one matmul computes (bounds the score matrix).
const CHUNK: usize = 512;

/// Prompts of at least this many tokens multiply by the dequantized weights.
const PROMPT_GEMM_ROWS: usize = 64;

/// A prompt's rows for a cache, and the logits of its last position.
pub struct PrefillOut {
    /// Prompt tokens.
    pub tokens: usize,
    /// Per layer, the prompt's KV rows in the cache's layout.
    pub kv_rows: Vec<Vec<u8>>,
    /// Per layer, the prompt's index keys (the keys, as the oracle reads them).
    pub index_keys: Vec<Vec<u8>>,
    /// Logits of the last position (`[vocab]`).
    pub logits: Vec<f32>,
}

impl Llama {
    /// Runs `tokens` through the model for a cache whose rows are `kv_row` and keys `key`.
    pub fn prefill(&self, tokens: &[u32], kv_row: KvRowLayout, key: IndexKeyLayout) -> Result<PrefillOut> {
        let mut outs = self.prefill_keyed(tokens, kv_row, &[key])?;
        // One layout in, one prefill out.
        Ok(outs.remove(0))
    }

    /// [`Llama::prefill`] once for several key layouts: one [`PrefillOut`] per layout of
    /// `keys`, in order, each as `prefill` with that layout makes it (the forward pass is the
    /// same; only the keys' encoding differs). `keys` must not be empty.
    pub fn prefill_keyed(
        &self,
        tokens: &[u32],
        kv_row: KvRowLayout,
        keys: &[IndexKeyLayout],
    ) -> Result<Vec<PrefillOut>> {
        if keys.is_empty() {
            return Err(ModelError::invalid("keys", 0, "prefill needs at least one key layout"));
        }
        let c = self.config();
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::invalid("prompt", 0, "needs at least one token"));
        }
        self.check_position(n - 1)?;
        let (hd, heads, kvh) = (c.head_dim, c.heads, c.kv_heads);
        let kvd = kvh * hd;
        if kv_row.row_dims() != 2 * kvd || keys.iter().any(|k| k.dim() != kvd) {
            return Err(ModelError::invalid(
                "kv_row",
                kv_row.row_dims(),
                format!("this model's rows hold {} values", 2 * kvd),
            ));
        }
        // Long prompts through f32 GEMMs of the dequantized weights; short ones (and decoding)
        // through the quantized kernel.
        let mm = if n >= PROMPT_GEMM_ROWS { matmul_f32 } else { matmul };
        let mut x = self.embed(tokens)?;
        let mut all_rows = Vec::with_capacity(c.layers);
        let mut all_keys: Vec<Vec<Vec<u8>>> = keys.iter().map(|_| Vec::with_capacity(c.layers)).collect();
        for b in &self.weights.blocks {
            self.check_stop()?;
            let h = rms_norm(&x, &b.attn_norm, c.rms_eps);
            let (mut q, mut k, v) = (mm(&b.wq, &h, n)?, mm(&b.wk, &h, n)?, mm(&b.wv, &h, n)?);
            for t in 0..n {
                self.rope.apply(&mut q[t * heads * hd..][..heads * hd], t);
                self.rope.apply(&mut k[t * kvd..][..kvd], t);
            }
            // The rows as stored, and the keys and values decoded back from them.
            let mut rows = vec![0u8; n * kv_row.row_bytes()];
            let mut layer_keys: Vec<Vec<u8>> = keys.iter().map(|k| vec![0u8; n * k.row_bytes()]).collect();
            let (mut ks, mut vs) = (vec![0f32; n * kvd], vec![0f32; n * kvd]);
            let mut vals = vec![0f32; 2 * kvd];
            for t in 0..n {
                vals[..kvd].copy_from_slice(&k[t * kvd..][..kvd]);
                vals[kvd..].copy_from_slice(&v[t * kvd..][..kvd]);
                let row = &mut rows[t * kv_row.row_bytes()..][..kv_row.row_bytes()];
                kv_row.encode(&vals, row).map_err(|e| ModelError::Engine(e.into()))?;
                for (key, out) in keys.iter().zip(&mut layer_keys) {
                    key.encode(&k[t * kvd..][..kvd], &mut out[t * key.row_bytes()..][..key.row_bytes()])
                        .map_err(|e| ModelError::Engine(e.into()))?;
                }
                kv_row.decode(row, &mut vals).map_err(|e| ModelError::Engine(e.into()))?;
                ks[t * kvd..][..kvd].copy_from_slice(&vals[..kvd]);
                vs[t * kvd..][..kvd].copy_from_slice(&vals[kvd..]);
            }
            let attn = causal_attention(&q, &ks, &vs, n, heads, kvh, hd)?;
            let o = mm(&b.wo, &attn, n)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            self.mlp_with(b, &mut x, n, mm)?;
            all_rows.push(rows);
            for (all, layer) in all_keys.iter_mut().zip(layer_keys) {
                all.push(layer);
            }
        }
        let last = &x[(n - 1) * c.hidden..];
        let mut logits = matmul(&self.weights.output, &rms_norm(last, &self.weights.norm, c.rms_eps), 1)?;
        // Every layout but the last gets a copy of the rows and logits; the last takes them (one
        // layout, `prefill`'s case, copies nothing).
        let mut outs: Vec<PrefillOut> = Vec::with_capacity(all_keys.len());
        // `keys` is not empty (checked above): there is a last layout.
        let final_layout = all_keys.len() - 1;
        for (i, index_keys) in all_keys.into_iter().enumerate() {
            let (kv_rows, logits) = if i == final_layout {
                (std::mem::take(&mut all_rows), std::mem::take(&mut logits))
            } else {
                (all_rows.clone(), logits.clone())
            };
            outs.push(PrefillOut { tokens: n, kv_rows, index_keys, logits });
        }
        Ok(outs)
    }

    /// Admits a prefilled prompt into `cache` as request `id`, reserving room for
    /// `reserve_tokens` in all.
    pub fn admit<B: Backend>(
        &self,
        cache: &mut KvCache<B>,
        id: RequestId,
        p: &PrefillOut,
        reserve_tokens: usize,
    ) -> Result<Admission>
    where
        B::Memory: Clone,
    {
        let prompt = Prompt {
            tokens: p.tokens,
            kv_rows: p.kv_rows.iter().map(|r| Rows::Host(r)).collect(),
            index_keys: p.index_keys.iter().map(|k| Rows::Host(k)).collect(),
        };
        Ok(cache.admit(id, &prompt, reserve_tokens)?)
    }

    /// Embedding rows of `tokens` (`[n, hidden]`).
    pub(crate) fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (h, vocab) = (self.config().hidden, self.config().vocab);
        let mut x = Vec::with_capacity(tokens.len() * h);
        for &t in tokens {
            let t = t as usize;
            if t >= vocab {
                return Err(ModelError::invalid("token", t, format!("the vocabulary has {vocab} tokens")));
            }
            x.extend_from_slice(&self.weights.embed[t * h..][..h]);
        }
        Ok(x)
    }

    /// `x += down(silu(gate(h)) * up(h))` with `h = rms_norm(x)`, for `n` rows.
    pub(crate) fn mlp(&self, b: &crate::weights::BlockWeights, x: &mut [f32], n: usize) -> Result<()> {
        self.mlp_with(b, x, n, matmul)
    }

    fn mlp_with(&self, b: &crate::weights::BlockWeights, x: &mut [f32], n: usize, mm: MatMul) -> Result<()> {
        let h = rms_norm(x, &b.ffn_norm, self.config().rms_eps);
        let (g, u) = (mm(&b.gate, &h, n)?, mm(&b.up, &h, n)?);
        let a: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let d = mm(&b.down, &a, n)?;
        x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// Causal attention of `n` positions: `q` `[n, heads, hd]`, `ks`/`vs` `[n, kv_heads, hd]`;
/// returns `[n, heads, hd]`. Query heads share their group's key and value.
fn causal_attention(
    q: &[f32],
    ks: &[f32],
    vs: &[f32],
    n: usize,
    heads: usize,
    kvh: usize,
    hd: usize,
) -> Result<Vec<f32>> {
    let dev = &Device::Cpu;
    let group = heads / kvh;
    // Per query head, its group's keys and values: [heads, n, hd].
    let per_head = |src: &[f32]| -> Vec<f32> {
        let mut out = vec![0f32; heads * n * hd];
        for h in 0..heads {
            let g = h / group;
            for t in 0..n {
                out[(h * n + t) * hd..][..hd].copy_from_slice(&src[(t * kvh + g) * hd..][..hd]);
            }
        }
        out
    };
    let k = Tensor::from_vec(per_head(ks), (heads, n, hd), dev)?;
    let v = Tensor::from_vec(per_head(vs), (heads, n, hd), dev)?;
    let q = Tensor::from_slice(q, (n, heads, hd), dev)?.transpose(0, 1)?.contiguous()?;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; n * heads * hd];
    for s in (0..n).step_by(CHUNK) {
        let e = (s + CHUNK).min(n);
        let qc = q.narrow(1, s, e - s)?;
        let (kc, vc) = (k.narrow(1, 0, e)?, v.narrow(1, 0, e)?);
        let scores = (qc.matmul(&kc.t()?)? * scale)?;
        let mask: Vec<f32> =
            (s..e).flat_map(|i| (0..e).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY })).collect();
        let scores = scores.broadcast_add(&Tensor::from_vec(mask, (e - s, e), dev)?)?;
        let m = scores.max_keepdim(D::Minus1)?;
        let p = scores.broadcast_sub(&m)?.exp()?;
        let p = p.broadcast_div(&p.sum_keepdim(D::Minus1)?)?;
        // [heads, c, hd] -> [c, heads, hd]
        let o = p.matmul(&vc)?.transpose(0, 1)?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        out[s * heads * hd..e * heads * hd].copy_from_slice(&o);
    }
    Ok(out)
}
