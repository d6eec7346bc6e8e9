//! `HostTier`: every live request's full KV rows in host memory, in one memory mapping whose
//! address and length never change (so that it can be registered with the CUDA driver once).
//! Anonymous by default (with transparent-hugepage advice); file-backed on request — the third,
//! NVMe tier, for a KV cache larger than RAM.
//!
//! Layout: layer-major. Page `p` of layer `l` holds `page_tokens` consecutive positions of one
//! request and starts at byte `(l * pages + p) * page_tokens * row_bytes`. A request holds the
//! same page ids in every layer and grows page by page as its sequence grows. Layer-major keeps
//! one layer's rows — what one swap-in launch reads — within `1/layers` of the mapping.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Advice, MmapOptions, MmapRaw};

use crate::error::{MemoryError, Result, check_len};
use crate::page_pool::PagePool;
use crate::request::RequestId;

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
    /// Back the tier with this file (created or truncated to size) instead of anonymous memory.
    pub path: Option<PathBuf>,
}

/// Where one row sits in the mapping: a byte offset from its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostRowLocation(pub u64);

/// The host tier. See the module documentation for the layout.
pub struct HostTier {
    // Declared before `map`: unregistered before the mapping can go away.
    #[cfg(feature = "cuda")]
    registration: Option<crate::cuda::HostRegistration>,
    map: Arc<MmapRaw>,
    path: Option<PathBuf>,
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
            .field("path", &self.path)
            .field("pages", &self.pages.total())
            .field("used_pages", &self.pages.used())
            .finish()
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> MemoryError {
    move |e| MemoryError::Io { what, message: e.to_string() }
}

impl HostTier {
    /// Maps a host tier of `cfg.bytes` (anonymous, or the file at `cfg.path`).
    pub fn new(cfg: &HostTierConfig) -> Result<Self> {
        for (field, v) in [("layers", cfg.layers), ("row_bytes", cfg.row_bytes), ("page_tokens", cfg.page_tokens)] {
            if v == 0 {
                return Err(MemoryError::invalid(field, v, "must be at least 1"));
            }
        }
        let page_bytes = cfg.row_bytes * cfg.page_tokens;
        let pages = cfg.bytes / (page_bytes * cfg.layers);
        if pages == 0 {
            return Err(MemoryError::invalid(
                "host_bytes",
                cfg.bytes,
                format!("holds no page of {page_bytes} B in each of {} layers", cfg.layers),
            ));
        }
        let len = pages * page_bytes * cfg.layers;
        let (map, hugepages) = match &cfg.path {
            None => {
                let m = MmapOptions::new()
                    .len(len)
                    .map_anon()
                    .map_err(io(format!("mapping {len} B of anonymous memory")))?;
                // Advice only: a kernel without transparent huge pages keeps 4 KiB pages.
                let huge = m.advise(Advice::HugePage).is_ok();
                (MmapRaw::from(m), huge)
            }
            Some(path) => (Self::map_file(path, len)?, false),
        };
        Ok(Self {
            #[cfg(feature = "cuda")]
            registration: None,
            map: Arc::new(map),
            path: cfg.path.clone(),
            hugepages,
            layers: cfg.layers,
            row_bytes: cfg.row_bytes,
            page_tokens: cfg.page_tokens,
            page_bytes,
            pages: PagePool::new("host tier", pages)?,
        })
    }

    fn map_file(path: &Path, len: usize) -> Result<MmapRaw> {
        let what = || format!("host tier file {}", path.display());
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).map_err(io(what()))?;
        file.set_len(len as u64).map_err(io(what()))?;
        MmapOptions::new().len(len).map_raw(&file).map_err(io(what()))
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
        self.path.as_deref()
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
        self.locate(req, layer, first + n - 1)?;
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
    /// the address kernels read it through.
    #[cfg(feature = "cuda")]
    pub fn register_cuda(&mut self, ctx: &Arc<cudarc::driver::CudaContext>) -> Result<u64> {
        if let Some(r) = &self.registration {
            return Ok(r.device_ptr());
        }
        // SAFETY: the mapping lives in `self.map` (never moved or resized) and the guard is
        // dropped before it (field order).
        let r = unsafe { crate::cuda::HostRegistration::register(ctx, self.map.as_mut_ptr(), self.map.len())? };
        let p = r.device_ptr();
        self.registration = Some(r);
        Ok(p)
    }

