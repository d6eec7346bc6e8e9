//! The config's keys, its JSON form and its validation, field by field.

use hisparse_memory::MemoryError;

use super::*;

fn glm() -> KvGeometry {
    KvGeometry::preset("glm-5.1").unwrap()
}

fn field_of(e: PolicyError) -> &'static str {
    match e {
        PolicyError::Invalid { field, .. } | PolicyError::Memory(MemoryError::InvalidField { field, .. }) => field,
        PolicyError::UnknownPolicy { .. } => "eviction_policy",
        other => panic!("{other}"),
    }
}

#[test]
fn sglang_keys_parse_as_they_are() {
    let g = glm();
    let c = HiSparseConfig::from_json_over(
        &g,
        &HiSparseConfig::for_geometry(&g),
        r#"{"top_k": 2048, "device_buffer_size": 6144, "host_to_device_ratio": 10, "swap_in_block_size": 960}"#,
    )
    .unwrap();
    assert_eq!((c.device_buffer_size, c.host_to_device_ratio, c.swap_in_block_size), (6144, 10.0, 960));
    assert_eq!(c.eviction.name(), "lru");
    c.validate(&g).unwrap();
    assert!(HiSparseConfig::from_json(r#"{"topk": 2048}"#).unwrap_err().to_string().contains("topk"));
    // Without a geometry, SGLang's top_k cannot be checked: refused, naming it.
    assert!(HiSparseConfig::from_json(r#"{"top_k": 2048}"#).unwrap_err().to_string().contains("top_k"));
}

#[test]
fn a_partial_file_keeps_the_presets_values() {
    let small = KvGeometry::preset("cpu-small").unwrap();
    let base = HiSparseConfig::for_geometry(&small);
    let empty = HiSparseConfig::from_json_over(&small, &base, "{}").unwrap();
    assert_eq!(empty, base);
    empty.validate(&small).unwrap();
    let c = HiSparseConfig::from_json_over(&small, &base, r#"{"device_buffer_size": 1024, "swap_in_block_size": 256}"#)
        .unwrap();
    assert_eq!((c.device_buffer_size, c.swap_in_block_size), (1024, 256));
    c.validate(&small).unwrap();
    // SGLang's top_k, which the preset fixes: the preset's is taken; another is refused naming both.
    assert_eq!(HiSparseConfig::from_json_over(&small, &base, r#"{"top_k": 256}"#).unwrap(), base);
    for other in [r#"{"top_k": 2048}"#, r#"{"top_k": "256"}"#, r#"{"top_k": -1}"#] {
        let e = HiSparseConfig::from_json_over(&small, &base, other).unwrap_err().to_string();
        assert!(e.contains("top_k = ") && e.contains("cpu-small selects top_k = 256"), "{other}: {e}");
    }
    assert!(HiSparseConfig::from_json_over(&small, &base, r#"{"topk": 1}"#).unwrap_err().to_string().contains("topk"));
    assert!(HiSparseConfig::from_json_over(&small, &base, "[1, 2]").is_err());
}

#[test]
fn each_bad_field_is_named() {
    let g = glm();
    let cases: Vec<(HiSparseConfig, &str)> = vec![
        (HiSparseConfig { device_buffer_size: 2047, ..Default::default() }, "device_buffer_size"),
        (HiSparseConfig { device_buffer_size: 0, ..Default::default() }, "device_buffer_size"),
        (HiSparseConfig { swap_in_block_size: 0, ..Default::default() }, "swap_in_block_size"),
        (HiSparseConfig { swap_in_block_size: 1025, ..Default::default() }, "swap_in_block_size"),
        (HiSparseConfig { host_to_device_ratio: 0.0, ..Default::default() }, "host_to_device_ratio"),
        (HiSparseConfig { page_tokens: 0, ..Default::default() }, "page_tokens"),
        (HiSparseConfig { prefetch: Prefetch::NextStep { budget: 5000 }, ..Default::default() }, "prefetch_budget"),
        (HiSparseConfig { eviction: Eviction::Belady, ..Default::default() }, "eviction_policy"),
        (HiSparseConfig { eviction: Eviction::Mq { queues: 99, lifetime: 8 }, ..Default::default() }, "mq_queues"),
        (HiSparseConfig { device_buffer_size: 70_000, ..Default::default() }, "device_buffer_size"),
        // 1 MiB of device bytes x 8 cannot hold a 128k-token request of 51 KB per token.
        (HiSparseConfig { device_kv_bytes: 1 << 20, ..Default::default() }, "host_to_device_ratio"),
        (
            HiSparseConfig { device_kv_bytes: 1 << 30, host_tier_bytes: 1 << 20, ..Default::default() },
            "host_tier_bytes",
        ),
        // A ratio whose host tier is beyond the address space (the product saturates).
        (
            HiSparseConfig { device_kv_bytes: 1 << 30, host_to_device_ratio: 1e300, ..Default::default() },
            "host_to_device_ratio",
        ),
        // A request length whose KV bytes overflow a 64-bit count.
        (
            HiSparseConfig { device_kv_bytes: 1 << 30, max_request_tokens: usize::MAX - 64, ..Default::default() },
            "max_request_tokens",
        ),
    ];
    for (c, field) in cases {
        assert_eq!(field_of(c.validate(&g).unwrap_err()), field, "{c:?}");
    }
    // Enough host bytes for one request passes.
    HiSparseConfig { device_kv_bytes: 1 << 30, ..Default::default() }.validate(&g).unwrap();
}

#[test]
fn names_are_resolved_once_when_json_is_read_and_written_back_the_same() {
    for (json, needle) in [
        (r#"{"eviction_policy": "lfu-9000"}"#, "lfu-9000"),
        (r#"{"prefetcher": "psychic"}"#, "psychic"),
        // Who fills the misses is the backend's option, not the cache's: refused by name.
        (r#"{"miss_fill": "auto"}"#, "miss_fill"),
    ] {
        let e = HiSparseConfig::from_json(json).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
    let c = HiSparseConfig::from_json(r#"{"eviction_policy": "s3fifo", "prefetcher": "adjacent-layer"}"#).unwrap();
    assert_eq!((c.eviction.name(), c.prefetch.name()), ("s3fifo", "adjacent-layer"));
    // The prefetcher and its budget are one typed value; the JSON keeps both flat keys.
    let next = HiSparseConfig::from_json(r#"{"prefetcher": "next-step", "prefetch_budget": 12}"#).unwrap();
    assert_eq!(next.prefetch, Prefetch::NextStep { budget: 12 });
    let json = serde_json::to_string(&next).unwrap();
    assert!(json.contains(r#""prefetcher":"next-step""#) && json.contains(r#""prefetch_budget":12"#), "{json}");
    assert_eq!(HiSparseConfig::from_json(&json).unwrap(), next);
    // Written back: the same flat keys, read again to the same config.
    let text = serde_json::to_string(&c).unwrap();
    assert!(text.contains(r#""eviction_policy":"s3fifo""#), "{text}");
    assert_eq!(HiSparseConfig::from_json(&text).unwrap(), c);
}

#[test]
fn the_policy_keys_resolve_to_one_typed_value_and_back() {
    let c = HiSparseConfig::from_json(r#"{"eviction_policy": "random", "policy_seed": 7}"#).unwrap();
    assert_eq!(c.eviction, Eviction::Random { seed: 7 });
    let c = HiSparseConfig::from_json(r#"{"eviction_policy": "clock", "policy_config": {"clock_bits": 3}}"#).unwrap();
    assert_eq!(c.eviction, Eviction::Clock { bits: 3 });
    let json = serde_json::to_value(&c).unwrap();
    assert_eq!(
        (json["eviction_policy"].as_str(), json["policy_config"]["clock_bits"].as_u64()),
        (Some("clock"), Some(3))
    );
    assert_eq!(serde_json::from_value::<HiSparseConfig>(json).unwrap(), c);
    // `policy_seed` is the seed; `policy_config.seed` is replaced by it, as before.
    let c = HiSparseConfig::from_json(r#"{"eviction_policy": "random", "policy_config": {"seed": 3}}"#).unwrap();
    assert_eq!(c.eviction, Eviction::Random { seed: 0 });
}
