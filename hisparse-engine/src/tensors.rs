//! Candle tensors through the per-layer API (feature `candle`): a model written with candle
//! hands a layer's inputs as tensors to [`DecodeStep::layer_tensors`] and gets the attention
//! output and log-sum-exp back as tensors — CPU tensors on the CPU backend, and with
//! `candle-cuda` CUDA tensors on the CUDA backend run on candle's stream. A contiguous tensor's
//! storage is read where it lies (no copy); a strided or offset view is copied first. Dtypes,
//! devices and the batch are checked and refused by the field's name ([`TensorMemory`]: what a
//! backend's memory needs of candle's storage).

use candle_core::{CpuStorage, Device, Storage, StorageRef, Tensor};
use half::bf16;
use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, EmulatedDevice};

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

/// An element type of the inputs (bf16 queries, f32 weights, u8 rows and keys), as a tensor's
/// storage holds it.
pub trait TensorElement: candle_core::WithDType + hisparse_memory::device_memory::Element {
    /// The elements of a CPU storage of this type.
    fn cpu(s: &CpuStorage) -> Option<&Vec<Self>>;
}

impl TensorElement for bf16 {
    fn cpu(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
}

impl TensorElement for f32 {
    fn cpu(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl TensorElement for u8 {
    fn cpu(s: &CpuStorage) -> Option<&Vec<Self>> {
        match s {
            CpuStorage::U8(v) => Some(v),
            _ => None,
        }
    }
}

/// A backend memory whose buffers candle tensors can be read as and made from: the CPU's
/// (`EmulatedDevice`: a `CpuStorage`'s `Vec`) and, with `candle-cuda`, CUDA's (a
/// `CudaStorage`'s `CudaSlice`).
pub trait TensorMemory: DeviceMemory {
    /// Whether `device` is this memory's kind.
    fn holds(device: &Device) -> bool;
    /// Elements of a storage of `dtype` (`None`: not this memory's, or not an input's dtype).
    fn storage_len(g: &Storage, dtype: candle_core::DType) -> Option<usize>;
    /// The buffer of a storage that holds exactly `len` elements of `T`.
    fn buffer<'g, T: TensorElement + CudaElementBound>(
        field: &str,
        g: &'g Storage,
        len: usize,
    ) -> Result<&'g Self::Buffer<T>>;
    /// `len` zeroed f32 on `device`.
    fn zeros(device: &Device, len: usize) -> Result<Self::Buffer<f32>>;
    /// `buf` as a tensor of `shape` on `device`.
    fn tensor(buf: Self::Buffer<f32>, shape: Vec<usize>, device: &Device) -> Result<Tensor>;
}

/// What a CUDA storage needs of an element type (nothing without `candle-cuda`).
#[cfg(not(feature = "candle-cuda"))]
pub trait CudaElementBound {}
#[cfg(not(feature = "candle-cuda"))]
impl<T> CudaElementBound for T {}
/// What a CUDA storage needs of an element type.
#[cfg(feature = "candle-cuda")]
pub trait CudaElementBound: candle_core::cuda_backend::CudaDType {}
#[cfg(feature = "candle-cuda")]
impl<T: candle_core::cuda_backend::CudaDType> CudaElementBound for T {}

impl TensorMemory for EmulatedDevice {
    fn holds(device: &Device) -> bool {
        device.is_cpu()
    }

    fn storage_len(g: &Storage, dtype: candle_core::DType) -> Option<usize> {
        use candle_core::DType::{BF16, F32, U8};
        let Storage::Cpu(c) = g else { return None };
        match dtype {
            BF16 => c.as_slice::<bf16>().ok().map(<[bf16]>::len),
            F32 => c.as_slice::<f32>().ok().map(<[f32]>::len),
            U8 => c.as_slice::<u8>().ok().map(<[u8]>::len),
            _ => None,
        }
    }

