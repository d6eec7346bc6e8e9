//! `HostTier`: every live request's full KV rows in host memory, in one memory mapping whose
//! address and length never change (so that it can be registered with the CUDA driver once).
//! Anonymous by default (with transparent-hugepage advice); file-backed on request — the third,
//! NVMe tier, for a KV cache larger than RAM (`file.rs`: a new file, reserved, locked, removed
//! when the tier goes away).
//!
//! Layout: layer-major. Page `p` of layer `l` holds `page_tokens` consecutive positions of one
//! request and starts at byte `(l * pages + p) * page_tokens * row_bytes`. A request holds the
//! same page ids in every layer and grows page by page as its sequence grows. Layer-major keeps
//! one layer's rows — what one swap-in launch reads — within `1/layers` of the mapping.

mod file;
#[cfg(feature = "cuda")]
mod mapped;

use std::path::Path;
use std::sync::Arc;

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::error::{MemoryError, Result, check_len};
use crate::page_pool::PagePool;
use crate::request::RequestId;

pub use file::HostTierFile;
#[cfg(feature = "cuda")]
pub use mapped::MappedHostTier;

/// Sizes of a host tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTierConfig {
    /// Bytes of the mapping (rounded down to whole pages over all layers).
    pub bytes: usize,
    /// Layers of every request.
    pub layers: usize,
    /// Bytes of one KV row.
    pub row_bytes: usize,
    /// Positions per page.
    pub page_tokens: usize,
    /// Back the tier with this file instead of anonymous memory (see [`HostTierFile`]).
    pub file: Option<HostTierFile>,
}

/// The fixed shape of a host tier's mapping: what a kernel needs to find a row in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostTierLayout {
    /// Layers (layer regions of the mapping).
    pub layers: usize,
    /// Pages per layer region.
    pub pages_per_layer: usize,
    /// Bytes of one row.
    pub row_bytes: usize,
    /// Positions per page.
    pub page_tokens: usize,
}

impl HostTierLayout {
    /// Rows in the whole mapping (`layers * pages_per_layer * page_tokens`; no overflow: the
    /// mapping of that many rows exists).
    pub fn rows(&self) -> u64 {
        (self.layers * self.pages_per_layer * self.page_tokens) as u64
    }

    /// Rows of one layer region: row `r` of layer 0 is row `r + l * layer_rows()` of layer `l`.
    pub fn layer_rows(&self) -> u64 {
        (self.pages_per_layer * self.page_tokens) as u64
    }

    /// The row of position `position` of layer `layer` on host page `page` (no checks: a row
    /// index is checked where it is read, [`HostRowReader::read`]).
    pub fn row(&self, layer: usize, page: u32, position: usize) -> u64 {
        layer as u64 * self.layer_rows()
            + u64::from(page) * self.page_tokens as u64
            + (position % self.page_tokens) as u64
    }
}

/// Where one row sits in the mapping: a byte offset from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostRowLocation(pub u64);

/// The host tier. See the module documentation for the layout.
pub struct HostTier {
    // Declared before `map`: unregistered before the mapping can go away.
    #[cfg(feature = "cuda")]
    registration: Option<MappedHostTier>,
    map: Arc<MmapRaw>,
    // Declared after `map`: the file is removed (unless kept) after it is unmapped.
    file: Option<file::TierFile>,
    hugepages: bool,
    layers: usize,
    row_bytes: usize,
    page_tokens: usize,
    page_bytes: usize,
    pages: PagePool,
}

impl std::fmt::Debug for HostTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTier")
            .field("bytes", &self.map.len())
            .field("path", &self.path())
            .field("pages", &self.pages.total())
            .field("used_pages", &self.pages.used())
            .finish()
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> MemoryError {
    move |e| MemoryError::Io { what, message: e.to_string() }
}

