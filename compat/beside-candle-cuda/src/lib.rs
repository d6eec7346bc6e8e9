//! A model's CUDA layer written with candle, calling hisparse's cache on candle's own stream.

use std::sync::Arc;

use hisparse_engine::{DecodeStep, TensorInputs, TensorOutputs};
use hisparse_kernels::cuda::{CudaBackend, CudaDevice};

/// hisparse's CUDA backend on `device`'s stream (candle's buffers and ours in stream order).
pub fn backend_on(device: &candle_core::CudaDevice) -> Result<CudaBackend, hisparse_kernels::KernelError> {
    CudaBackend::on(Arc::new(CudaDevice::on_stream(device.cuda_stream())?))
}

/// One layer's attention of a step, candle tensors in and out.
pub fn attend(
    step: &mut DecodeStep<'_, CudaBackend>,
    layer: usize,
    inputs: &TensorInputs<'_>,
) -> hisparse_engine::Result<TensorOutputs> {
    step.layer_tensors(layer, inputs)
}
