//! Candle tensors through the per-layer API (feature `candle`): a model written with candle
//! hands a layer's inputs as tensors to [`DecodeStep::layer_tensors`] and gets the attention
//! output and log-sum-exp back as tensors. On the CPU backend a contiguous tensor's storage is
//! read where it lies (no copy); a strided or offset view is copied first. Shapes, dtypes and
//! devices are checked and refused by the field's name.

use candle_core::{CpuStorage, Device, Storage, StorageRef, Tensor};
use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::EmulatedDevice;

use crate::cache::{DecodeStep, LayerInputs};
use crate::error::{EngineError, Result};

/// One layer's inputs as candle tensors, for the step's batch in its order (`n` requests):
/// the same contents as [`LayerInputs`]'s buffers.
#[derive(Clone, Copy)]
pub struct TensorInputs<'t> {
    /// Indexer queries, bf16 `[n, index_heads, index_dim]` (`None` on an IndexShare layer).
    pub index_queries: Option<&'t Tensor>,
    /// Indexer head weights, f32 `[n, index_heads]`.
    pub index_weights: Option<&'t Tensor>,
    /// The new token's index key, u8 `[n, key row bytes]`.
    pub new_index_keys: Option<&'t Tensor>,
    /// Attention queries, bf16 `[n, q_heads, d_qk]`.
    pub attention_queries: &'t Tensor,
    /// The new token's KV row, u8 `[n, kv row bytes]`.
    pub new_kv_rows: &'t Tensor,
}

/// A layer's attention, as tensors on the inputs' device.
pub struct TensorOutputs {
    /// The attention output, f32 `[n, q_heads, d_v]`.
    pub out: Tensor,
    /// The log-sum-exp of each query head's scores, f32 `[n, q_heads]`.
    pub lse: Tensor,
}

/// An element type a CPU tensor's storage holds.
trait CpuElement: candle_core::WithDType + hisparse_memory::device_memory::Element {
    fn of(s: &CpuStorage) -> Option<&Vec<Self>>;
}

impl CpuElement for bf16 {
    fn of(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
}

impl CpuElement for f32 {
    fn of(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl CpuElement for u8 {
    fn of(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::U8(v) => Some(v),
            _ => None,
        }
    }
}

/// A tensor's elements as a `Vec`: its own storage (read-locked), or a contiguous copy.
enum Held<'t, T> {
    Storage(StorageRef<'t>),
    Copy(Vec<T>),
}

impl<T: CpuElement> Held<'_, T> {
    fn get(&self) -> &Vec<T> {
        match self {
            // Invariant: `hold` keeps the guard only of a CPU storage of `T` (checked there).
            Self::Storage(g) => match &**g {
                Storage::Cpu(c) => T::of(c).unwrap_or_else(|| unreachable!("checked by hold")),
                _ => unreachable!("checked by hold"),
            },
            Self::Copy(v) => v,
        }
    }
}

fn refuse(field: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> EngineError {
    EngineError::Input { field: field.into(), value: value.to_string(), reason: reason.into() }
}

/// `t`'s elements, checked: a CPU tensor of `T` whose first dimension is the batch `n`.
fn hold<'t, T: CpuElement>(field: &str, t: &'t Tensor, n: usize) -> Result<Held<'t, T>> {
    if t.dtype() != T::DTYPE {
        return Err(refuse(field, format!("{:?}", t.dtype()), format!("must be {:?}", T::DTYPE)));
    }
    if !t.device().is_cpu() {
        return Err(refuse(field, format!("{:?}", t.device().location()), "the CPU backend takes CPU tensors"));
    }
    if t.dims().first() != Some(&n) {
        return Err(refuse(field, format!("{:?}", t.dims()), format!("its first dimension is the batch of {n}")));
    }
    let (guard, layout) = t.storage_and_layout();
    let whole = match &*guard {
        Storage::Cpu(c) => T::of(c).is_some_and(|v| v.len() == t.elem_count()),
        _ => false,
    };
    if whole && layout.is_contiguous() && layout.start_offset() == 0 {
        return Ok(Held::Storage(guard));
    }
    drop(guard);
    Ok(Held::Copy(t.flatten_all()?.to_vec1::<T>()?))
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Tensor(e.to_string())
    }
}

impl<B: Backend<Memory = EmulatedDevice>> DecodeStep<'_, B> {
    /// [`DecodeStep::layer`] with candle CPU tensors in and out: runs layer `l` (the step's
    /// next) for the batch and returns its attention output and log-sum-exp as new tensors.
    /// Refused, naming the field, when a tensor has another dtype, device or size than the
    /// layer takes.
    pub fn layer_tensors(&mut self, l: usize, inputs: &TensorInputs<'_>) -> Result<TensorOutputs> {
        let n = self.batch().len();
        let iq = inputs.index_queries.map(|t| hold::<bf16>("index_queries", t, n)).transpose()?;
        let iw = inputs.index_weights.map(|t| hold::<f32>("index_weights", t, n)).transpose()?;
        let ik = inputs.new_index_keys.map(|t| hold::<u8>("new_index_keys", t, n)).transpose()?;
        let q = hold::<bf16>("attention_queries", inputs.attention_queries, n)?;
        let rows = hold::<u8>("new_kv_rows", inputs.new_kv_rows, n)?;
        let g = &self.cache().config().geometry;
        let (heads, dv) = (g.q_heads, g.d_v());
        let mut out = vec![0f32; n * heads * dv];
        let mut lse = vec![0f32; n * heads];
        let layer = LayerInputs {
            index_queries: iq.as_ref().map(Held::get),
            index_weights: iw.as_ref().map(Held::get),
            new_index_keys: ik.as_ref().map(Held::get),
            attention_queries: q.get(),
            new_kv_rows: rows.get(),
        };
        self.layer(l, &layer, &mut out, &mut lse)?;
        Ok(TensorOutputs {
            out: Tensor::from_vec(out, (n, heads, dv), &Device::Cpu)?,
            lse: Tensor::from_vec(lse, (n, heads), &Device::Cpu)?,
        })
    }
}
