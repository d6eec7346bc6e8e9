//! `DeviceTier`: what lives in a backend's device memory, per layer: the index keys of every
//! token of every live request (in the layers that run an indexer: `index_layers` key pools),
//! the hot buffers of hisparse requests (`device_buffer_size`
//! regular slots plus the reserved newest slot, one "seat" per request), and the full KV rows of
//! resident requests. Pages of `page_tokens` positions are shared across layers: a request holds
//! the same page ids (and seat) in every layer's buffer.

use std::collections::HashMap;

use crate::device_memory::DeviceMemory;
use crate::error::{MemoryError, Result, check_len};
use crate::page_pool::PagePool;
use crate::request::{Mode, RequestId};
use crate::row::{IndexKeyLayout, KvRowLayout};

crate::c_fn! {
    /// Rows of one hot buffer of `slots` regular slots: those, then the newest token's reserved
    /// slot. The one place the reserved slot is counted, in Rust and in the kernels
    /// (`HOT_BUFFER_ROWS_C`, in the swap-in's generated prelude).
    pub HOT_BUFFER_ROWS_C: fn hot_buffer_rows(slots) = slots + 1;
}

crate::c_fn! {
    /// The first row of hot-buffer seat `seat` in a hot-buffer pool of buffers of `slots` regular
    /// slots: every hot-buffer row address, in Rust and in the kernels (`HOT_SEAT_BASE_C`, after
    /// [`HOT_BUFFER_ROWS_C`] in the swap-in's generated prelude).
    pub HOT_SEAT_BASE_C: fn hot_seat_base(seat, slots) = seat * hot_buffer_rows(slots);
}

/// [`hot_buffer_rows`] of a `usize` count (no overflow: a buffer's slots are bounded by its
/// pool, whose rows fit an i32).
pub const fn hot_buffer_rows_of(slots: usize) -> usize {
    hot_buffer_rows(slots as u64) as usize
}

/// Capacities of a device tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTierConfig {
    /// Layers.
    pub layers: usize,
    /// Layers that store index keys (the full layers of an IndexShare model; else `layers`).
    pub index_layers: usize,
    /// KV row layout.
    pub kv_row: KvRowLayout,
    /// Index key layout.
    pub index_key: IndexKeyLayout,
    /// Whether requests hold index keys (`CapacityPlan::keeps_index`): a tier without them
    /// (dense attention) has no index-key pages and takes resident requests only.
    pub keeps_index: bool,
    /// Positions per page.
    pub page_tokens: usize,
    /// Pages of full KV rows (for resident requests).
    pub kv_pages: usize,
    /// Pages of index keys (for every request).
    pub index_pages: usize,
    /// Hot buffers (for hisparse requests).
    pub seats: usize,
    /// Regular slots per hot buffer (`device_buffer_size`); each seat has one more, reserved.
    pub device_buffer_size: usize,
}

impl DeviceTierConfig {
    /// Device bytes of all buffers (`usize::MAX` if the count overflows: more than any
    /// allocation can give, so such a tier is refused when allocated).
    pub fn bytes(&self) -> usize {
        let m = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c));
        let per_layer = m(self.kv_pages, self.page_tokens, self.kv_row.row_bytes())
            .zip(m(self.seats, self.device_buffer_size.saturating_add(1), self.kv_row.row_bytes()))
            .and_then(|(a, b)| a.checked_add(b));
        let keys = self
            .index_key
            .page_bytes(self.page_tokens)
            .ok()
            .and_then(|page| page.checked_mul(self.index_pages))
            .and_then(|k| k.checked_mul(self.index_layers));
        per_layer
            .and_then(|p| p.checked_mul(self.layers))
            .zip(keys)
            .and_then(|(a, b)| a.checked_add(b))
            .unwrap_or(usize::MAX)
    }
}

#[derive(Clone, Copy, Debug)]
struct Held {
    mode: Mode,
    seat: Option<u32>,
}

/// The device tier. See the module documentation.
pub struct DeviceTier<M: DeviceMemory> {
    mem: M,
    cfg: DeviceTierConfig,
    kv: Vec<M::Buffer<u8>>,
    keys: Vec<M::Buffer<u8>>,
    hot: Vec<M::Buffer<u8>>,
    kv_pages: PagePool,
    index_pages: PagePool,
    seats: PagePool,
    held: HashMap<RequestId, Held>,
}