impl HostTier {
    /// Maps a host tier of `cfg.bytes` (anonymous, or the file of `cfg.file`). Sizes are
    /// checked: a tier whose byte count overflows is refused, naming the field.
    pub fn new(cfg: &HostTierConfig) -> Result<Self> {
        for (field, v) in [("layers", cfg.layers), ("row_bytes", cfg.row_bytes), ("page_tokens", cfg.page_tokens)] {
            if v == 0 {
                return Err(MemoryError::invalid(field, v, "must be at least 1"));
            }
        }
        let page_bytes = cfg.row_bytes.checked_mul(cfg.page_tokens).ok_or_else(|| {
            MemoryError::invalid("page_tokens", cfg.page_tokens, format!("pages of {} B rows overflow", cfg.row_bytes))
        })?;
        let region = page_bytes.checked_mul(cfg.layers).ok_or_else(|| {
            MemoryError::invalid("layers", cfg.layers, format!("pages of {page_bytes} B in every layer overflow"))
        })?;
        let pages = cfg.bytes / region;
        if pages == 0 {
            return Err(MemoryError::invalid(
                "host_bytes",
                cfg.bytes,
                format!("holds no page of {page_bytes} B in each of {} layers", cfg.layers),
            ));
        }
        if pages > u32::MAX as usize {
            return Err(MemoryError::invalid("host_bytes", cfg.bytes, "more than 2^32 - 1 pages per layer"));
        }
        // pages * region <= cfg.bytes: no overflow.
        let len = pages * region;
        if isize::try_from(len).is_err() {
            return Err(MemoryError::invalid("host_bytes", cfg.bytes, "larger than the address space"));
        }
        let (map, file, hugepages) = match &cfg.file {
            None => {
                let m = MmapOptions::new()
                    .len(len)
                    .map_anon()
                    .map_err(io(format!("mapping {len} B of anonymous memory")))?;
                // Advice only: a kernel without transparent huge pages keeps 4 KiB pages.
                let huge = m.advise(Advice::HugePage).is_ok();
                (MmapRaw::from(m), None, huge)
            }
            Some(spec) => {
                let f = file::TierFile::create(spec, len)?;
                let m = MmapOptions::new()
                    .len(len)
                    .map_raw(f.file())
                    .map_err(io(format!("host tier file {}", spec.path.display())))?;
                (m, Some(f), false)
            }
        };
        Ok(Self {
            #[cfg(feature = "cuda")]
            registration: None,
            map: Arc::new(map),
            file,
            hugepages,
            layers: cfg.layers,
            row_bytes: cfg.row_bytes,
            page_tokens: cfg.page_tokens,
            page_bytes,
            pages: PagePool::new("host tier", pages)?,
        })
    }