    fn buffer<'g, T: TensorElement + CudaElementBound>(field: &str, g: &'g Storage, len: usize) -> Result<&'g Vec<T>> {
        match g {
            Storage::Cpu(c) => match T::cpu(c) {
                Some(v) if v.len() == len => Ok(v),
                Some(v) => Err(refuse(field, v.len(), format!("{len} elements expected"))),
                None => Err(refuse(field, "another dtype", format!("must be {:?}", T::DTYPE))),
            },
            _ => Err(refuse(field, "a device tensor", "the CPU backend takes CPU tensors")),
        }
    }

    fn zeros(_device: &Device, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0f32; len])
    }

    fn tensor(buf: Vec<f32>, shape: Vec<usize>, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_vec(buf, shape, device)?)
    }
}

fn refuse(field: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> EngineError {
    EngineError::Input { field: field.into(), value: value.to_string(), reason: reason.into() }
}

/// `t` checked — of `dtype`, on `M`'s kind of device, its first dimension the batch `n` — as a
/// tensor whose storage holds exactly its elements: itself, or a contiguous copy.
fn whole<M: TensorMemory>(field: &str, t: &Tensor, n: usize, dtype: candle_core::DType) -> Result<Tensor> {
    if t.dtype() != dtype {
        return Err(refuse(field, format!("{:?}", t.dtype()), format!("must be {dtype:?}")));
    }
    if !M::holds(t.device()) {
        return Err(refuse(field, format!("{:?}", t.device().location()), "not on the backend's kind of device"));
    }
    if t.dims().first() != Some(&n) {
        return Err(refuse(field, format!("{:?}", t.dims()), format!("its first dimension is the batch of {n}")));
    }
    let exact = {
        let (g, layout) = t.storage_and_layout();
        layout.is_contiguous() && layout.start_offset() == 0 && M::storage_len(&g, dtype) == Some(t.elem_count())
    };
    if exact { Ok(t.clone()) } else { Ok(t.contiguous()?.copy()?) }
}

impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        EngineError::Tensor(e.to_string())
    }
}

/// The storage guard of `t`.
fn guard(t: &Tensor) -> StorageRef<'_> {
    t.storage_and_layout().0
}

impl<B: Backend> DecodeStep<'_, B>
where
    B::Memory: TensorMemory + Clone,
{
    /// [`DecodeStep::layer`] with candle tensors in and out, on the backend's kind of device
    /// (CPU tensors for the CPU backend; CUDA tensors on the backend's stream for the CUDA one,
    /// feature `candle-cuda`): runs layer `l` (the step's next) for the batch and returns its
    /// attention output and log-sum-exp as new tensors. Refused, naming the field, when a tensor
    /// has another dtype, device or batch than the layer takes.
    pub fn layer_tensors(&mut self, l: usize, inputs: &TensorInputs<'_>) -> Result<TensorOutputs> {
        use candle_core::DType::{BF16, F32, U8};
        let n = self.batch().len();
        let opt = |f: &str, t: Option<&Tensor>, d| t.map(|t| whole::<B::Memory>(f, t, n, d)).transpose();
        let iq = opt("index_queries", inputs.index_queries, BF16)?;
        let iw = opt("index_weights", inputs.index_weights, F32)?;
        let ik = opt("new_index_keys", inputs.new_index_keys, U8)?;
        let q = whole::<B::Memory>("attention_queries", inputs.attention_queries, n, BF16)?;
        let rows = whole::<B::Memory>("new_kv_rows", inputs.new_kv_rows, n, U8)?;
        let (giq, giw, gik) = (iq.as_ref().map(guard), iw.as_ref().map(guard), ik.as_ref().map(guard));
        let (gq, grows) = (guard(&q), guard(&rows));
        let count = |t: &Option<Tensor>| t.as_ref().map_or(0, Tensor::elem_count);
        let layer = LayerInputs {
            index_queries: giq
                .as_ref()
                .map(|g| B::Memory::buffer::<bf16>("index_queries", g, count(&iq)))
                .transpose()?,
            index_weights: giw
                .as_ref()
                .map(|g| B::Memory::buffer::<f32>("index_weights", g, count(&iw)))
                .transpose()?,
            new_index_keys: gik
                .as_ref()
                .map(|g| B::Memory::buffer::<u8>("new_index_keys", g, count(&ik)))
                .transpose()?,
            attention_queries: B::Memory::buffer::<bf16>("attention_queries", &gq, q.elem_count())?,
            new_kv_rows: B::Memory::buffer::<u8>("new_kv_rows", &grows, rows.elem_count())?,
        };
        let g = &self.cache().config().geometry;
        let (heads, dv) = (g.q_heads, g.d_v());
        let device = q.device().clone();
        let (mut out, mut lse) = (B::Memory::zeros(&device, n * heads * dv)?, B::Memory::zeros(&device, n * heads)?);
        self.layer(l, &layer, &mut out, &mut lse)?;
        Ok(TensorOutputs {
            out: B::Memory::tensor(out, vec![n, heads, dv], &device)?,
            lse: B::Memory::tensor(lse, vec![n, heads], &device)?,
        })
    }
}

