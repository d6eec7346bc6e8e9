//! A tiny llama GGUF file with random weights and a byte-level vocabulary of its own, written by
//! [`write_tiny_gguf`]: the loader's and tokenizer's paths run on it in a fraction of a second
//! (tests, and trying the commands without the real model).

use std::io::{BufWriter, Write};
use std::path::Path;

use candle_core::quantized::gguf_file::{Value, write};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

use crate::error::{ModelError, Result};

/// The tiny model's shape: 2 layers, hidden 64, 4 query heads over 2 KV heads of 16, MLP 128,
/// 512 positions.
pub const TINY: (usize, usize, usize, usize, usize, usize) = (2, 64, 4, 2, 128, 512);

/// GPT-2's printable stand-in for each byte (the byte-level BPE alphabet).
pub fn byte_chars() -> Vec<char> {
    let keep = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut extra = 0u32;
    (0u32..256)
        .map(|b| {
            if keep(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

/// The tiny vocabulary: three control tokens, the 256 byte symbols, and the merges
/// `Ġ t`, `h e`, `Ġt he` (so " the" is one token).
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).to_vec();
    let mut types = vec![3; 3];
    tokens.extend(byte_chars().into_iter().map(String::from));
    types.resize(tokens.len(), 1);
    let merges = ["Ġ t", "h e", "Ġt he"].map(String::from).to_vec();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    (tokens, types, merges)
}

fn q(rng: &mut rand::rngs::StdRng, shape: &[usize], dtype: GgmlDType, std: f32) -> Result<QTensor> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * std).collect();
    let t = Tensor::from_vec(data, shape, &Device::Cpu)?;
    Ok(QTensor::quantize(&t, dtype)?)
}

/// Writes the tiny model, with weights drawn from `seed`, to `path` (created new: an existing
/// file is refused).
pub fn write_tiny_gguf(path: &Path, seed: u64) -> Result<()> {
    let (layers, hidden, heads, kv_heads, ffn, context) = TINY;
    let hd = hidden / heads;
    let (tokens, types, merges) = tiny_vocab();
    let vocab = tokens.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let u32v = |x: usize| Value::U32(x as u32);
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("hisparse tiny".into())),
        ("llama.block_count", u32v(layers)),
        ("llama.embedding_length", u32v(hidden)),
        ("llama.attention.head_count", u32v(heads)),
        ("llama.attention.head_count_kv", u32v(kv_heads)),
        ("llama.feed_forward_length", u32v(ffn)),
        ("llama.context_length", u32v(context)),
        ("llama.rope.dimension_count", u32v(hd)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", u32v(vocab)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type", Value::Array(types.into_iter().map(Value::I32).collect())),
        ("tokenizer.ggml.merges", Value::Array(merges.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
    ];
    let mut tensors: Vec<(String, QTensor)> =
        vec![("token_embd.weight".into(), q(&mut rng, &[vocab, hidden], GgmlDType::Q8_0, 1.0)?)];
    let kvd = kv_heads * hd;
    for l in 0..layers {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        let norm = |rng: &mut rand::rngs::StdRng| {
            let v: Vec<f32> = (0..hidden).map(|_| 0.8 + 0.4 * rng.random::<f32>()).collect();
            QTensor::quantize(&Tensor::from_vec(v, hidden, &Device::Cpu)?, GgmlDType::F32)
        };
        tensors.push((n("attn_norm"), norm(&mut rng)?));
        tensors.push((n("attn_q"), q(&mut rng, &[hidden, hidden], GgmlDType::Q4_1, 0.3)?));
        tensors.push((n("attn_k"), q(&mut rng, &[kvd, hidden], GgmlDType::Q4_1, 0.3)?));
        tensors.push((n("attn_v"), q(&mut rng, &[kvd, hidden], GgmlDType::Q4_1, 0.3)?));
        tensors.push((n("attn_output"), q(&mut rng, &[hidden, hidden], GgmlDType::Q4_1, 0.1)?));
        tensors.push((n("ffn_norm"), norm(&mut rng)?));
        tensors.push((n("ffn_gate"), q(&mut rng, &[ffn, hidden], GgmlDType::Q4_1, 0.2)?));
        tensors.push((n("ffn_up"), q(&mut rng, &[ffn, hidden], GgmlDType::Q4_1, 0.2)?));
        tensors.push((n("ffn_down"), q(&mut rng, &[hidden, ffn], GgmlDType::Q4_1, 0.1)?));
    }
    let v: Vec<f32> = vec![1.0; hidden];
    tensors.push((
        "output_norm.weight".into(),
        QTensor::quantize(&Tensor::from_vec(v, hidden, &Device::Cpu)?, GgmlDType::F32)?,
    ));
    let io = |source| ModelError::Io { path: path.to_owned(), source };
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(io)?;
    let mut w = BufWriter::new(f);
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    write(&mut w, &meta_refs, &tensor_refs)?;
    w.flush().map_err(io)?;
    Ok(())
}
