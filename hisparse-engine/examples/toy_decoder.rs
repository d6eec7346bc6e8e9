//! A toy decoder loop that drives the KV hierarchy from outside, as another inference engine
//! would from its attention layer: the "model" (random projections here) owns every query, KV
//! row and index key; the cache owns the tiers. Every attention output is checked against dense
//! attention computed by the model from its own copy of the rows: over the full cache while a
//! request is shorter than top-k (it selects every position), over the selected positions after.
//!
//! Run: `cargo run -p hisparse-engine --example toy_decoder` (CI runs it; it exits non-zero on a
//! mismatch).
#![allow(clippy::print_stdout)]

use std::error::Error;

use half::bf16;
use hisparse_engine::{
    Admission, BuiltinPrefetcher, CacheConfig, CpuBackend, Eviction, KvCache, KvGeometry, LayerInputs, Mode, Prefetch,
    Prompt, RequestId, Rows, dense_attention,
};

/// SplitMix64: the toy model's random projections.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0 // uniform in [-1, 1)
    }

    fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// One request as the model sees it: every KV row it produced, decoded as stored.
struct Sequence {
    id: RequestId,
    rows: Vec<Vec<f32>>, // per layer, [positions, d_qk]
}

fn main() -> Result<(), Box<dyn Error>> {
    let g = KvGeometry::preset("cpu-small")?; // 4 layers, 16 heads, top-k 256, fp8 rows
    let mut cfg = CacheConfig::new(g.clone(), Mode::HiSparse, 32 << 20);
    cfg.hisparse.device_buffer_size = 384; // small: long requests miss and evict
    cfg.hisparse.max_request_tokens = 2048;
    // The caller picks the policy and the prefetcher (any `EvictionPolicy` / `Prefetcher`; the
    // built-ins here), made once.
    let policy = Eviction::Lru.make_online()?;
    let prefetcher = Prefetch::from(BuiltinPrefetcher::AdjacentLayer).make();
    let mut cache = KvCache::new(CpuBackend::new(), cfg, policy, prefetcher)?;
    let (kv_row, key) = cache.layouts();
    let (rb, kb, d_qk, d_v) = (kv_row.row_bytes(), key.row_bytes(), g.d_qk(), g.d_v());
    let mut rng = Rng(7);
    // `n` new KV rows, encoded for the cache; the model keeps them decoded as stored.
    let encode_rows = |rng: &mut Rng, n: usize, seq: &mut Vec<f32>| -> Result<Vec<u8>, Box<dyn Error>> {
        let mut bytes = vec![0u8; n * rb];
        let mut decoded = vec![0f32; d_qk];
        for row in bytes.chunks_exact_mut(rb) {
            kv_row.encode(&rng.fill(d_qk), row)?;
            kv_row.decode(row, &mut decoded)?;
            seq.extend_from_slice(&decoded);
        }
        Ok(bytes)
    };

    // Prefill: a short request (under top-k: dense over the full cache) and two long ones.
    let mut seqs = Vec::new();
    for (i, prompt_len) in [120usize, 700, 1000].into_iter().enumerate() {
        let id = RequestId(i as u64);
        let mut seq = Sequence { id, rows: vec![Vec::new(); g.layers] };
        let mut kv = Vec::new();
        for l in 0..g.layers {
            kv.push(encode_rows(&mut rng, prompt_len, &mut seq.rows[l])?);
        }
        let mut keys = Vec::new();
        let mut krng = Rng(100 + i as u64);
        for _ in g.full_layers() {
            let mut k = vec![0u8; prompt_len * kb];
            for row in k.chunks_exact_mut(kb) {
                key.encode(&krng.fill(g.index_dim), row)?;
            }
            keys.push(k);
        }
        let prompt = Prompt {
            tokens: prompt_len,
            kv_rows: kv.iter().map(|r| Rows::Host(r)).collect(),
            index_keys: keys.iter().map(|k| Rows::Host(k)).collect(),
        };
        match cache.admit(id, &prompt, prompt_len + 200)? {
            Admission::Admitted => seqs.push(seq),
            other => return Err(format!("request {i} was not admitted: {other:?}").into()),
        }
    }

    // Decode: every step, every layer hands the cache this token's tensors.
    let (steps, n) = (24, seqs.len());
    let batch: Vec<RequestId> = seqs.iter().map(|s| s.id).collect();
    let (mut worst, mut checked, mut full_cache) = (0f32, 0usize, 0usize);
    let mut totals = (0u64, 0u64, 0u64);
    for _ in 0..steps {
        let mut step = cache.begin_step(&batch)?;
        for l in 0..g.layers {
            let attention_queries: Vec<bf16> = rng.fill(n * g.q_heads * d_qk).into_iter().map(bf16::from_f32).collect();
            let mut new_rows = Vec::new();
            for s in &mut seqs {
                new_rows.extend(encode_rows(&mut rng, 1, &mut s.rows[l])?);
            }
            let full = g.is_full(l);
            let index_queries: Vec<bf16> =
                rng.fill(n * g.index_heads * g.index_dim).into_iter().map(bf16::from_f32).collect();
            let index_weights: Vec<f32> = rng.fill(n * g.index_heads).iter().map(|x| x.abs() + 0.1).collect();
            let mut new_keys = vec![0u8; n * kb];
            for row in new_keys.chunks_exact_mut(kb) {
                key.encode(&rng.fill(g.index_dim), row)?;
            }
            let inputs = LayerInputs {
                index_queries: full.then_some(&index_queries),
                index_weights: full.then_some(&index_weights),
                new_index_keys: full.then_some(&new_keys),
                attention_queries: &attention_queries,
                new_kv_rows: &new_rows,
            };
            let (mut out, mut lse) = (vec![0f32; n * g.q_heads * d_v], vec![0f32; n * g.q_heads]);
            step.layer(l, &inputs, &mut out, &mut lse)?;

            // The model's own check: dense attention over the rows the cache was asked to attend.
            let view = step.view()?;
            for (i, s) in seqs.iter().enumerate() {
                let sel = &view.selections[view.spans[i].offset..view.spans[i].end()];
                let positions = s.rows[l].len() / d_qk;
                if sel.len() == positions {
                    full_cache += 1;
                }
                let rows: Vec<f32> = sel
                    .iter()
                    .flat_map(|&p| s.rows[l][p as usize * d_qk..(p as usize + 1) * d_qk].iter().copied())
                    .collect();
                let per_q = g.q_heads * d_qk;
                let q: Vec<f32> = attention_queries[i * per_q..(i + 1) * per_q].iter().map(|x| x.to_f32()).collect();
                let (o, e) = dense_attention(&q, &rows, g.q_heads, d_qk, d_v, g.default_softmax_scale());
                let got_o = &out[i * g.q_heads * d_v..(i + 1) * g.q_heads * d_v];
                let got_e = &lse[i * g.q_heads..(i + 1) * g.q_heads];
                for (a, b) in got_o.iter().zip(&o).chain(got_e.iter().zip(&e)) {
                    worst = worst.max((a - b).abs());
                }
                checked += 1;
            }
        }
        let m = step.end()?;
        totals = (totals.0 + m.swap.hits, totals.1 + m.swap.misses, totals.2 + m.swap.prefetched);
    }
    for s in &seqs {
        cache.free(s.id)?;
    }
    cache.check()?;
    println!(
        "{checked} attention outputs checked against dense attention ({full_cache} over the full cache): \
         largest difference {worst:.2e}; hits {}, misses {}, prefetched {}",
        totals.0, totals.1, totals.2
    );
    if worst > 1e-4 || totals.1 == 0 || full_cache < steps * g.layers {
        return Err(format!("mismatch: largest difference {worst:e}, misses {}", totals.1).into());
    }
    Ok(())
}
