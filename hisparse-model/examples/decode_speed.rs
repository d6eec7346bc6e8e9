//! Decode speed of a real model through the cache: one prompt of `--context` tokens of real text
//! prefilled once and admitted as `--batch` requests, then `--steps` decode steps (the text's
//! next tokens fed to every request), timed per step after `--warmup`, for dense, sparse
//! resident and hisparse attention. Prints per kind the median step with min and max and the
//! tokens/s, and what attention reads per token (bytes of rows and index keys).
//!
//! Run: `cargo run --release -p hisparse-model --example decode_speed -- TEXT CONTEXT TOP_K BATCHES` (batches
//! comma-separated, e.g. `1,8`).
#![allow(clippy::print_stdout, clippy::unwrap_used)] // an example: a failure is its report

use std::time::Instant;

use hisparse_engine::{BuiltinPolicy, CpuBackend, KvCache, KvRowFormat, RequestId};
use hisparse_model::{AttentionKind, Llama, StepToken, cache_config, fetch};

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let text = std::fs::read_to_string(&a[0]).unwrap();
    let (context, top_k): (usize, usize) = (a[1].parse().unwrap(), a[2].parse().unwrap());
    let batches: Vec<usize> = a[3].split(',').map(|b| b.parse().unwrap()).collect();
    let (warmup, steps) = (3usize, 12usize);
    let m = Llama::load(&fetch::smollm2(&mut |s| println!("{s}")).unwrap()).unwrap();
    let ids = m.tokenizer.encode(&text).unwrap();
    let need = context + warmup + steps + 1;
    assert!(ids.len() >= need, "{} tokens of text", ids.len());
    let c = m.config();
    let g = c.geometry(top_k, KvRowFormat::Bf16).unwrap();
    let (kv, key) = (g.kv_row().unwrap(), g.index_key().unwrap());
    let t = Instant::now();
    let p = m.prefill(&ids[..context], kv, key).unwrap();
    println!("prefill of {context} tokens: {:.1} s", t.elapsed().as_secs_f64());
    for batch in batches {
        for kind in [AttentionKind::Dense, AttentionKind::SparseResident, AttentionKind::HiSparse] {
            let mut cfg = cache_config(c, kind, top_k, 2 * top_k, need, KvRowFormat::Bf16, batch).unwrap();
            cfg.hisparse.eviction = BuiltinPolicy::Lru.into();
            let mut cache = KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap();
            let rids: Vec<RequestId> = (0..batch as u64).map(RequestId).collect();
            for &id in &rids {
                m.admit(&mut cache, id, &p, need).unwrap();
            }
            let mut times = Vec::new();
            for s in 0..warmup + steps {
                let b: Vec<StepToken> = rids.iter().map(|&id| StepToken { id, token: ids[context + s] }).collect();
                let t = Instant::now();
                m.decode_step(&mut cache, &b).unwrap();
                if s >= warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            times.sort_by(f64::total_cmp);
            let med = times[times.len() / 2];
            // Bytes attention reads per token and layer-sum: rows attended, plus the oracle's keys.
            let attended = if kind == AttentionKind::Dense { context } else { top_k };
            let rows = attended as u64 * kv.row_bytes() as u64 * c.layers as u64;
            let keys = if kind == AttentionKind::Dense {
                0
            } else {
                context as u64 * key.row_bytes() as u64 * c.layers as u64
            };
            println!(
                "{:<16} batch {batch} context {context} top-k {top_k}: step {:.1} ms [{:.1}-{:.1}] = {:.1} tokens/s; attention reads {:.1} MB rows + {:.1} MB keys per token",
                kind.name(),
                1e3 * med,
                1e3 * times[0],
                1e3 * times[times.len() - 1],
                batch as f64 / med,
                rows as f64 / 1e6,
                keys as f64 / 1e6
            );
        }
    }
}
