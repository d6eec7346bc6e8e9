//! A model written with candle tensors driving the KV hierarchy (feature `candle`): each layer
//! projects its hidden states with candle matmuls into the attention queries, the indexer's
//! queries and weights, the new token's KV row and index key, hands them to
//! `DecodeStep::layer_tensors` and projects the attention output it gets back into the next
//! layer's hidden states. A twin cache fed the same inputs through `DecodeStep::layer` (plain
//! slices) must give the same outputs bit for bit, every layer of every step; the example exits
//! non-zero otherwise.
//!
//! Run: `cargo run -p hisparse-engine --features candle --example candle_attention` (CI runs it).
#![allow(clippy::print_stdout)]

use std::error::Error;

use candle_core::{DType, Device, Tensor};
use half::bf16;
use hisparse_engine::{
    Admission, CacheConfig, CpuBackend, KvCache, KvGeometry, LayerInputs, Mode, Prompt, RequestId, Rows, TensorInputs,
};

const HIDDEN: usize = 64;

/// Encodes one row of values into its bytes.
type Encoder<'a> = &'a dyn Fn(&[f32], &mut [u8]) -> Result<(), Box<dyn Error>>;

/// The layer's weights, random: hidden → queries, KV row, indexer queries, weights, key; and the
/// attention output back to hidden.
struct Layer {
    wq: Tensor,
    wkv: Tensor,
    wiq: Tensor,
    wiw: Tensor,
    wik: Tensor,
    wo: Tensor,
}

