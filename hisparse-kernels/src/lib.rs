//! # hisparse-kernels
//!
//! Owns the arithmetic of a decode step: the [`Backend`] trait (lightning indexer, top-k, sparse
//! MLA attention over a backend's own device memory), the exact CPU implementation
//! [`CpuBackend`], the LSE merge of partial attention, the dense f64 oracle, and — behind the
//! `cuda` feature — the CUDA kernels, compiled at run time by NVRTC for `sm_90a`.
//!
//! Invariant: outside the swap-in ([`swap_in`], `cpu/swap_in.rs`, `cuda/swap_in/`; and
//! [`KernelError::Policy`], which carries its errors) this
//! crate knows nothing about requests' lifetimes, scheduling or eviction; it computes on the
//! buffers and spans it is given. The swap-in runs an eviction policy's hooks and a prefetcher's
//! nominations (their CPU forms, or their CUDA sources spliced into its kernels) and nothing
//! else of the policy crate (checked by a tidy test of `xtask`).
//!
//! ```
//! use hisparse_kernels::prelude::*; // the backend traits
//! use hisparse_kernels::{CpuBackend, Span};
//! let cpu = CpuBackend::new();
//! let scores = vec![0.5f32, 2.0, -1.0, 2.0, 7.0];
//! let mut top = vec![0i32; 3];
//! cpu.top_k(&scores, &[Span::new(0, 5)], 3, &mut top)?;
//! assert_eq!(top, vec![1, 3, 4]); // positions, ascending
//! # Ok::<(), hisparse_kernels::KernelError>(())
//! ```

pub mod backend;
pub mod batch;
/// The backend traits, to call their methods on a concrete backend: `use hisparse_kernels::prelude::*`.
pub mod prelude {
    pub use crate::backend::{Backend, Kernels, ModelKernels, StepControl};
}
pub mod collectives;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod gemm;
pub mod index_queries;
pub mod locate;
pub mod merge;
pub mod new_rows;
pub mod oracle;
#[cfg(feature = "random")]
pub mod random;
pub mod row_backup;
pub mod swap_in;
pub mod unit_stream;

pub use backend::{Backend, Buf, Kernels, ModelKernels, StepControl};
pub use batch::{
    AttentionBatch, HeadCombine, IndexScore, IndexerBatch, IndexerRequest, KernelStage, OracleScore, Span, StageSeconds,
};
pub use collectives::{Collectives, CpuRank, RankMember};
pub use cpu::{CpuBackend, CpuRowBackup, CpuSwapIn};

pub use error::{KernelError, Result};
pub use gemm::GemmShape;
pub use index_queries::IndexerQueries;
pub use merge::merge_partial;
pub use new_rows::{NewRows, fill_new_rows_host};
pub use oracle::dense_attention;
pub use row_backup::{RowBackup, RowBackupConfig};
pub use swap_in::{
    AttentionQuery, DeviceSwapIn, DeviceSwapInConfig, DeviceSwapReq, HotLocation, MissFill, MissFillMode, SWAP_COUNTS,
    SwapCounts, locate_in_hot,
};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