    /// Address of the mapping (stable for the tier's life).
    pub fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    /// Bytes of the mapping (stable for the tier's life).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never: a tier holds at least one page).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The backing file, if file-backed.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(file::TierFile::path)
    }

    /// The mapping's fixed shape.
    pub fn layout(&self) -> HostTierLayout {
        HostTierLayout {
            layers: self.layers,
            pages_per_layer: self.pages.total(),
            row_bytes: self.row_bytes,
            page_tokens: self.page_tokens,
        }
    }

    /// Whether transparent-hugepage advice was accepted (anonymous tiers only).
    pub fn hugepage_advice(&self) -> bool {
        self.hugepages
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Positions per page.
    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }

    /// Pages per layer in total.
    pub fn total_pages(&self) -> usize {
        self.pages.total()
    }

    /// Pages per layer not held by any request.
    pub fn free_pages(&self) -> usize {
        self.pages.free()
    }

    /// Bytes held by requests (all layers).
    pub fn bytes_in_use(&self) -> usize {
        self.pages.used() * self.page_bytes * self.layers
    }

    /// Registers `req` with no positions.
    pub fn register(&mut self, req: RequestId) -> Result<()> {
        self.pages.register(req)
    }

    /// Makes room for positions `0..tokens` of `req` in every layer (all or nothing).
    pub fn grow(&mut self, req: RequestId, tokens: usize) -> Result<()> {
        self.pages.grow_to(req, tokens.div_ceil(self.page_tokens)).map(|_| ())
    }

    /// Positions of `req` that have room.
    pub fn capacity(&self, req: RequestId) -> Result<usize> {
        Ok(self.pages.pages(req)?.len() * self.page_tokens)
    }

    /// Frees every page of `req`; its rows may be reused at once.
    pub fn release(&mut self, req: RequestId) -> Result<()> {
        self.pages.release(req).map(|_| ())
    }

    /// Checks the page pool's invariant.
    pub fn check(&self) -> Result<()> {
        self.pages.check()
    }

    /// Where row (`req`, `layer`, `position`) lives.
    pub fn locate(&self, req: RequestId, layer: usize, position: usize) -> Result<HostRowLocation> {
        if layer >= self.layers {
            return Err(MemoryError::invalid("layer", layer, format!("the host tier has {} layers", self.layers)));
        }
        let pages = self.pages.pages(req)?;
        let page = pages.get(position / self.page_tokens).ok_or(MemoryError::PositionOutOfRange {
            pool: "host tier",
            request: req.0,
            position,
            capacity: pages.len() * self.page_tokens,
        })?;
        // No overflow: a held page id is below `total()`, so the offset lies inside the mapping,
        // whose length is a usize.
        let off = (layer * self.pages.total() + *page as usize) * self.page_bytes
            + (position % self.page_tokens) * self.row_bytes;
        Ok(HostRowLocation(off as u64))
    }

    /// Writes one row.
    pub fn write_row(&mut self, req: RequestId, layer: usize, position: usize, row: &[u8]) -> Result<()> {
        check_len("row", self.row_bytes, row.len())?;
        let at = self.locate(req, layer, position)?;
        // SAFETY: `at` is a row inside the mapping (computed from a held page); we hold `&mut
        // self`, and the only other writer (`HostRowWriter`) writes rows the engine has not
        // handed to anyone else (its contract), so no reference to these bytes exists.
        unsafe {
            std::ptr::copy_nonoverlapping(row.as_ptr(), self.map.as_mut_ptr().add(at.0 as usize), self.row_bytes)
        };
        Ok(())
    }

    /// Writes consecutive rows: row `i` of `rows` goes to position `first + i` (one copy per
    /// page run; every position is checked before anything is written).
    pub fn write_rows(&mut self, req: RequestId, layer: usize, first: usize, rows: &[u8]) -> Result<()> {
        if !rows.len().is_multiple_of(self.row_bytes) {
            return Err(MemoryError::invalid(
                "rows",
                rows.len(),
                format!("not a whole number of {} B rows", self.row_bytes),
            ));
        }
        let n = rows.len() / self.row_bytes;
        if n == 0 {
            return Ok(());
        }
        let last =
            first.checked_add(n - 1).ok_or_else(|| MemoryError::invalid("first", first, "position overflows"))?;
        // Every position is held when the last one is (pages are held from position 0 up).
        self.locate(req, layer, last)?;
        let (mut pos, mut done) = (first, 0);
        while done < n {
            let run = (self.page_tokens - pos % self.page_tokens).min(n - done);
            let at = self.locate(req, layer, pos)?;
            let src = &rows[done * self.row_bytes..(done + run) * self.row_bytes];
            // SAFETY: `at .. at + run rows` stays inside one held page of the mapping (the run
            // ends at the page's end at the latest); as in `write_row`, no reference to these
            // bytes exists.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.as_mut_ptr().add(at.0 as usize), src.len()) };
            done += run;
            pos += run;
        }
        Ok(())
    }

    /// Reads one row into `out`.
    pub fn read_row(&self, req: RequestId, layer: usize, position: usize, out: &mut [u8]) -> Result<()> {
        check_len("out", self.row_bytes, out.len())?;
        let at = self.locate(req, layer, position)?;
        // SAFETY: as in `write_row`: a row inside the mapping that no one writes concurrently.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(at.0 as usize), out.as_mut_ptr(), self.row_bytes)
        };
        Ok(())
    }

    /// Registers the whole mapping with `ctx`'s device as mapped pinned memory (once) and returns
    /// the handle kernels read it through (it keeps the mapping and its registration alive).
    /// A file-backed tier cannot be registered (the driver pins anonymous memory only).
    #[cfg(feature = "cuda")]
    pub fn register_cuda(&mut self, ctx: &Arc<cudarc::driver::CudaContext>) -> Result<MappedHostTier> {
        if let Some(r) = &self.registration {
            return Ok(r.clone());
        }
        if let Some(p) = self.path() {
            return Err(MemoryError::invalid(
                "host_tier_file",
                p.display(),
                "a file-backed host tier cannot be registered with CUDA (cuMemHostRegister refuses \
                 file mappings); use the anonymous host tier on the GPU",
            ));
        }
        let r = MappedHostTier::register(ctx, Arc::clone(&self.map), self.layout())?;
        self.registration = Some(r.clone());
        Ok(r)
    }

    /// The registration, if registered.
    #[cfg(feature = "cuda")]
    pub fn cuda_mapping(&self) -> Option<&MappedHostTier> {
        self.registration.as_ref()
    }

    /// Pages per layer region (for kernels computing row addresses).
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The page ids `req` holds, in position order (the same in every layer).
    pub fn pages(&self, req: RequestId) -> Result<&[u32]> {
        self.pages.pages(req)
    }

    /// A handle that writes rows from another thread (the backup worker).
    pub fn row_writer(&self) -> HostRowWriter {
        HostRowWriter { map: Arc::clone(&self.map), row_bytes: self.row_bytes }
    }

    /// A handle that reads rows by row index (a swap-in that runs beside the tier's owner).
    pub fn row_reader(&self) -> HostRowReader {
        HostRowReader { map: Arc::clone(&self.map), layout: self.layout() }
    }
}