fn random(rows: usize, cols: usize, dev: &Device) -> candle_core::Result<Tensor> {
    Tensor::randn(0f32, 1.0 / (rows as f32).sqrt(), (rows, cols), dev)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dev = Device::Cpu;
    let g = KvGeometry::preset("cpu-small")?; // 4 layers, 16 heads, top-k 256, fp8 rows
    let make = || -> Result<KvCache<CpuBackend>, Box<dyn Error>> {
        let mut cfg = CacheConfig::new(g.clone(), Mode::HiSparse, 32 << 20);
        cfg.hisparse.device_buffer_size = 384; // small: the long prompt misses and evicts
        cfg.hisparse.max_request_tokens = 2048;
        Ok(KvCache::with_named_policies(CpuBackend::new(), cfg)?)
    };
    let (mut cache, mut twin) = (make()?, make()?);
    let (kv_row, key) = cache.layouts();
    let layers: Vec<Layer> = (0..g.layers)
        .map(|_| {
            Ok(Layer {
                wq: random(HIDDEN, g.q_heads * g.d_qk(), &dev)?,
                wkv: random(HIDDEN, g.d_qk(), &dev)?,
                wiq: random(HIDDEN, g.index_heads * g.index_dim, &dev)?,
                wiw: random(HIDDEN, g.index_heads, &dev)?,
                wik: random(HIDDEN, g.index_dim, &dev)?,
                wo: random(g.q_heads * g.d_v(), HIDDEN, &dev)?,
            })
        })
        .collect::<candle_core::Result<_>>()?;
    // `x`'s rows encoded by `f` into `bytes` bytes each, as a u8 tensor `[n, bytes]`.
    let encode = |x: &Tensor, bytes: usize, f: Encoder<'_>| {
        let rows = x.to_vec2::<f32>()?;
        let mut out = vec![0u8; rows.len() * bytes];
        for (r, o) in rows.iter().zip(out.chunks_exact_mut(bytes)) {
            f(r, o)?;
        }
        Ok::<_, Box<dyn Error>>(Tensor::from_vec(out, (rows.len(), bytes), &dev)?)
    };
    let kv_bytes = |x: &Tensor| encode(x, kv_row.row_bytes(), &|r, o| Ok(kv_row.encode(r, o)?));
    let key_bytes = |x: &Tensor| encode(x, key.row_bytes(), &|r, o| Ok(key.encode(r, o)?));

    // Two requests: 200 and 900 prompt tokens, their rows made by the same projections.
    let ids = [RequestId(0), RequestId(1)];
    for (&id, len) in ids.iter().zip([200usize, 900]) {
        let x = Tensor::randn(0f32, 1.0, (len, HIDDEN), &dev)?;
        let kv: Vec<Vec<u8>> = layers
            .iter()
            .map(|w| Ok(kv_bytes(&x.matmul(&w.wkv)?)?.flatten_all()?.to_vec1::<u8>()?))
            .collect::<Result<_, Box<dyn Error>>>()?;
        let keys: Vec<Vec<u8>> = g
            .full_layers()
            .into_iter()
            .map(|l| Ok(key_bytes(&x.matmul(&layers[l].wik)?)?.flatten_all()?.to_vec1::<u8>()?))
            .collect::<Result<_, Box<dyn Error>>>()?;
        let prompt = Prompt {
            tokens: len,
            kv_rows: kv.iter().map(|r| Rows::Host(r)).collect(),
            index_keys: keys.iter().map(|k| Rows::Host(k)).collect(),
        };
        for c in [&mut cache, &mut twin] {
            match c.admit(id, &prompt, len + 64)? {
                Admission::Admitted => {}
                other => return Err(format!("request {id:?} was not admitted: {other:?}").into()),
            }
        }
    }

    let (n, steps) = (ids.len(), 16);
    let mut x = Tensor::randn(0f32, 1.0, (n, HIDDEN), &dev)?;
    let mut checked = 0;
    for _ in 0..steps {
        let mut step = cache.begin_step(&ids)?;
        let mut twin_step = twin.begin_step(&ids)?;
        for (l, w) in layers.iter().enumerate() {
            let q = x.matmul(&w.wq)?.reshape((n, g.q_heads, g.d_qk()))?.to_dtype(DType::BF16)?;
            let rows = kv_bytes(&x.matmul(&w.wkv)?)?;
            let full = g.is_full(l);
            let iq = x.matmul(&w.wiq)?.reshape((n, g.index_heads, g.index_dim))?.to_dtype(DType::BF16)?;
            let iw = x.matmul(&w.wiw)?.abs()?;
            let ik = key_bytes(&x.matmul(&w.wik)?)?;
            let inputs = TensorInputs {
                index_queries: full.then_some(&iq),
                index_weights: full.then_some(&iw),
                new_index_keys: full.then_some(&ik),
                attention_queries: &q,
                new_kv_rows: &rows,
            };
            let got = step.layer_tensors(l, &inputs)?;

            // The twin: the same inputs as plain slices.
            let (qv, rv) = (q.flatten_all()?.to_vec1::<bf16>()?, rows.flatten_all()?.to_vec1::<u8>()?);
            let (iqv, iwv) = (iq.flatten_all()?.to_vec1::<bf16>()?, iw.flatten_all()?.to_vec1::<f32>()?);
            let ikv = ik.flatten_all()?.to_vec1::<u8>()?;
            let slices = LayerInputs {
                index_queries: full.then_some(&iqv),
                index_weights: full.then_some(&iwv),
                new_index_keys: full.then_some(&ikv),
                attention_queries: &qv,
                new_kv_rows: &rv,
            };
            let (mut out, mut lse) = (vec![0f32; n * g.q_heads * g.d_v()], vec![0f32; n * g.q_heads]);
            twin_step.layer(l, &slices, &mut out, &mut lse)?;
            if got.out.flatten_all()?.to_vec1::<f32>()? != out || got.lse.flatten_all()?.to_vec1::<f32>()? != lse {
                return Err(format!("layer {l}: the tensor path differs from the slice path").into());
            }
            checked += 1;
            // The attention output, back through candle, is the next layer's input.
            x = (x + got.out.reshape((n, g.q_heads * g.d_v()))?.matmul(&w.wo)?)?;
        }
        step.end()?;
        twin_step.end()?;
    }
    let m = cache.host_bytes_in_use();
    for &id in &ids {
        cache.free(id)?;
        twin.free(id)?;
    }
    cache.check()?;
    println!("{checked} layers through candle tensors, each equal bit for bit to the slice path ({m} host bytes held)");
    Ok(())
}
