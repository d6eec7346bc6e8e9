//! `DeviceTier`: what lives in a backend's device memory, per layer: the index keys of every
//! token of every live request (in the layers that run an indexer: `index_layers` key pools),
//! the hot buffers of hisparse requests (`device_buffer_size`
//! regular slots plus the reserved newest slot, one "seat" per request), and the full KV rows of
//! resident requests. Pages of `page_tokens` positions are shared across layers: a request holds
//! the same page ids (and seat) in every layer's buffer. In hybrid placement (`shared_pool`) the
//! KV pages are cut from the hot buffers' bytes, one pool per layer ([`SharedPool`]), and so are
//! the index keys where every layer keeps them (`DeviceTierConfig::keys_in_shared_pool`: a layer's
//! keys then live in its own pool); `hybrid.rs` places a request's pages, drops them and moves
//! them.

use std::collections::HashMap;

use crate::device_memory::DeviceMemory;
use crate::error::{MemoryError, Result, check_len};
use crate::page_pool::PagePool;
use crate::request::{Mode, RequestId};
use crate::row::{IndexKeyLayout, KvRowLayout};
mod hybrid;
mod shared_pool;

pub use shared_pool::{Part, SharedPool, SharedPoolShape};

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
    /// Hybrid placement: the `kv_pages` are cut from the seats' rows (one pool per layer, no KV
    /// buffer of their own), and so are the `index_pages` where
    /// [`DeviceTierConfig::keys_in_shared_pool`].
    pub shared_pool: bool,
}

impl DeviceTierConfig {
    /// Whether the index keys live in the shared pool (hybrid placement where every layer keeps
    /// keys: a layer's key pages beside its seats and KV pages, so that memory no request's keys
    /// need holds KV pages); otherwise they have buffers of their own.
    pub fn keys_in_shared_pool(&self) -> bool {
        self.shared_pool && self.keeps_index && self.index_layers == self.layers
    }

    /// The shape of the shared pool of each layer (hybrid placement).
    pub fn shared_pool_shape(&self) -> Result<SharedPoolShape> {
        let key_pages = match self.keys_in_shared_pool() {
            true => Some((self.index_key.page_bytes(self.page_tokens)?, self.index_pages)),
            false => None,
        };
        Ok(SharedPoolShape {
            seats: self.seats,
            device_buffer_size: self.device_buffer_size,
            kv_row_bytes: self.kv_row.row_bytes(),
            page_tokens: self.page_tokens,
            key_pages,
        })
    }

    /// Bytes of each layer's hot-buffer pool (in hybrid placement, the shared pool); `None` on
    /// overflow.
    fn hot_pool_bytes(&self) -> Option<usize> {
        if self.shared_pool {
            return self.shared_pool_shape().ok()?.bytes();
        }
        self.seats.checked_mul(self.device_buffer_size.checked_add(1)?)?.checked_mul(self.kv_row.row_bytes())
    }

