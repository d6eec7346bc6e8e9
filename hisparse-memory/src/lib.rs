//! # hisparse-memory
//!
//! Owns bytes and places in the hisparse KV hierarchy: the model geometry ([`KvGeometry`]),
//! the row codecs (bf16 and FlashMLA-style fp8 KV rows, fp8 index keys, bit-exact e4m3), the
//! memory a backend's kernels read and write ([`DeviceMemory`], with the CPU emulation
//! [`EmulatedDevice`]), the host tier ([`HostTier`], memory-mapped, anonymous or file-backed),
//! the device tier ([`DeviceTier`]), per-(request, layer) slot tables ([`SlotTable`]) and
//! admission accounting for both modes ([`AdmissionControl`]).
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

pub mod admission;
pub mod c_layout;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device_memory;
pub mod device_tier;
pub mod error;
pub mod fp8;
pub mod geometry;
pub mod host_tier;
pub mod page_pool;
pub mod preset;
pub mod request;
pub mod row;
pub mod slot_table;
mod system;

pub use admission::{Admission, AdmissionControl, CapacityPlan, RequestBytes, Resources};
pub use device_memory::{DeviceMemory, Element, EmulatedDevice};
pub use device_tier::{DeviceTier, DeviceTierConfig, SharedPool};
pub use error::{MemoryError, Result};
pub use geometry::{IndexerLayout, KvGeometry, RowShape};
pub use host_tier::{
    HostRowLocation, HostRowReader, HostRowWriter, HostTier, HostTierConfig, HostTierFile, HostTierLayout,
};
pub use page_pool::PagePool;
pub use preset::Preset;
pub use request::{Mode, RequestId};
pub use row::{IndexKeyFormat, IndexKeyLayout, KvRowFormat, KvRowLayout, RowHeads, StorageFormats, page_upper_bound};
pub use slot_table::SlotTable;
pub use system::available_memory;

/// The README's examples, compiled and run as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
