//! Names hisparse's CUDA backend and cudarc's driver side by side, so both are compiled against
//! one cudarc with candle's features.

/// The CUDA backend's type and cudarc's context type, as an engine would hold them together.
pub type Pair = (hisparse_kernels::cuda::CudaBackend, std::sync::Arc<cudarc::driver::CudaContext>);