/// Reads rows of a [`HostTier`] by row index ([`HostTierLayout::row`]): the CPU swap-in's
/// handle. It keeps the mapping alive and checks every index against the layout.
#[derive(Clone)]
pub struct HostRowReader {
    map: Arc<MmapRaw>,
    layout: HostTierLayout,
}

impl HostRowReader {
    /// The tier's layout.
    pub fn layout(&self) -> HostTierLayout {
        self.layout
    }

    /// Reads row `row` into `out` (`row_bytes`); fails on an index outside the tier.
    ///
    /// # Safety
    ///
    /// Nothing writes the row while it is read: its backup (if any) has completed.
    pub unsafe fn read(&self, row: u64, out: &mut [u8]) -> Result<()> {
        let rb = self.layout.row_bytes;
        check_len("out", rb, out.len())?;
        if row >= self.layout.rows() {
            return Err(MemoryError::invalid("row", row, format!("the host tier has {} rows", self.layout.rows())));
        }
        // row < rows(), and rows() * row_bytes <= len (the layout was taken from the mapping).
        let start = row as usize * rb;
        // SAFETY: in bounds (above); no concurrent writer is the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(start), out.as_mut_ptr(), rb) };
        Ok(())
    }
}

/// Writes rows of a [`HostTier`] from another thread: the backup worker's handle. It keeps the
/// mapping alive; it knows nothing of pages, so the engine locates rows first.
#[derive(Clone)]
pub struct HostRowWriter {
    map: Arc<MmapRaw>,
    row_bytes: usize,
}

impl HostRowWriter {
    /// Writes `row` at `at` (bounds-checked).
    ///
    /// # Safety
    ///
    /// Until the caller publishes that this write completed, nothing else reads or writes the
    /// row at `at`, and the page holding it stays allocated to the same request.
    pub unsafe fn write(&self, at: HostRowLocation, row: &[u8]) -> Result<()> {
        check_len("row", self.row_bytes, row.len())?;
        let start = at.0 as usize;
        if start.checked_add(self.row_bytes).is_none_or(|end| end > self.map.len()) {
            return Err(MemoryError::OutOfBounds {
                field: "host tier",
                start,
                end: start + self.row_bytes,
                len: self.map.len(),
            });
        }
        // SAFETY: in bounds (checked above); exclusive access to these bytes is the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), self.map.as_mut_ptr().add(start), self.row_bytes) };
        Ok(())
    }
}

#[cfg(test)]
mod tests;
