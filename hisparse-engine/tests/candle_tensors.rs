//! `DecodeStep::layer_tensors` (feature `candle`): a layer's inputs as candle tensors give the
//! slice path's outputs bit for bit, strided views included; wrong dtypes, devices and batch
//! sizes are refused by the field's name and leave the step usable.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use candle_core::{DType, Device, Tensor};
use half::bf16;
use hisparse_engine::{
    CacheConfig, CpuBackend, KvCache, KvGeometry, LayerInputs, Mode, Prompt, RequestId, Rows, TensorInputs,
};

fn cache(g: &KvGeometry) -> KvCache<CpuBackend> {
    let mut cfg = CacheConfig::new(g.clone(), Mode::HiSparse, 32 << 20);
    cfg.hisparse.device_buffer_size = 300;
    cfg.hisparse.max_request_tokens = 1024;
    KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
}

/// Random bytes that encode valid rows: each row written by the layout from random values.
fn rows(n: usize, bytes: usize, d: usize, enc: &dyn Fn(&[f32], &mut [u8])) -> Vec<u8> {
    let x = Tensor::randn(0f32, 1.0, (n, d), &Device::Cpu).unwrap().to_vec2::<f32>().unwrap();
    let mut out = vec![0u8; n * bytes];
    for (r, o) in x.iter().zip(out.chunks_exact_mut(bytes)) {
        enc(r, o);
    }
    out
}

#[test]
fn tensors_equal_slices_and_bad_tensors_are_named() {
    let g = KvGeometry::preset("cpu-small").unwrap();
    let (mut a, mut b) = (cache(&g), cache(&g));
    let (kv, key) = a.layouts();
    let enc_kv = |r: &[f32], o: &mut [u8]| kv.encode(r, o).unwrap();
    let enc_key = |r: &[f32], o: &mut [u8]| key.encode(r, o).unwrap();
    let ids = [RequestId(0), RequestId(1)];
    for (&id, len) in ids.iter().zip([300usize, 600]) {
        let kvs: Vec<Vec<u8>> = (0..g.layers).map(|_| rows(len, kv.row_bytes(), g.d_qk(), &enc_kv)).collect();
        let keys: Vec<Vec<u8>> =
            g.full_layers().into_iter().map(|_| rows(len, key.row_bytes(), g.index_dim, &enc_key)).collect();
        let p = Prompt {
            tokens: len,
            kv_rows: kvs.iter().map(|r| Rows::Host(r)).collect(),
            index_keys: keys.iter().map(|k| Rows::Host(k)).collect(),
        };
        a.admit(id, &p, len + 8).unwrap();
        b.admit(id, &p, len + 8).unwrap();
    }
    let n = ids.len();
    let cpu = Device::Cpu;
    for _ in 0..3 {
        let (mut sa, mut sb) = (a.begin_step(&ids).unwrap(), b.begin_step(&ids).unwrap());
        for l in 0..g.layers {
            // Queries made transposed, so the tensor is a strided view (copied on the way in).
            let q = Tensor::randn(0f32, 1.0, (g.q_heads, n, g.d_qk()), &cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let q = q.transpose(0, 1).unwrap();
            assert!(!q.is_contiguous());
            let r = Tensor::from_vec(rows(n, kv.row_bytes(), g.d_qk(), &enc_kv), (n, kv.row_bytes()), &cpu).unwrap();
            let iq =
                Tensor::randn(0f32, 1.0, (n, g.index_heads, g.index_dim), &cpu).unwrap().to_dtype(DType::BF16).unwrap();
            let iw = Tensor::rand(0.1f32, 1.0, (n, g.index_heads), &cpu).unwrap();
            let ik =
                Tensor::from_vec(rows(n, key.row_bytes(), g.index_dim, &enc_key), (n, key.row_bytes()), &cpu).unwrap();
            let full = g.is_full(l);
            let t = TensorInputs {
                index_queries: full.then_some(&iq),
                index_weights: full.then_some(&iw),
                new_index_keys: full.then_some(&ik),
                attention_queries: &q,
                new_kv_rows: &r,
            };
            if l == 0 {
                // Refused by name, the step still usable afterwards.
                let f32q = q.to_dtype(DType::F32).unwrap();
                let short = r.narrow(0, 0, 1).unwrap();
                for (bad, field) in [
                    (TensorInputs { attention_queries: &f32q, ..t }, "attention_queries"),
                    (TensorInputs { new_kv_rows: &short, ..t }, "new_kv_rows"),
                ] {
                    let e = sa.layer_tensors(l, &bad).err().unwrap().to_string();
                    assert!(e.contains(field), "{e}");
                }
            }
            let got = sa.layer_tensors(l, &t).unwrap();
            let v = |x: &Tensor| x.flatten_all().unwrap();
            let (qv, rv) = (v(&q).to_vec1::<bf16>().unwrap(), v(&r).to_vec1::<u8>().unwrap());
            let (iqv, iwv, ikv) =
                (v(&iq).to_vec1::<bf16>().unwrap(), v(&iw).to_vec1::<f32>().unwrap(), v(&ik).to_vec1::<u8>().unwrap());
            let s = LayerInputs {
                index_queries: full.then_some(&iqv),
                index_weights: full.then_some(&iwv),
                new_index_keys: full.then_some(&ikv),
                attention_queries: &qv,
                new_kv_rows: &rv,
            };
            let (mut out, mut lse) = (vec![0f32; n * g.q_heads * g.d_v()], vec![0f32; n * g.q_heads]);
            sb.layer(l, &s, &mut out, &mut lse).unwrap();
            assert_eq!(got.out.dims(), &[n, g.q_heads, g.d_v()]);
            assert_eq!(v(&got.out).to_vec1::<f32>().unwrap(), out, "layer {l}");
            assert_eq!(v(&got.lse).to_vec1::<f32>().unwrap(), lse, "layer {l}");
            assert!(out.iter().any(|&x| x != 0.0));
        }
        let (ma, mb) = (sa.end().unwrap(), sb.end().unwrap());
        assert_eq!((ma.swap.hits, ma.swap.misses), (mb.swap.hits, mb.swap.misses));
        assert!(ma.swap.misses > 0);
    }
}