impl<M: DeviceMemory> DeviceTier<M> {
    /// Allocates every buffer of `cfg` in `mem`.
    pub fn new(mem: M, cfg: DeviceTierConfig) -> Result<Self> {
        for (field, v) in
            [("layers", cfg.layers), ("page_tokens", cfg.page_tokens), ("device_buffer_size", cfg.device_buffer_size)]
        {
            if v == 0 {
                return Err(MemoryError::invalid(field, v, "must be at least 1"));
            }
        }
        let kvb = cfg.kv_row.row_bytes();
        let key_page = cfg.index_key.page_bytes(cfg.page_tokens)?;
        if cfg.index_layers == 0 || cfg.index_layers > cfg.layers {
            return Err(MemoryError::invalid(
                "index_layers",
                cfg.index_layers,
                format!("must be in 1..={}", cfg.layers),
            ));
        }
        if !cfg.keeps_index && (cfg.index_pages > 0 || cfg.seats > 0) {
            return Err(MemoryError::invalid(
                "keeps_index",
                false,
                "a tier without index keys has neither index-key pages nor hot-buffer seats",
            ));
        }
        let pools = |layers: usize, n: usize| -> Result<Vec<M::Buffer<u8>>> {
            (0..layers).map(|_| mem.alloc_zeroed::<u8>(n)).collect()
        };
        let alloc = |n: usize| pools(cfg.layers, n);
        let size = |field: &'static str, v: usize, a: usize, b: usize| {
            v.checked_mul(a)
                .and_then(|x| x.checked_mul(b))
                .ok_or_else(|| MemoryError::invalid(field, v, "its buffer size overflows"))
        };
        let kv = alloc(size("kv_pages", cfg.kv_pages, cfg.page_tokens, kvb)?)?;
        let keys = pools(cfg.index_layers, size("index_pages", cfg.index_pages, 1, key_page)?)?;
        let hot = alloc(size("seats", cfg.seats, cfg.device_buffer_size.saturating_add(1), kvb)?)?;
        Ok(Self {
            kv_pages: PagePool::new("device KV pages", cfg.kv_pages)?,
            index_pages: PagePool::new("device index-key pages", cfg.index_pages)?,
            seats: PagePool::new("device hot-buffer seats", cfg.seats)?,
            mem,
            cfg,
            kv,
            keys,
            hot,
            held: HashMap::new(),
        })
    }

    /// The memory the buffers live in.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The capacities.
    pub fn config(&self) -> &DeviceTierConfig {
        &self.cfg
    }

    /// Registers `req` in `mode`: a hisparse request takes a seat now (all or nothing).
    pub fn register(&mut self, req: RequestId, mode: Mode) -> Result<()> {
        if self.held.contains_key(&req) {
            return Err(MemoryError::DuplicateRequest { pool: "device tier", request: req.0 });
        }
        let seat = if mode == Mode::HiSparse {
            self.seats.register(req)?;
            match self.seats.grow_to(req, 1) {
                Ok(s) => Some(s[0]),
                Err(e) => {
                    self.seats.release(req)?;
                    return Err(e);
                }
            }
        } else {
            None
        };
        if self.cfg.keeps_index {
            self.index_pages.register(req)?;
        }
        if mode == Mode::Resident {
            self.kv_pages.register(req)?;
        }
        self.held.insert(req, Held { mode, seat });
        Ok(())
    }

    fn held(&self, req: RequestId) -> Result<Held> {
        self.held.get(&req).copied().ok_or(MemoryError::UnknownRequest { pool: "device tier", request: req.0 })
    }

    /// Makes room for positions `0..tokens` of `req`: index keys, and full KV rows for a
    /// resident request (all or nothing).
    pub fn grow(&mut self, req: RequestId, tokens: usize) -> Result<()> {
        let held = self.held(req)?;
        let pages = tokens.div_ceil(self.cfg.page_tokens);
        if held.mode == Mode::Resident {
            let more_kv = pages.saturating_sub(self.kv_pages.pages(req)?.len());
            if more_kv > self.kv_pages.free() {
                return Err(MemoryError::CapacityExhausted {
                    pool: "device KV pages",
                    needed: more_kv,
                    free: self.kv_pages.free(),
                    unit: "pages",
                });
            }
        }
        if self.cfg.keeps_index {
            self.index_pages.grow_to(req, pages)?;
        }
        if held.mode == Mode::Resident {
            // Room was checked above, so this cannot fail.
            self.kv_pages.grow_to(req, pages)?;
        }
        Ok(())
    }

    /// Frees everything `req` holds.
    pub fn release(&mut self, req: RequestId) -> Result<()> {
        let held = self.held.remove(&req).ok_or(MemoryError::UnknownRequest { pool: "device tier", request: req.0 })?;
        if self.cfg.keeps_index {
            self.index_pages.release(req)?;
        }
        if held.mode == Mode::Resident {
            self.kv_pages.release(req)?;
        }
        if held.seat.is_some() {
            self.seats.release(req)?;
        }
        Ok(())
    }

    fn paged_row(&self, pool: &PagePool, name: &'static str, req: RequestId, position: usize) -> Result<usize> {
        let pages = pool.pages(req)?;
        let p = pages.get(position / self.cfg.page_tokens).ok_or(MemoryError::PositionOutOfRange {
            pool: name,
            request: req.0,
            position,
            capacity: pages.len() * self.cfg.page_tokens,
        })?;
        Ok(*p as usize * self.cfg.page_tokens + position % self.cfg.page_tokens)
    }

    /// Row of the index-key buffers (any layer) holding `req`'s key at `position` (of
    /// `index_key.row_bytes()`; a page summary's row holds the positions that share it). Refused
    /// in a tier that keeps no index keys.
    pub fn index_key_row(&self, req: RequestId, position: usize) -> Result<usize> {
        if !self.cfg.keeps_index {
            return Err(MemoryError::invalid("keeps_index", false, "this tier holds no index keys"));
        }
        // Summaries divide the page (checked when the tier was sized): a page's rows are whole.
        Ok(self.paged_row(&self.index_pages, "device index keys", req, position)?
            / self.cfg.index_key.positions_per_row())
    }

    /// Row of the KV buffers (any layer) holding resident `req`'s row at `position`.
    pub fn kv_row(&self, req: RequestId, position: usize) -> Result<usize> {
        self.paged_row(&self.kv_pages, "device KV", req, position)
    }

    /// Row of the hot-buffer buffers (any layer) of hisparse `req`'s `slot` (the reserved slot
    /// is `device_buffer_size`).
    pub fn hot_row(&self, req: RequestId, slot: usize) -> Result<usize> {
        let seat = self
            .held(req)?
            .seat
            .ok_or_else(|| MemoryError::invalid("mode", "resident", format!("request {req} has no hot buffer")))?;
        if slot > self.cfg.device_buffer_size {
            return Err(MemoryError::invalid(
                "slot",
                slot,
                format!("a hot buffer has {} slots", hot_buffer_rows_of(self.cfg.device_buffer_size)),
            ));
        }
        // Seats and slots are bounded by the pool, whose rows fit an i32 (KvCache::new).
        Ok(hot_seat_base(u64::from(seat), self.cfg.device_buffer_size as u64) as usize + slot)
    }

    /// The hot-buffer seat of hisparse `req` (its rows start at [`hot_seat_base`]).
    pub fn seat(&self, req: RequestId) -> Result<usize> {
        Ok(self.hot_row(req, 0)? / hot_buffer_rows_of(self.cfg.device_buffer_size))
    }

    /// Every layer's hot-buffer pool (a swap-in that prefetches into several layers).
    pub fn hot_pools_mut(&mut self) -> &mut [M::Buffer<u8>] {
        &mut self.hot
    }

    /// The index-key pages `req` holds, in position order (for the indexer's page table):
    /// none in a tier that keeps no index keys.
    pub fn index_pages(&self, req: RequestId) -> Result<&[u32]> {
        if !self.cfg.keeps_index {
            self.held(req)?;
            return Ok(&[]);
        }
        self.index_pages.pages(req)
    }

    /// The KV pages resident `req` holds, in position order.
    pub fn kv_pages(&self, req: RequestId) -> Result<&[u32]> {
        self.kv_pages.pages(req)
    }

    fn layer(&self, layer: usize) -> Result<()> {
        if layer < self.cfg.layers {
            Ok(())
        } else {
            Err(MemoryError::invalid("layer", layer, format!("the device tier has {} layers", self.cfg.layers)))
        }
    }

    /// Writes `req`'s index key at `position` of key pool `pool` (the index slot of a full
    /// layer, `KvGeometry::index_slot`). A page summary's key (a box of one point) starts its
    /// row at the row's first position and is folded into it at the others.
    pub fn write_index_key(&mut self, req: RequestId, pool: usize, position: usize, key: &[u8]) -> Result<()> {
        if pool >= self.cfg.index_layers {
            return Err(MemoryError::invalid(
                "pool",
                pool,
                format!("the tier has {} key pools", self.cfg.index_layers),
            ));
        }
        let b = self.cfg.index_key.row_bytes();
        check_len("key", b, key.len())?;
        let row = self.index_key_row(req, position)?;
        if position.is_multiple_of(self.cfg.index_key.positions_per_row()) {
            return self.mem.write(&mut self.keys[pool], row * b, key);
        }
        let mut summary = vec![0u8; b];
        self.mem.read(&self.keys[pool], row * b, &mut summary)?;
        self.cfg.index_key.fold(&mut summary, key)?;
        self.mem.write(&mut self.keys[pool], row * b, &summary)
    }

    /// Writes resident `req`'s KV row at `position` of `layer`.
    pub fn write_kv_row(&mut self, req: RequestId, layer: usize, position: usize, bytes: &[u8]) -> Result<()> {
        self.layer(layer)?;
        let b = self.cfg.kv_row.row_bytes();
        check_len("row", b, bytes.len())?;
        let row = self.kv_row(req, position)?;
        self.mem.write(&mut self.kv[layer], row * b, bytes)
    }

    /// Writes hisparse `req`'s hot-buffer `slot` of `layer`.
    pub fn write_hot_row(&mut self, req: RequestId, layer: usize, slot: usize, bytes: &[u8]) -> Result<()> {
        self.layer(layer)?;
        let b = self.cfg.kv_row.row_bytes();
        check_len("row", b, bytes.len())?;
        let row = self.hot_row(req, slot)?;
        self.mem.write(&mut self.hot[layer], row * b, bytes)
    }

    /// Reads hisparse `req`'s hot-buffer `slot` of `layer`.
    pub fn read_hot_row(&self, req: RequestId, layer: usize, slot: usize, out: &mut [u8]) -> Result<()> {
        self.layer(layer)?;
        let b = self.cfg.kv_row.row_bytes();
        check_len("out", b, out.len())?;
        let row = self.hot_row(req, slot)?;
        self.mem.read(&self.hot[layer], row * b, out)
    }

    /// The index-key buffer of key pool `pool` (rows of `index_key.row_bytes()`; the pool of a
    /// full layer is its `KvGeometry::index_slot`).
    pub fn keys(&self, pool: usize) -> &M::Buffer<u8> {
        &self.keys[pool.min(self.cfg.index_layers - 1)]
    }

    /// The resident KV buffer of `layer`.
    pub fn kv(&self, layer: usize) -> &M::Buffer<u8> {
        &self.kv[layer.min(self.cfg.layers - 1)]
    }

    /// The hot-buffer buffer of `layer`.
    pub fn hot(&self, layer: usize) -> &M::Buffer<u8> {
        &self.hot[layer.min(self.cfg.layers - 1)]
    }

    /// The index-key buffer of key pool `pool`, writable (for batched writes).
    pub fn keys_mut(&mut self, pool: usize) -> &mut M::Buffer<u8> {
        let p = pool.min(self.cfg.index_layers - 1);
        &mut self.keys[p]
    }

    /// The resident KV buffer of `layer`, writable (for batched writes).
    pub fn kv_mut(&mut self, layer: usize) -> &mut M::Buffer<u8> {
        let l = layer.min(self.cfg.layers - 1);
        &mut self.kv[l]
    }

    /// The hot-buffer buffer of `layer`, writable (for swap-in copies).
    pub fn hot_mut(&mut self, layer: usize) -> &mut M::Buffer<u8> {
        let l = layer.min(self.cfg.layers - 1);
        &mut self.hot[l]
    }

    /// Device bytes held by live requests (all layers).
    pub fn bytes_in_use(&self) -> usize {
        // No overflow: at most what the tier allocated.
        let per_layer = self.kv_pages.used() * self.cfg.page_tokens * self.cfg.kv_row.row_bytes()
            + self.seats.used() * hot_buffer_rows_of(self.cfg.device_buffer_size) * self.cfg.kv_row.row_bytes();
        let keys = self.index_pages.used() * self.cfg.index_key.page_bytes(self.cfg.page_tokens).unwrap_or(0);
        per_layer * self.cfg.layers + keys * self.cfg.index_layers
    }

    /// Live requests.
    pub fn requests(&self) -> usize {
        self.held.len()
    }

    /// Checks every pool's invariant.
    pub fn check(&self) -> Result<()> {
        self.kv_pages.check()?;
        self.index_pages.check()?;
        self.seats.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_memory::EmulatedDevice;
    use crate::row::KvRowFormat;

    fn tier() -> DeviceTier<EmulatedDevice> {
        let cfg = DeviceTierConfig {
            layers: 2,
            index_layers: 2,
            kv_row: KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap(),
            index_key: IndexKeyLayout::new(128).unwrap(),
            keeps_index: true,
            page_tokens: 4,
            kv_pages: 6,
            index_pages: 8,
            seats: 2,
            device_buffer_size: 3,
        };
        DeviceTier::new(EmulatedDevice, cfg).unwrap()
    }

    #[test]
    fn a_tier_without_index_keys_holds_kv_rows_only() {
        let dense = DeviceTierConfig { keeps_index: false, index_pages: 0, seats: 0, ..tier().config().clone() };
        let mut t = DeviceTier::new(EmulatedDevice, dense.clone()).unwrap();
        let r = RequestId(1);
        t.register(r, Mode::Resident).unwrap();
        t.grow(r, 10).unwrap();
        assert_eq!(t.index_pages(r).unwrap(), &[] as &[u32]);
        assert!(t.index_pages(RequestId(9)).is_err(), "an unknown request is still refused");
        let e = t.index_key_row(r, 0).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "keeps_index", .. }), "{e}");
        assert!(t.write_index_key(r, 0, 0, &[1u8; 132]).is_err());
        assert_eq!(t.bytes_in_use(), 2 * 3 * 4 * 656, "3 KV pages in 2 layers, no keys");
        assert!(t.register(RequestId(2), Mode::HiSparse).is_err(), "no seats");
        t.release(r).unwrap();
        assert_eq!(t.bytes_in_use(), 0);
        t.check().unwrap();
        for bad in [DeviceTierConfig { index_pages: 1, ..dense.clone() }, DeviceTierConfig { seats: 1, ..dense }] {
            let e = DeviceTier::new(EmulatedDevice, bad).err().unwrap();
            assert!(matches!(e, MemoryError::InvalidField { field: "keeps_index", .. }), "{e}");
        }
    }

    #[test]
    fn both_modes_hold_their_rows_and_free_them() {
        let mut t = tier();
        let (res, hs) = (RequestId(1), RequestId(2));
        t.register(res, Mode::Resident).unwrap();
        t.register(hs, Mode::HiSparse).unwrap();
        t.grow(res, 10).unwrap();
        t.grow(hs, 17).unwrap();
        assert!(matches!(t.hot_row(res, 0), Err(MemoryError::InvalidField { field: "mode", .. })));
        assert!(matches!(t.kv_row(hs, 0), Err(MemoryError::UnknownRequest { .. })));
        let row: Vec<u8> = (0..656).map(|i| (i % 251) as u8).collect();
        t.write_kv_row(res, 1, 9, &row).unwrap();
        t.write_hot_row(hs, 1, 3, &row).unwrap();
        t.write_index_key(hs, 0, 16, &row[..132]).unwrap();
        let mut out = vec![0u8; 656];
        t.read_hot_row(hs, 1, 3, &mut out).unwrap();
        assert_eq!(out, row);
        let at = t.kv_row(res, 9).unwrap() * 656;
        assert_eq!(&t.kv(1)[at..at + 656], row.as_slice());
        assert!(t.write_kv_row(res, 0, 12, &row).is_err(), "position beyond the grown pages");
        assert!(t.write_hot_row(hs, 0, 4, &row).is_err(), "3 regular slots + the reserved slot 3");
        // 3 KV pages + 3 index pages for the resident request, 5 index pages + 1 seat for the other.
        let want = 2 * (3 * 4 * 656 + 8 * 4 * 132 + 4 * 656);
        assert_eq!(t.bytes_in_use(), want);
        t.release(res).unwrap();
        t.release(hs).unwrap();
        assert_eq!(t.bytes_in_use(), 0);
        t.check().unwrap();
    }

    #[test]
    fn a_failed_grow_or_register_leaks_nothing() {
        let mut t = tier();
        let (a, b, c) = (RequestId(1), RequestId(2), RequestId(3));
        t.register(a, Mode::Resident).unwrap();
        t.grow(a, 20).unwrap(); // 5 KV pages, 5 index pages
        t.register(b, Mode::Resident).unwrap();
        let e = t.grow(b, 8).unwrap_err(); // needs 2 KV pages, 1 free
        assert!(matches!(e, MemoryError::CapacityExhausted { pool: "device KV pages", .. }), "{e}");
        assert_eq!(t.index_pages(b).unwrap().len(), 0, "index pages untouched by the failed grow");
        t.register(c, Mode::HiSparse).unwrap();
        t.register(RequestId(4), Mode::HiSparse).unwrap();
        let e = t.register(RequestId(5), Mode::HiSparse).unwrap_err();
        assert!(matches!(e, MemoryError::CapacityExhausted { pool: "device hot-buffer seats", .. }), "{e}");
        assert!(t.grow(RequestId(5), 1).is_err(), "the refused request holds nothing");
        t.check().unwrap();
    }
}
