//! `DecodeStep::layer_tensors` with candle's CUDA tensors (feature `candle-cuda`): the CUDA
//! backend on candle's own stream, a layer's inputs made by candle on the GPU, and the outputs
//! equal bit for bit to a twin CUDA cache fed the same bytes as plain CUDA slices.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use hisparse_engine::{CacheConfig, KvCache, KvGeometry, LayerInputs, Mode, Prompt, RequestId, Rows, TensorInputs};
use hisparse_kernels::cuda::{CudaBackend, CudaDevice};

#[test]
#[ignore = "needs a CUDA GPU"]
fn candle_cuda_tensors_equal_the_slice_path_on_candles_stream() {
    let dev = Device::new_cuda(0).expect("candle's CUDA device 0");
    let Device::Cuda(cd) = &dev else { unreachable!("new_cuda gives a CUDA device") };
    let g = KvGeometry::preset("cpu-small").expect("preset");
    let make = || {
        let backend =
            CudaBackend::on(Arc::new(CudaDevice::on_stream(cd.cuda_stream()).expect("device"))).expect("backend");
        let mut cfg = CacheConfig::new(g.clone(), Mode::HiSparse, 64 << 20);
        cfg.hisparse.device_buffer_size = 300;
        cfg.hisparse.max_request_tokens = 1024;
        KvCache::with_named_policies(backend, cfg).expect("cache")
    };
    let (mut a, mut b) = (make(), make());
    let (kv, key) = a.layouts();
    let rows = |n: usize, bytes: usize, d: usize, enc: &dyn Fn(&[f32], &mut [u8])| {
        let x = Tensor::randn(0f32, 1.0, (n, d), &Device::Cpu).and_then(|t| t.to_vec2::<f32>()).expect("randn");
        let mut out = vec![0u8; n * bytes];
        for (r, o) in x.iter().zip(out.chunks_exact_mut(bytes)) {
            enc(r, o);
        }
        out
    };
    let enc_kv = |r: &[f32], o: &mut [u8]| kv.encode(r, o).expect("row");
    let enc_key = |r: &[f32], o: &mut [u8]| key.encode(r, o).expect("key");
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
        a.admit(id, &p, len + 8).expect("admit a");
        b.admit(id, &p, len + 8).expect("admit b");
    }
    let n = ids.len();
    let stream = cd.cuda_stream();
    for _ in 0..3 {
        let (mut sa, mut sb) = (a.begin_step(&ids).expect("step"), b.begin_step(&ids).expect("step"));
        for l in 0..g.layers {
            let q = Tensor::randn(0f32, 1.0, (n, g.q_heads, g.d_qk()), &dev)
                .and_then(|t| t.to_dtype(DType::BF16))
                .expect("q");
            let r =
                Tensor::from_vec(rows(n, kv.row_bytes(), g.d_qk(), &enc_kv), (n, kv.row_bytes()), &dev).expect("rows");
            let iq = Tensor::randn(0f32, 1.0, (n, g.index_heads, g.index_dim), &dev)
                .and_then(|t| t.to_dtype(DType::BF16))
                .expect("iq");
            let iw = Tensor::rand(0.1f32, 1.0, (n, g.index_heads), &dev).expect("iw");
            let ik = Tensor::from_vec(rows(n, key.row_bytes(), g.index_dim, &enc_key), (n, key.row_bytes()), &dev)
                .expect("ik");
            let full = g.is_full(l);
            let t = TensorInputs {
                index_queries: full.then_some(&iq),
                index_weights: full.then_some(&iw),
                new_index_keys: full.then_some(&ik),
                attention_queries: &q,
                new_kv_rows: &r,
            };
            let got = sa.layer_tensors(l, &t).expect("tensor layer");
            // The twin: the same bytes uploaded as plain slices on the same stream.
            let up = |x: &Tensor| x.flatten_all().expect("flat");
            let (qv, rv) = (
                stream.clone_htod(&up(&q).to_vec1::<half::bf16>().expect("q")).expect("up"),
                stream.clone_htod(&up(&r).to_vec1::<u8>().expect("r")).expect("up"),
            );
            let (iqv, iwv, ikv) = (
                stream.clone_htod(&up(&iq).to_vec1::<half::bf16>().expect("iq")).expect("up"),
                stream.clone_htod(&up(&iw).to_vec1::<f32>().expect("iw")).expect("up"),
                stream.clone_htod(&up(&ik).to_vec1::<u8>().expect("ik")).expect("up"),
            );
            let s = LayerInputs {
                index_queries: full.then_some(&iqv),
                index_weights: full.then_some(&iwv),
                new_index_keys: full.then_some(&ikv),
                attention_queries: &qv,
                new_kv_rows: &rv,
            };
            let mut out = stream.alloc_zeros::<f32>(n * g.q_heads * g.d_v()).expect("out");
            let mut lse = stream.alloc_zeros::<f32>(n * g.q_heads).expect("lse");
            sb.layer(l, &s, &mut out, &mut lse).expect("slice layer");
            let host =
                |x: &candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>| stream.clone_dtoh(x).expect("down");
            assert_eq!(up(&got.out).to_vec1::<f32>().expect("out"), host(&out), "layer {l}");
            assert_eq!(up(&got.lse).to_vec1::<f32>().expect("lse"), host(&lse), "layer {l}");
        }
        let (ma, mb) = (sa.end().expect("end"), sb.end().expect("end"));
        assert_eq!((ma.swap.hits, ma.swap.misses), (mb.swap.hits, mb.swap.misses));
    }
}
