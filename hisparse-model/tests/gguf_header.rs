//! GGUF headers that would make candle's reader panic, or compute with values out of range,
//! are refused before it reads them, naming the key or tensor: an alignment of 0 (candle divides
//! by it), a tensor whose element count overflows 64 bits, arrays nested past the limit, and
//! lengths that run past the end of the file. A good header still loads.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_model::Llama;

/// A GGUF version-3 header: `kvs` metadata entries (already encoded) and `tensors` infos.
fn gguf(kvs: &[Vec<u8>], tensors: &[Vec<u8>]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        b.extend(kv);
    }
    for t in tensors {
        b.extend(t);
    }
    // Room for data, so that lengths are checked against a file of some size.
    b.extend(std::iter::repeat_n(0x5au8, 256));
    b
}

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// A metadata entry: key, value type, value bytes.
fn kv(key: &str, t: u32, value: &[u8]) -> Vec<u8> {
    let mut b = string(key);
    b.extend(t.to_le_bytes());
    b.extend(value);
    b
}

fn tensor(name: &str, dims: &[u64]) -> Vec<u8> {
    let mut b = string(name);
    b.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend(d.to_le_bytes());
    }
    b.extend(0u32.to_le_bytes()); // f32
    b.extend(0u64.to_le_bytes());
    b
}

fn load_err(name: &str, bytes: &[u8]) -> String {
    let p = std::env::temp_dir().join(format!("hisparse-gguf-header-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    let r = Llama::load(&p);
    std::fs::remove_file(&p).unwrap();
    r.err().unwrap().to_string()
}

#[test]
fn headers_candle_would_compute_with_are_refused_naming_the_key() {
    let arch = kv("general.architecture", 8, &string("llama"));
    // Alignment 0, in each integer type candle reads it as.
    for (t, v) in
        [(4u32, 0u32.to_le_bytes().to_vec()), (0, vec![0u8]), (2, vec![0, 0]), (5, 0i32.to_le_bytes().to_vec())]
    {
        let e = load_err("align0", &gguf(&[arch.clone(), kv("general.alignment", t, &v)], &[]));
        assert!(e.contains("general.alignment = 0"), "type {t}: {e}");
    }
    let e = load_err("align-huge", &gguf(&[kv("general.alignment", 4, &(1u32 << 30).to_le_bytes())], &[]));
    assert!(e.contains("general.alignment = 1073741824") && e.contains("between 1 and 65536"), "{e}");
    // A tensor of 2^40 x 2^40 elements.
    let e =
        load_err("elems", &gguf(std::slice::from_ref(&arch), &[tensor("blk.0.attn_q.weight", &[1 << 40, 1 << 40])]));
    assert!(e.contains("blk.0.attn_q.weight") && e.contains("overflows 64 bits"), "{e}");
    let e = load_err("dims", &gguf(std::slice::from_ref(&arch), &[tensor("t", &[1, 2, 3, 4, 5])]));
    assert!(e.contains("t = 5 dimensions"), "{e}");
    // Arrays nested 20 deep.
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(4u32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    let e = load_err("nested", &gguf(&[kv("deep", 9, &nested)], &[]));
    assert!(e.contains("deep") && e.contains("nested more than 16 deep"), "{e}");
    // An array, a string, a count past the end of the file.
    let mut long = 4u32.to_le_bytes().to_vec();
    long.extend((1u64 << 40).to_le_bytes());
    let e = load_err("long-array", &gguf(&[kv("tokenizer.ggml.tokens", 9, &long)], &[]));
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains("longer than the file"), "{e}");
    let e = load_err("long-string", &gguf(&[kv("general.name", 8, &(1u64 << 40).to_le_bytes())], &[]));
    assert!(e.contains("general.name") && e.contains("past the end of the file"), "{e}");
    let mut counts = gguf(&[], &[]);
    counts[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = load_err("count", &counts);
    assert!(e.contains("tensor_count"), "{e}");
    // A good alignment passes the header check (and the load goes on to what is missing).
    let e = load_err("align32", &gguf(&[arch, kv("general.alignment", 4, &32u32.to_le_bytes())], &[]));
    assert!(!e.contains("general.alignment") && e.contains("missing"), "{e}");
}