    /// The registered device address, if registered.
    #[cfg(feature = "cuda")]
    pub fn cuda_ptr(&self) -> Option<u64> {
        self.registration.as_ref().map(crate::cuda::HostRegistration::device_ptr)
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
mod tests {
    use super::*;

    fn cfg(bytes: usize, path: Option<PathBuf>) -> HostTierConfig {
        HostTierConfig { bytes, layers: 3, row_bytes: 656, page_tokens: 4, path }
    }

    fn row(seed: u8) -> Vec<u8> {
        (0..656).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn rows_round_trip_and_grow_page_by_page() {
        let mut t = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
        assert_eq!(t.total_pages(), 10);
        let r = RequestId(7);
        t.register(r).unwrap();
        t.grow(r, 5).unwrap();
        assert_eq!(t.capacity(r).unwrap(), 8);
        let base = t.as_ptr();
        for l in 0..3 {
            for p in 0..8 {
                t.write_row(r, l, p, &row((l * 10 + p) as u8)).unwrap();
            }
        }
        let e = t.write_row(r, 0, 8, &row(0)).unwrap_err();
        assert!(matches!(e, MemoryError::PositionOutOfRange { position: 8, capacity: 8, .. }), "{e}");
        t.grow(r, 9).unwrap();
        t.write_row(r, 2, 8, &row(99)).unwrap();
        let mut out = vec![0u8; 656];
        for l in 0..3 {
            for p in 0..8 {
                t.read_row(r, l, p, &mut out).unwrap();
                assert_eq!(out, row((l * 10 + p) as u8), "layer {l} position {p}");
            }
        }
        t.read_row(r, 2, 8, &mut out).unwrap();
        assert_eq!(out, row(99));
        assert_eq!(t.as_ptr(), base, "the mapping never moves");
        // Layer-major layout: layer 1 of page 0 starts one layer region in.
        assert_eq!(t.locate(r, 1, 0).unwrap(), HostRowLocation((10 * 4 * 656) as u64));
        assert_eq!(t.bytes_in_use(), 3 * 3 * 4 * 656);
        t.release(r).unwrap();
        assert_eq!(t.bytes_in_use(), 0);
        t.check().unwrap();
    }

    #[test]
    fn bulk_writes_equal_row_writes_across_pages_and_check_first() {
        let mut a = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
        let mut b = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
        let r = RequestId(2);
        for t in [&mut a, &mut b] {
            t.register(RequestId(9)).unwrap();
            t.grow(RequestId(9), 3).unwrap(); // so that r's pages are not the first ones
            t.register(r).unwrap();
            t.grow(r, 11).unwrap();
        }
        let rows: Vec<u8> = (3..10).flat_map(|p| row(p as u8)).collect();
        a.write_rows(r, 1, 3, &rows).unwrap();
        for p in 3..10 {
            b.write_row(r, 1, p, &row(p as u8)).unwrap();
        }
        let (mut x, mut y) = (vec![0u8; 656], vec![0u8; 656]);
        for p in 0..11 {
            a.read_row(r, 1, p, &mut x).unwrap();
            b.read_row(r, 1, p, &mut y).unwrap();
            assert_eq!(x, y, "position {p}");
        }
        // Past the capacity: refused whole, nothing written.
        let before = (0..12).map(|p| a.read_row(r, 2, p.min(11), &mut x).map(|()| x.clone())).collect::<Vec<_>>();
        assert!(a.write_rows(r, 2, 8, &rows[..5 * 656]).is_err());
        let after = (0..12).map(|p| a.read_row(r, 2, p.min(11), &mut x).map(|()| x.clone())).collect::<Vec<_>>();
        assert_eq!(before, after);
        assert!(a.write_rows(r, 1, 0, &rows[..100]).is_err(), "not whole rows");
    }

    #[test]
    fn exhaustion_is_all_or_nothing_and_freed_pages_are_reused() {
        let mut t = HostTier::new(&cfg(656 * 4 * 3 * 4, None)).unwrap();
        let (a, b) = (RequestId(1), RequestId(2));
        t.register(a).unwrap();
        t.register(b).unwrap();
        t.grow(a, 12).unwrap();
        let e = t.grow(b, 8).unwrap_err();
        assert!(matches!(e, MemoryError::CapacityExhausted { needed: 2, free: 1, .. }), "{e}");
        assert_eq!(t.capacity(b).unwrap(), 0);
        t.release(a).unwrap();
        t.grow(b, 16).unwrap();
        assert_eq!(t.free_pages(), 0);
        t.check().unwrap();
    }

    #[test]
    fn file_backed_tier_persists_rows_in_the_file() {
        let path = std::env::temp_dir().join(format!("hisparse-host-tier-{}.bin", std::process::id()));
        {
            let mut t = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(path.clone()))).unwrap();
            assert_eq!(t.path(), Some(path.as_path()));
            let r = RequestId(1);
            t.register(r).unwrap();
            t.grow(r, 1).unwrap();
            t.write_row(r, 1, 0, &row(5)).unwrap();
            let at = t.locate(r, 1, 0).unwrap().0 as usize;
            drop(t);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len(), 656 * 4 * 3 * 2);
            assert_eq!(&bytes[at..at + 656], row(5).as_slice());
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_writer_on_another_thread_fills_rows() {
        let mut t = HostTier::new(&cfg(656 * 4 * 3 * 4, None)).unwrap();
        let r = RequestId(3);
        t.register(r).unwrap();
        t.grow(r, 16).unwrap();
        let locs: Vec<_> = (0..16).map(|p| t.locate(r, 2, p).unwrap()).collect();
        let w = t.row_writer();
        std::thread::spawn(move || {
            for (p, at) in locs.into_iter().enumerate() {
                // SAFETY: the main thread touches none of these rows until the join below.
                unsafe { w.write(at, &row(p as u8)) }.unwrap();
            }
        })
        .join()
        .unwrap();
        let mut out = vec![0u8; 656];
        for p in 0..16 {
            t.read_row(r, 2, p, &mut out).unwrap();
            assert_eq!(out, row(p as u8));
        }
        // SAFETY: single-threaded here.
        let e = unsafe { t.row_writer().write(HostRowLocation(t.len() as u64 - 10), &row(0)) }.unwrap_err();
        assert!(matches!(e, MemoryError::OutOfBounds { .. }));
    }

    #[test]
    fn a_tier_too_small_for_one_page_is_refused() {
        let e = HostTier::new(&cfg(1000, None)).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "host_bytes", .. }), "{e}");
    }
}
