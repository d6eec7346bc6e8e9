//! `LlamaWeights`: a llama GGUF file's tensors as candle's quantized matrices (the projections,
//! kept quantized on the device they are loaded onto: the CPU, or a CUDA device's memory with
//! candle's `cuda`), the norms and the embedding as f32 on the host.
//! Every tensor's shape is checked against the config before the model is used; the memory
//! the f32 embedding needs is checked against what the machine has before it is made.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::Device;
use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{QMatMul, QTensor};

use crate::projection::Projection;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};

/// One transformer block's weights.
pub struct BlockWeights {
    /// RMSNorm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection `[heads * head_dim, hidden]`.
    pub wq: Projection,
    /// Key projection `[kv_heads * head_dim, hidden]`.
    pub wk: Projection,
    /// Value projection `[kv_heads * head_dim, hidden]`.
    pub wv: Projection,
    /// Output projection `[hidden, heads * head_dim]`.
    pub wo: Projection,
    /// RMSNorm before the MLP.
    pub ffn_norm: Vec<f32>,
    /// Gate `[ffn, hidden]`.
    pub gate: Projection,
    /// Up `[ffn, hidden]`.
    pub up: Projection,
    /// Down `[hidden, ffn]`.
    pub down: Projection,
}

/// A whole model's weights.
pub struct LlamaWeights {
    /// The shape.
    pub config: LlamaConfig,
    /// Token embeddings `[vocab, hidden]`, f32.
    pub embed: Vec<f32>,
    /// The blocks.
    pub blocks: Vec<BlockWeights>,
    /// The final RMSNorm.
    pub norm: Vec<f32>,
    /// The LM head `[vocab, hidden]` (the embedding's tensor when the file ties them).
    pub output: Projection,
}

/// The file's metadata and an open reader positioned anywhere.
pub(crate) fn open(path: &Path) -> Result<(Content, BufReader<File>)> {
    let io = |source| ModelError::Io { path: path.to_owned(), source };
    // What candle's reader computes with unchecked is checked first.
    crate::gguf_header::check(path)?;
    let f = File::open(path).map_err(io)?;
    let mut r = BufReader::new(f);
    let content = Content::read(&mut r).map_err(|e| ModelError::invalid("gguf", path.display(), e.to_string()))?;
    Ok((content, r))
}

struct Reader<'a> {
    content: &'a Content,
    r: &'a mut BufReader<File>,
    file_len: u64,
    /// Where the projections are loaded.
    device: &'a Device,
}

impl Reader<'_> {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        self.tensor_on(name, shape, &Device::Cpu)
    }

    fn tensor_on(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(ModelError::invalid(name, "missing", "a llama GGUF file holds it"));
        };
        if info.shape.dims() != shape {
            return Err(ModelError::invalid(name, format!("{:?}", info.shape.dims()), format!("expected {shape:?}")));
        }
        // The tensor's bytes must lie inside the file before a buffer is made for them.
        let (block, size) = (info.ggml_dtype.block_size() as u64, info.ggml_dtype.type_size() as u64);
        let end = (info.shape.elem_count() as u64)
            .checked_div(block)
            .and_then(|b| b.checked_mul(size))
            .and_then(|b| b.checked_add(info.offset))
            .and_then(|b| b.checked_add(self.content.tensor_data_offset));
        if end.is_none_or(|e| e > self.file_len) {
            return Err(ModelError::invalid(
                name,
                format!("{:?}", info.shape.dims()),
                format!("its data lies past the end of the file ({} B)", self.file_len),
            ));
        }
        Ok(self.content.tensor(self.r, name, device)?)
    }

    fn matrix(&mut self, name: &str, shape: &[usize]) -> Result<Projection> {
        let device = self.device;
        Projection::new(QMatMul::from_qtensor(self.tensor_on(name, shape, device)?)?)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.tensor(name, &[len])?.dequantize(&Device::Cpu)?.to_vec1::<f32>()?;
        if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
            return Err(ModelError::invalid(name, bad, "holds a value that is not finite"));
        }
        Ok(v)
    }
}

impl LlamaWeights {
    /// Reads every tensor of the llama GGUF file at `path`, the projections onto the CPU.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_on(path, &Device::Cpu)
    }

    /// Reads every tensor of the llama GGUF file at `path`, the projections (the output head's
    /// included) onto `device`, where their products run.
    pub fn load_on(path: &Path, device: &Device) -> Result<Self> {
        let (content, mut r) = open(path)?;
        let config = LlamaConfig::from_gguf(&content)?;
        let c = &config;
        let embed_bytes = (c.vocab as u64).checked_mul(c.hidden as u64).and_then(|x| x.checked_mul(4));
        if let (Some(need), Some(have)) = (embed_bytes, hisparse_engine::available_memory())
            && need > have
        {
            return Err(ModelError::invalid(
                "token_embd.weight",
                format!("{need} B as f32"),
                format!("the machine has {have} B available"),
            ));
        }
        let file_len = r.get_ref().metadata().map_err(|source| ModelError::Io { path: path.to_owned(), source })?.len();
        let mut rd = Reader { content: &content, r: &mut r, file_len, device };
        let embed_q = rd.tensor("token_embd.weight", &[c.vocab, c.hidden])?;
        let embed = embed_q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        let (qd, kvd) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut blocks = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let n = |t: &str| format!("blk.{l}.{t}.weight");
            blocks.push(BlockWeights {
                attn_norm: rd.vector(&n("attn_norm"), c.hidden)?,
                wq: rd.matrix(&n("attn_q"), &[qd, c.hidden])?,
                wk: rd.matrix(&n("attn_k"), &[kvd, c.hidden])?,
                wv: rd.matrix(&n("attn_v"), &[kvd, c.hidden])?,
                wo: rd.matrix(&n("attn_output"), &[c.hidden, qd])?,
                ffn_norm: rd.vector(&n("ffn_norm"), c.hidden)?,
                gate: rd.matrix(&n("ffn_gate"), &[c.ffn, c.hidden])?,
                up: rd.matrix(&n("ffn_up"), &[c.ffn, c.hidden])?,
                down: rd.matrix(&n("ffn_down"), &[c.hidden, c.ffn])?,
            });
        }
        let norm = rd.vector("output_norm.weight", c.hidden)?;
        let output = if content.tensor_infos.contains_key("output.weight") {
            rd.matrix("output.weight", &[c.vocab, c.hidden])?
        } else if device.is_cpu() {
            Projection::new(QMatMul::from_qtensor(embed_q)?)?
        } else {
            rd.matrix("token_embd.weight", &[c.vocab, c.hidden])?
        };
        Ok(Self { config, embed, blocks, norm, output })
    }
}
