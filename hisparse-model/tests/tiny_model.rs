//! The loader, tokenizer and decode paths on a tiny GGUF file the test writes itself (random
//! weights, a byte-level vocabulary with three merges): the tokenizer's merges and round trip,
//! prefill against decode, hisparse against sparse resident bit for bit for every online policy
//! with buffers that miss and evict (over fp8 and 4-bit index keys, page summaries and top-channel keys), top-k at least the context
//! against dense, and bad input.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{Sink, text_tokens, tiny};
use hisparse_engine::{
    BuiltinPolicy, CpuBackend, IndexKeyFormat, KvCache, KvRowFormat, PolicyChoice, RequestId, StorageFormats,
};
use hisparse_model::tiny::write_tiny_gguf;
use hisparse_model::{AttentionKind, Llama, ModelError, StepToken, cache_config};

fn cache(m: &Llama, kind: AttentionKind, top_k: usize, buffer: usize, policy: BuiltinPolicy) -> KvCache<CpuBackend> {
    let mut cfg = cache_config(m.config(), kind, top_k, buffer, 400, KvRowFormat::Bf16, 2).unwrap();
    cfg.hisparse.eviction = policy.into();
    KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
}

#[test]
fn the_tokenizer_merges_splits_digits_and_round_trips() {
    let (dir, m) = tiny("tok", 1);
    let t = &m.tokenizer;
    let text = "the theory 123 <|im_start|>x\n";
    let ids = t.encode(text).unwrap();
    assert_eq!(t.decode(&ids).unwrap(), text);
    // " the" is one token (the merges Ġ t, h e, Ġt he); "the" at the start is two (t, he).
    let the = t.encode(" the").unwrap();
    assert_eq!(the.len(), 1, "{the:?}");
    assert_eq!(t.encode("the").unwrap().len(), 2);
    // Digits one by one; a control token is one id.
    assert_eq!(t.encode("123").unwrap().len(), 3);
    assert_eq!(t.encode("<|im_start|>").unwrap(), vec![1]);
    assert!(ids.contains(&1) && ids.contains(&the[0]));
    std::fs::remove_dir_all(dir).unwrap();
}