    /// Device bytes of all buffers (`usize::MAX` if the count overflows: more than any
    /// allocation can give, so such a tier is refused when allocated).
    pub fn bytes(&self) -> usize {
        let m = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c));
        let kv_pages = if self.shared_pool { 0 } else { self.kv_pages };
        let per_layer = m(kv_pages, self.page_tokens, self.kv_row.row_bytes())
            .zip(self.hot_pool_bytes())
            .and_then(|(a, b)| a.checked_add(b));
        let own_keys = if self.keys_in_shared_pool() { 0 } else { self.index_pages };
        let keys = self
            .index_key
            .page_bytes(self.page_tokens)
            .ok()
            .and_then(|page| page.checked_mul(own_keys))
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
    /// Hybrid placement's pool of seats and KV pages (`shared_pool`).
    shared: Option<SharedPool>,
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
        let own_kv = if cfg.shared_pool { 0 } else { cfg.kv_pages };
        let own_keys = if cfg.keys_in_shared_pool() { 0 } else { cfg.index_pages };
        let kv = if cfg.shared_pool { Vec::new() } else { alloc(size("kv_pages", own_kv, cfg.page_tokens, kvb)?)? };
        let keys = match cfg.keys_in_shared_pool() {
            true => Vec::new(),
            false => pools(cfg.index_layers, size("index_pages", own_keys, 1, key_page)?)?,
        };
        let hot = alloc(
            cfg.hot_pool_bytes()
                .ok_or_else(|| MemoryError::invalid("seats", cfg.seats, "its buffer size overflows"))?,
        )?;
        let shared = match cfg.shared_pool {
            true => Some(SharedPool::new(cfg.shared_pool_shape()?)?),
            false => None,
        };
        Ok(Self {
            kv_pages: PagePool::new("device KV pages", own_kv)?,
            index_pages: PagePool::new("device index-key pages", own_keys)?,
            seats: PagePool::new("device hot-buffer seats", if cfg.shared_pool { 0 } else { cfg.seats })?,
            shared,
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

    /// Registers `req` in `mode`: a hisparse request takes a seat now (all or nothing); a hybrid
    /// one takes a seat only when it leaves the device ([`DeviceTier::take_seat`]).
    pub fn register(&mut self, req: RequestId, mode: Mode) -> Result<()> {
        if self.held.contains_key(&req) {
            return Err(MemoryError::DuplicateRequest { pool: "device tier", request: req.0 });
        }
        if (mode == Mode::Hybrid) != self.shared.is_some() {
            return Err(MemoryError::invalid("mode", mode, "hybrid placement and a shared pool go together"));
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
        if self.own_keys()
            && let Err(e) = self.index_pages.register(req)
        {
            if seat.is_some() {
                self.seats.release(req)?;
            }
            return Err(e);
        }
        if mode == Mode::Resident {
            self.kv_pages.register(req)?;
        }
        self.held.insert(req, Held { mode, seat });
        Ok(())
    }

    /// Whether index keys live in buffers of their own (kept, and not in the shared pool).
    fn own_keys(&self) -> bool {
        self.cfg.keeps_index && !self.cfg.keys_in_shared_pool()
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
        if let Some(shared) = self.shared.as_ref() {
            let kv = shared.pages(req, Part::KvPage).len();
            let more = if kv > 0 { pages.saturating_sub(kv) } else { 0 };
            let keys = pages.saturating_sub(shared.pages(req, Part::KeyPage).len());
            // Keys in the shared pool are taken for the whole reservation (`take_keys`).
            if self.cfg.keys_in_shared_pool() && keys > 0 {
                return Err(MemoryError::CapacityExhausted {
                    pool: "shared pool index-key pages",
                    needed: keys,
                    free: 0,
                    unit: "pages beyond the request's reservation",
                });
            }
            let free = shared.usable_free(Part::KvPage, more);
            if more > free {
                return Err(MemoryError::CapacityExhausted {
                    pool: "shared pool KV pages",
                    needed: more,
                    free,
                    unit: "pages",
                });
            }
        }
        if self.own_keys() {
            self.index_pages.grow_to(req, pages)?;
        }
        if held.mode == Mode::Resident {
            // Room was checked above, so this cannot fail.
            self.kv_pages.grow_to(req, pages)?;
        }
        if let Some(shared) = self.shared.as_mut()
            && !shared.pages(req, Part::KvPage).is_empty()
        {
            // A request placed on the device grows its pages; room was checked above.
            shared.take_pages(req, Part::KvPage, pages)?;
        }
        Ok(())
    }

    /// Frees everything `req` holds.
    pub fn release(&mut self, req: RequestId) -> Result<()> {
        let held = self.held.remove(&req).ok_or(MemoryError::UnknownRequest { pool: "device tier", request: req.0 })?;
        if self.own_keys() {
            self.index_pages.release(req)?;
        }
        if held.mode == Mode::Resident {
            self.kv_pages.release(req)?;
        }
        if let Some(shared) = self.shared.as_mut() {
            shared.release_pages(req, Part::KvPage);
            shared.release_pages(req, Part::KeyPage);
            shared.release_seat(req);
        } else if held.seat.is_some() {
            self.seats.release(req)?;
        }
        Ok(())
    }

    fn paged_row(&self, pages: &[u32], name: &'static str, req: RequestId, position: usize) -> Result<usize> {
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
        let pages = self.index_pages(req)?;
        Ok(self.paged_row(pages, "device index keys", req, position)? / self.cfg.index_key.positions_per_row())
    }

    /// Row of the KV buffers (any layer) holding resident `req`'s row at `position`.
    pub fn kv_row(&self, req: RequestId, position: usize) -> Result<usize> {
        self.paged_row(self.kv_pages(req)?, "device KV", req, position)
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
        if !self.own_keys() {
            self.held(req)?;
            return Ok(self.shared.as_ref().map_or(&[], |s| s.pages(req, Part::KeyPage)));
        }
        self.index_pages.pages(req)
    }

    /// The KV pages resident `req` holds, in position order.
    pub fn kv_pages(&self, req: RequestId) -> Result<&[u32]> {
        match self.shared.as_ref() {
            Some(shared) => {
                self.held(req)?;
                Ok(shared.pages(req, Part::KvPage))
            }
            None => self.kv_pages.pages(req),
        }
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
            let (mem, buf) = self.memory_and_keys(pool);
            return mem.write(buf, row * b, key);
        }
        let mut summary = vec![0u8; b];
        self.mem.read(self.keys(pool), row * b, &mut summary)?;
        self.cfg.index_key.fold(&mut summary, key)?;
        let (mem, buf) = self.memory_and_keys(pool);
        mem.write(buf, row * b, &summary)
    }

    /// Writes resident `req`'s KV row at `position` of `layer`.
    pub fn write_kv_row(&mut self, req: RequestId, layer: usize, position: usize, bytes: &[u8]) -> Result<()> {
        self.layer(layer)?;
        let b = self.cfg.kv_row.row_bytes();
        check_len("row", b, bytes.len())?;
        let row = self.kv_row(req, position)?;
        let buf = if self.shared.is_some() { &mut self.hot[layer] } else { &mut self.kv[layer] };
        self.mem.write(buf, row * b, bytes)
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
    /// full layer is its `KvGeometry::index_slot`; with keys in the shared pool, that layer's
    /// pool).
    pub fn keys(&self, pool: usize) -> &M::Buffer<u8> {
        let p = pool.min(self.cfg.index_layers - 1);
        if self.cfg.keys_in_shared_pool() {
            return &self.hot[p];
        }
        &self.keys[p]
    }

    /// The resident KV buffer of `layer` (in hybrid placement, the shared pool: the hot buffer).
    pub fn kv(&self, layer: usize) -> &M::Buffer<u8> {
        if self.shared.is_some() {
            return self.hot(layer);
        }
        &self.kv[layer.min(self.cfg.layers - 1)]
    }

    /// The hot-buffer buffer of `layer`.
    pub fn hot(&self, layer: usize) -> &M::Buffer<u8> {
        &self.hot[layer.min(self.cfg.layers - 1)]
    }

    /// The index-key buffer of key pool `pool`, writable (for batched writes).
    pub fn keys_mut(&mut self, pool: usize) -> &mut M::Buffer<u8> {
        self.memory_and_keys(pool).1
    }

    fn memory_and_keys(&mut self, pool: usize) -> (&M, &mut M::Buffer<u8>) {
        let p = pool.min(self.cfg.index_layers - 1);
        match self.cfg.keys_in_shared_pool() {
            true => (&self.mem, &mut self.hot[p]),
            false => (&self.mem, &mut self.keys[p]),
        }
    }

    /// The resident KV buffer of `layer`, writable (for batched writes).
    pub fn kv_mut(&mut self, layer: usize) -> &mut M::Buffer<u8> {
        let l = layer.min(self.cfg.layers - 1);
        if self.shared.is_some() {
            return &mut self.hot[l];
        }
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
        let per_layer = match self.shared.as_ref() {
            Some(s) => s.bytes_used(),
            None => {
                self.kv_pages.used() * self.cfg.page_tokens * self.cfg.kv_row.row_bytes()
                    + self.seats.used() * hot_buffer_rows_of(self.cfg.device_buffer_size) * self.cfg.kv_row.row_bytes()
            }
        };
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
        if let Some(s) = self.shared.as_ref() {
            s.check()?;
        }
        self.seats.check()
    }
}

#[cfg(test)]
mod tests;
