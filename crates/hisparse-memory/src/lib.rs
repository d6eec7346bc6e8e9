//! # hisparse-memory
//!
//! Owns bytes and places in the hisparse KV hierarchy: the model geometry ([`KvGeometry`]),
//! the row codecs (bf16 and FlashMLA-style fp8 KV rows, fp8 index keys, bit-exact e4m3), and
//! the memory a backend's kernels read and write ([`DeviceMemory`], with the CPU emulation
//! [`EmulatedDevice`]).
//!
//! Nothing here knows about requests' scheduling, policies or kernels: this crate sits at the
//! bottom of the workspace (see ARCHITECTURE.md).
//!
//! ```
//! use hisparse_memory::{KvGeometry, KvRowFormat};
//! let g = KvGeometry::preset("glm-5.1")?.with_kv_format(KvRowFormat::Bf16);
//! assert_eq!(g.kv_row()?.row_bytes(), 1152);
//! # Ok::<(), hisparse_memory::MemoryError>(())
//! ```

pub mod device_memory;
pub mod error;
pub mod fp8;
pub mod geometry;
pub mod row;

pub use device_memory::{DeviceMemory, Element, EmulatedDevice};
pub use error::{MemoryError, Result};
pub use geometry::KvGeometry;
pub use row::{IndexKeyLayout, KvRowFormat, KvRowLayout};

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