/// One prefill for several key layouts gives, for each, what a prefill with that layout alone
/// gives: the same rows and logits, the keys in its own encoding.
#[test]
fn a_prefill_for_several_key_layouts_is_each_ones_prefill() {
    let (dir, m) = tiny("keyed", 2);
    let ids = text_tokens(&m, 90);
    let c = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru);
    let (kv, fp8) = c.layouts();
    let with = |f| hisparse_engine::IndexKeyLayout::with_format(fp8.dim(), f).unwrap();
    let keys = [fp8, with(IndexKeyFormat::Int4 { group: 16 }), with(IndexKeyFormat::Int2 { group: 16 })];
    let all = m.prefill_keyed(&ids, kv, &keys).unwrap();
    assert_eq!(all.len(), 3);
    for (key, got) in keys.iter().zip(&all) {
        let alone = m.prefill(&ids, kv, *key).unwrap();
        assert_eq!((got.tokens, &got.kv_rows, &got.logits), (alone.tokens, &alone.kv_rows, &alone.logits));
        assert_eq!(got.index_keys, alone.index_keys, "{:?}", key.format());
        assert_eq!(got.index_keys[0].len(), 90 * key.row_bytes());
    }
    assert_ne!(all[1].index_keys, all[2].index_keys, "4-bit and 2-bit keys are encoded apart");
    assert!(m.prefill_keyed(&ids, kv, &[]).is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn projections_loaded_onto_the_cpu_are_the_default_loads() {
    let (dir, m) = tiny("load-on", 3);
    let on = Llama::load_on(&dir.join("tiny.gguf"), &hisparse_model::Device::Cpu).unwrap();
    let b = &on.weights.blocks[1];
    assert!(
        [&b.wq, &b.wk, &b.wv, &b.wo, &b.gate, &b.up, &b.down, &on.weights.output].iter().all(|p| p.device().is_cpu())
    );
    let ids = text_tokens(&m, 40);
    let (kv, key) = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru).layouts();
    let (a, b) = (m.prefill(&ids, kv, key).unwrap(), on.prefill(&ids, kv, key).unwrap());
    assert!(a.logits == b.logits && a.logits.iter().any(|x| *x != 0.0));
    // Where candle is built without CUDA, asking for a CUDA device is an error, not a panic.
    if !candle_core::utils::cuda_is_available() {
        assert!(hisparse_model::Device::new_cuda(0).is_err());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn prefill_and_decode_agree() {
    let (dir, m) = tiny("agree", 2);
    // 60 tokens go through the quantized kernel, 100 through f32 GEMMs of the dequantized
    // weights; the decode step always through the quantized kernel, with bf16 queries.
    for n in [60usize, 100] {
        let ids = text_tokens(&m, n);
        let mut c = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru);
        let (kv, key) = c.layouts();
        let whole = m.prefill(&ids, kv, key).unwrap();
        let head = m.prefill(&ids[..n - 1], kv, key).unwrap();
        m.admit(&mut c, RequestId(0), &head, n + 4).unwrap();
        let d = m.decode_step(&mut c, &[StepToken { id: RequestId(0), token: ids[n - 1] }]).unwrap();
        let scale = whole.logits.iter().fold(0f32, |a, b| a.max(b.abs()));
        let worst = whole.logits.iter().zip(&d.logits).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(worst <= 0.03 * scale, "{n}: worst {worst} of {scale}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hisparse_equals_sparse_resident_for_every_online_policy() {
    let (dir, m) = tiny("lossless", 3);
    let ids = text_tokens(&m, 300);
    let (prompt, next) = ids.split_at(120);
    let probe = cache(&m, AttentionKind::SparseResident, 16, 24, BuiltinPolicy::Lru);
    let (kv, key) = probe.layouts();
    let prompts = [m.prefill(prompt, kv, key).unwrap(), m.prefill(&prompt[..100], kv, key).unwrap()];
    let nexts: [&[u32]; 2] = [next, &ids[100..280]];
    let mut resident = cache(&m, AttentionKind::SparseResident, 16, 24, BuiltinPolicy::Lru);
    let want = m.teacher_forced(&mut resident, &prompts, &nexts, true, None).unwrap();
    let mut checked = 0;
    for policy in BuiltinPolicy::ALL {
        if hisparse_policy::Eviction::from(policy).make_online().is_err() {
            continue; // belady needs the future
        }
        let mut hs = cache(&m, AttentionKind::HiSparse, 16, 24, policy);
        let got = m.teacher_forced(&mut hs, &prompts, &nexts, true, None).unwrap();
        assert!(got.logits == want.logits, "{policy:?}: logits differ from sparse resident");
        assert!(got.counts.misses > 1000 && got.counts.hits > 1000, "{policy:?}: {:?}", got.counts);
        hs.check().unwrap();
        checked += 1;
    }
    assert!(checked >= 9, "{checked} policies");
    // The check can fail: dense attention gives other logits.
    let mut dense = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru);
    let d = m.teacher_forced(&mut dense, &prompts, &nexts, true, None).unwrap();
    assert!(d.logits != want.logits);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn top_k_covering_the_context_is_dense() {
    let (dir, m) = tiny("dense", 4);
    let ids = text_tokens(&m, 200);
    let mut dense = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru);
    let (kv, key) = dense.layouts();
    let prompts = [m.prefill(&ids[..150], kv, key).unwrap()];
    let next: [&[u32]; 1] = [&ids[150..]];
    let d = m.teacher_forced(&mut dense, &prompts, &next, true, None).unwrap();
    for kind in [AttentionKind::SparseResident, AttentionKind::HiSparse] {
        let mut c = cache(&m, kind, 256, 300, BuiltinPolicy::Lru);
        let s = m.teacher_forced(&mut c, &prompts, &next, true, None).unwrap();
        // Every position selected, in position order: the same rows in the same order.
        assert!(s.logits == d.logits, "{kind:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_is_named() {
    let (dir, m) = tiny("bad", 5);
    let mut c = cache(&m, AttentionKind::Dense, 0, 0, BuiltinPolicy::Lru);
    let (kv, key) = c.layouts();
    let e = m.prefill(&[5, 999_999], kv, key).err().unwrap();
    assert!(matches!(&e, ModelError::Invalid { field, .. } if field == "token"), "{e}");
    let p = m.prefill(&[5, 6, 7], kv, key).unwrap();
    m.admit(&mut c, RequestId(0), &p, 8).unwrap();
    let e = m.decode_step(&mut c, &[StepToken { id: RequestId(7), token: 5 }]).err().unwrap();
    assert!(e.to_string().contains('7'), "{e}");
    // A file that is not GGUF, a truncated one, and another architecture are refused.
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"not a gguf file at all").unwrap();
    assert!(Llama::load(&junk).is_err());
    let full = std::fs::read(dir.join("tiny.gguf")).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let e = Llama::load(&cut).err().unwrap();
    assert!(e.to_string().contains("past the end of the file"), "{e}");
    let other = dir.join("other.gguf");
    let mut bytes = full.clone();
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    bytes[at..at + 5].copy_from_slice(b"qwen2");
    std::fs::write(&other, &bytes).unwrap();
    let e = Llama::load(&other).err().unwrap();
    assert!(e.to_string().contains("general.architecture"), "{e}");
    // A raised stop flag ends a prefill and a step with `Stopped`, the cache as it was.
    let mut stopped = Llama::load(&dir.join("tiny.gguf")).unwrap();
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    stopped.set_stop(hisparse_engine::StopFlag::new(flag));
    let e = stopped.prefill(&[5, 6, 7], kv, key).err().unwrap();
    assert!(matches!(e, ModelError::Engine(hisparse_engine::EngineError::Stopped)), "{e}");
    let e = stopped.decode_step(&mut c, &[StepToken { id: RequestId(0), token: 5 }]).err().unwrap();
    assert!(matches!(e, ModelError::Engine(hisparse_engine::EngineError::Stopped)), "{e}");
    assert_eq!(c.seq_len(RequestId(0)).unwrap(), 3);
    // The writer refuses to replace a file.
    assert!(write_tiny_gguf(&other, 1).is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn teacher_forcing_through_the_engine_equals_the_caches_api_and_its_trace_replays_to_its_counts() {
    use hisparse_policy::simulate::{SimConfig, simulate};
    use hisparse_policy::trace::TraceReader;
    let (dir, m) = tiny("trace", 6);
    let ids = text_tokens(&m, 320);
    let mut c = cache(&m, AttentionKind::HiSparse, 16, 24, BuiltinPolicy::Lru);
    let (kv, key) = c.layouts();
    let prompts = [m.prefill(&ids[..100], kv, key).unwrap(), m.prefill(&ids[50..200], kv, key).unwrap()];
    let next: [&[u32]; 2] = [&ids[100..220], &ids[200..320]];
    let want = m.teacher_forced(&mut c, &prompts, &next, true, None).unwrap();
    let sink = Sink::default();
    let trace: Box<dyn std::io::Write + Send> = Box::new(sink.clone());
    let stop = hisparse_engine::StopFlag::never();
    let run = m
        .teacher_forced_by_engine(
            CpuBackend::new(),
            c.config().clone(),
            &prompts,
            &next,
            true,
            (stop, Some((trace, 4))),
        )
        .unwrap();
    // The engine's path computes what the cache's own API does, bit for bit.
    assert_eq!((&run.nll, &run.argmax, &run.logits), (&want.nll, &want.argmax, &want.logits));
    assert_eq!((run.counts.hits, run.counts.misses, run.steps), (want.counts.hits, want.counts.misses, 120));
    // Its trace (with scores) replays under LRU to the same hits and misses.
    let bytes = sink.0.lock().unwrap().clone();
    let reader = TraceReader::new(bytes.as_slice()).unwrap();
    let header = reader.header().clone();
    let records: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 2 * 2 * 120);
    assert!(header.has_scores && records.iter().all(|r| r.near.as_ref().is_some_and(|n| n.len() == 4)));
    let cfg = SimConfig {
        policies: vec![PolicyChoice::from(BuiltinPolicy::Lru)],
        buffer_sizes: vec![24],
        ..SimConfig::default()
    };
    let report = simulate(&header, &records, &cfg, &|_| {}).unwrap();
    let lru = report.results.iter().find(|r| r.policy == "lru").unwrap();
    assert_eq!((lru.swap.hits, lru.swap.misses), (run.counts.hits, run.counts.misses), "{:?}", run.counts);
    assert!(run.counts.misses > 100);
    // Continuations of different lengths are refused, naming them.
    let short: [&[u32]; 2] = [&ids[100..110], &ids[200..205]];
    let e = m.teacher_forced_by_engine(
        CpuBackend::new(),
        c.config().clone(),
        &prompts,
        &short,
        false,
        (hisparse_engine::StopFlag::never(), None),
    );
    assert!(e.unwrap_err().to_string().starts_with("next"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn layers_through_candle_tensors_equal_the_slice_path() {
    let (dir, mut m) = tiny("tensors", 8);
    let ids = text_tokens(&m, 220);
    let mut run = |tensors: bool| {
        m.use_tensor_layers(tensors);
        let mut c = cache(&m, AttentionKind::HiSparse, 16, 24, BuiltinPolicy::Lru);
        let (kv, key) = c.layouts();
        let p = [m.prefill(&ids[..100], kv, key).unwrap(), m.prefill(&ids[20..120], kv, key).unwrap()];
        let next: [&[u32]; 2] = [&ids[100..160], &ids[120..180]];
        let r = m.teacher_forced(&mut c, &p, &next, true, None).unwrap();
        assert!(r.counts.misses > 0);
        r.logits
    };
    let (slices, tensors) = (run(false), run(true));
    assert_eq!(slices, tensors);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn four_bit_index_keys_select_losslessly_and_are_counted_at_their_size() {
    let (dir, m) = tiny("int4", 6);
    let ids = text_tokens(&m, 300);
    let formats = |index| StorageFormats { kv: KvRowFormat::Bf16, index };
    let int4 = formats(IndexKeyFormat::Int4 { group: 16 });
    let make = |kind, f: StorageFormats| {
        let cfg = cache_config(m.config(), kind, 16, 24, 400, f, 2).unwrap();
        KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
    };
    // 2 KV heads of 16: 32 key values, 16 B of codes and 2 scales (fp8: 32 + 4).
    let probe = make(AttentionKind::HiSparse, int4);
    let (kv, key) = probe.layouts();
    assert_eq!((key.format(), key.row_bytes()), (IndexKeyFormat::Int4 { group: 16 }, 16 + 8));
    let fp8 = cache_config(m.config(), AttentionKind::HiSparse, 16, 24, 400, KvRowFormat::Bf16, 2).unwrap();
    let int4_cfg = probe.config();
    let per_token = |c: &hisparse_engine::CacheConfig| c.geometry.index_bytes_per_token().unwrap();
    assert_eq!((per_token(int4_cfg), per_token(&fp8)), (2 * 24, 2 * 36), "two layers' keys");
    let prompts = [m.prefill(&ids[..120], kv, key).unwrap(), m.prefill(&ids[..100], kv, key).unwrap()];
    let nexts: [&[u32]; 2] = [&ids[120..300], &ids[100..280]];
    let mut resident = make(AttentionKind::SparseResident, int4);
    let want = m.teacher_forced(&mut resident, &prompts, &nexts, true, None).unwrap();
    let mut hs = make(AttentionKind::HiSparse, int4);
    let got = m.teacher_forced(&mut hs, &prompts, &nexts, true, None).unwrap();
    assert!(got.logits == want.logits, "hisparse differs from sparse resident over 4-bit keys");
    assert!(got.counts.misses > 1000, "{:?}", got.counts);
    hs.check().unwrap();
    // The selection reads the 4-bit keys: another selection than fp8 keys make, so other logits.
    let mut fp8_resident = make(AttentionKind::SparseResident, KvRowFormat::Bf16.into());
    let (kv8, key8) = fp8_resident.layouts();
    let prompts8 = [m.prefill(&ids[..120], kv8, key8).unwrap(), m.prefill(&ids[..100], kv8, key8).unwrap()];
    let other = m.teacher_forced(&mut fp8_resident, &prompts8, &nexts, true, None).unwrap();
    assert!(other.logits != want.logits, "4-bit keys selected as fp8 keys do");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn page_summaries_and_top_channel_keys_select_losslessly_and_are_counted_at_their_size() {
    // 2 KV heads of 16: 32 values. Pages of 8: a bf16 minimum and maximum each for 8 positions,
    // 16 B a position; 4 of every 16 channels: 8 places, 8 codes and a scale, 20 B.
    for (format, row, per_position) in
        [(IndexKeyFormat::Pages { tokens: 8 }, 128, 16), (IndexKeyFormat::Channels { keep: 4, group: 16 }, 20, 20)]
    {
        compact_keys_select_losslessly(format, row, per_position);
    }
}

fn compact_keys_select_losslessly(format: IndexKeyFormat, row: usize, per_position: usize) {
    let (dir, m) = tiny(&format.name().replace(':', "-"), 6);
    let ids = text_tokens(&m, 300);
    let pages = StorageFormats { kv: KvRowFormat::Bf16, index: format };
    let make = |kind| {
        let cfg = cache_config(m.config(), kind, 16, 24, 400, pages, 2).unwrap();
        KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
    };
    let probe = make(AttentionKind::HiSparse);
    let (kv, key) = probe.layouts();
    assert_eq!((key.row_bytes(), key.bytes_per_position()), (row, per_position), "{format}");
    assert_eq!(probe.config().geometry.index_bytes_per_token().unwrap(), 2 * per_position, "two layers' keys");
    let prompts = [m.prefill(&ids[..120], kv, key).unwrap(), m.prefill(&ids[..100], kv, key).unwrap()];
    let nexts: [&[u32]; 2] = [&ids[120..300], &ids[100..280]];
    let mut resident = make(AttentionKind::SparseResident);
    let want = m.teacher_forced(&mut resident, &prompts, &nexts, true, None).unwrap();
    let mut hs = make(AttentionKind::HiSparse);
    let got = m.teacher_forced(&mut hs, &prompts, &nexts, true, None).unwrap();
    assert!(got.logits == want.logits, "hisparse differs from sparse resident over {format}");
    assert!(got.counts.misses > 500, "{:?}", got.counts);
    hs.check().unwrap();
    // The selection reads the summaries: another selection than fp8 keys make.
    let mut fp8 = {
        let cfg = cache_config(m.config(), AttentionKind::SparseResident, 16, 24, 400, KvRowFormat::Bf16, 2).unwrap();
        KvCache::with_named_policies(CpuBackend::new(), cfg).unwrap()
    };
    let (kv8, key8) = fp8.layouts();
    let prompts8 = [m.prefill(&ids[..120], kv8, key8).unwrap(), m.prefill(&ids[..100], kv8, key8).unwrap()];
    let other = m.teacher_forced(&mut fp8, &prompts8, &nexts, true, None).unwrap();
    assert!(other.logits != want.logits, "{format} selected as fp8 keys do");
    std::fs::remove_dir_all(dir).unwrap();
}