#[cfg(feature = "candle-cuda")]
mod cuda {
    //! Candle's CUDA tensors as the CUDA backend's buffers: the backend must run on candle's
    //! stream (`CudaBackend::on(Arc::new(CudaDevice::on_stream(candle_device.cuda_stream())?))`),
    //! so that candle's buffers and ours are used in stream order.

    use candle_core::cuda_backend::CudaStorage;
    use candle_core::cuda_backend::cudarc::driver::CudaSlice;
    use candle_core::op::BackpropOp;
    use candle_core::{Device, Storage, Tensor};
    use hisparse_memory::cuda::CudaMemory;

    use super::{CudaElementBound, TensorElement, TensorMemory, refuse};
    use crate::error::Result;

    impl TensorMemory for CudaMemory {
        fn holds(device: &Device) -> bool {
            device.is_cuda()
        }

        fn storage_len(g: &Storage, dtype: candle_core::DType) -> Option<usize> {
            use candle_core::DType::{BF16, F32, U8};
            let Storage::Cuda(c) = g else { return None };
            match dtype {
                BF16 => c.as_cuda_slice::<half::bf16>().ok().map(CudaSlice::len),
                F32 => c.as_cuda_slice::<f32>().ok().map(CudaSlice::len),
                U8 => c.as_cuda_slice::<u8>().ok().map(CudaSlice::len),
                _ => None,
            }
        }

        fn buffer<'g, T: TensorElement + CudaElementBound>(
            field: &str,
            g: &'g Storage,
            len: usize,
        ) -> Result<&'g CudaSlice<T>> {
            match g {
                Storage::Cuda(c) => {
                    let s = c.as_cuda_slice::<T>()?;
                    if s.len() != len {
                        return Err(refuse(field, s.len(), format!("{len} elements expected")));
                    }
                    Ok(s)
                }
                _ => Err(refuse(field, "not CUDA", "the CUDA backend takes CUDA tensors")),
            }
        }

        fn zeros(device: &Device, len: usize) -> Result<CudaSlice<f32>> {
            let Device::Cuda(d) = device else {
                return Err(refuse("out", "not CUDA", "the outputs go to a CUDA device"));
            };
            d.cuda_stream().alloc_zeros::<f32>(len).map_err(|e| refuse("out", len, e.to_string()))
        }

        fn tensor(buf: CudaSlice<f32>, shape: Vec<usize>, device: &Device) -> Result<Tensor> {
            let Device::Cuda(d) = device else {
                return Err(refuse("out", "not CUDA", "the outputs go to a CUDA device"));
            };
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(buf, d.clone()));
            Ok(Tensor::from_storage(storage, shape, BackpropOp::none(), false))
        }
    }
}
