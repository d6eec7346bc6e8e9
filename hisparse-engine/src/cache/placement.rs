//! Hybrid placement ([`Mode::Hybrid`]): where each request's KV lives between steps, and the
//! copies that move it. A request is admitted with hisparse's whole-life reservation (a seat,
//! host pages, index keys), so it can always live in a hot buffer; meanwhile its whole KV sits
//! in pages of the device's shared pool when they are free, and attention reads it there by
//! position, with no swap-in and no backup. The seat's rows are taken only while the request is
//! off the device, so a request in pages leaves them to other requests' pages. Where every layer
//! keeps index keys they live in the same pool, taken for a request's reservation as it is
//! admitted. A new request goes into pages where they are free, else into a seat. Demotion
//! (device → host tier, pages freed, a seat taken and made fresh) happens only when a seat being
//! taken (admitting a request, or demoting one) lies under pages that cannot move, when a new
//! reservation's index keys find too few free key pages, victims in [`DemotionOrder`], or when a
//! request's reservation grows past the free pages; promotion (host tier → pages, the seat freed)
//! at the start of a step, when pages are free. Every copy is counted in [`PlacementCounters`].
//!
//! Invariant: a hybrid request holds either pages for its whole reservation (on the device) or
//! a seat (off it), never both between calls, so a step never needs a page or a seat; a request
//! off the device has every position it has in the host tier, as hisparse's do.

use hisparse_kernels::{Backend, DeviceSwapIn, RowBackup};
use hisparse_memory::{DeviceMemory, Mode, RequestId};
use serde::{Deserialize, Serialize};

use super::KvCache;
use crate::error::{EngineError, Result};
use crate::metrics::PlacementCounters;

/// Which requests on the device are demoted first when admitting another needs their pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DemotionOrder {
    /// The earliest admitted first.
    #[default]
    Oldest,
    /// The largest reservation first (frees the most pages per copy).
    Largest,
}

impl DemotionOrder {
    /// Every order, by name.
    pub const NAMES: [&'static str; 2] = ["oldest", "largest"];

    /// The order named `name` (`oldest` or `largest`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "oldest" => Some(Self::Oldest),
            "largest" => Some(Self::Largest),
            _ => None,
        }
    }
}

/// The shared pool found no room that its plan guarantees (a broken invariant, reported).
fn no_room(what: &str, id: RequestId) -> EngineError {
    EngineError::Worker(format!(
        "hybrid placement found no room for {what} of request {id} with no request left to demote"
    ))
}

/// A hybrid cache's copies need its host tier (every hybrid cache has one).
fn no_host_tier() -> EngineError {
    EngineError::Worker("hybrid mode without a host tier".into())
}

impl<B: Backend> KvCache<B>
where
    B::Memory: Clone,
{
    /// What hybrid placement moved so far (all zero in the other modes).
    pub fn placement(&self) -> PlacementCounters {
        self.placement
    }

    /// Whether request `id`'s whole KV is on the device now (always in resident mode, never in
    /// hisparse mode).
    pub fn on_device(&self, id: RequestId) -> Result<bool> {
        self.request(id)?;
        Ok(match self.cfg.mode {
            Mode::Resident => true,
            Mode::HiSparse => false,
            Mode::Hybrid => self.device.holds_pages(id)?,
        })
    }

    /// The request on the device to demote next, in the configured order, other than `keep`.
    fn next_victim(&self, keep: Option<RequestId>) -> Result<Option<RequestId>> {
        let mut best: Option<(RequestId, (usize, u64))> = None;
        for (&id, r) in &self.requests {
            if Some(id) == keep || !self.device.holds_pages(id)? {
                continue;
            }
            // Smaller key first: the oldest admission, or the largest reservation.
            let key = match self.cfg.demotion {
                DemotionOrder::Oldest => (0, r.admitted),
                DemotionOrder::Largest => (usize::MAX - r.reserved, r.admitted),
            };
            if best.is_none_or(|(_, k)| key < k) {
                best = Some((id, key));
            }
        }
        Ok(best.map(|(id, _)| id))
    }

    /// Frees the bytes of the next seat: pages over it (KV rows or index keys) move above it where
    /// free slots allow, else requests on the device are demoted in order.
    fn clear_next_seat(&mut self) -> Result<()> {
        while let Some(&(owner, part, index)) = self.device.parts_over_next_seat()?.first() {
            if self.device.can_move_page(part)? {
                let bytes = self.device.move_page(owner, part, index)?;
                self.placement.moved_pages += 1;
                self.placement.bytes_moved += bytes as u64;
            } else {
                // No slot is free above the seat: demoting a request on the device frees its KV
                // pages. With none on the device, seats and keys fit by the plan (the pool rounds
                // its seats up to whole key pages, `SharedPoolShape::bytes`), so a slot was free.
                let victim = self.next_victim(None)?.ok_or_else(|| no_room("a seat", owner))?;
                self.demote(victim)?;
            }
        }
        Ok(())
    }

    /// Gives request `id` the index keys of positions `0..tokens` (its reservation) where they
    /// live in the shared pool, demoting requests on the device in order while too few key
    /// pages are free.
    pub(super) fn take_keys(&mut self, id: RequestId, tokens: usize) -> Result<()> {
        while !self.device.can_take_keys(id, tokens)? {
            // Admission reserved the keys: with no request on the device, they fit by the plan.
            let victim = self.next_victim(None)?.ok_or_else(|| no_room("index keys", id))?;
            self.demote(victim)?;
        }
        Ok(self.device.take_keys(id, tokens)?)
    }

    /// Gives request `id` (holding no pages) a seat, clearing its rows first.
    fn take_seat(&mut self, id: RequestId) -> Result<usize> {
        self.clear_next_seat()?;
        Ok(self.device.take_seat(id)?)
    }

    /// Places admitted-to-be request `id` (registered) on the device for `reserve` positions when
    /// the pool has the pages free; otherwise it takes a seat (demoting others only where their
    /// pages lie over the seat: a request on the device is never demoted to place another, which
    /// would copy a whole KV for no request more on the device). Returns whether it is on the
    /// device.
    pub(super) fn place_new(&mut self, id: RequestId, reserve: usize) -> Result<bool> {
        if self.device.can_place_pages(reserve)? {
            self.device.place_pages(id, reserve)?;
            return Ok(true);
        }
        self.take_seat(id)?;
        Ok(false)
    }

    /// Copies request `id`'s rows of positions `0..t` between its device pages and the host
    /// tier, in every layer, one page's rows at a time (a page's rows are consecutive in every
    /// layer's pool; the staging is bounded by the page). Returns the bytes.
    fn copy_pages(&mut self, id: RequestId, t: usize, to_host: bool) -> Result<u64> {
        let (layers, pt, rb) = (self.cfg.geometry.layers, self.cfg.hisparse.page_tokens, self.kv_row.row_bytes());
        let runs = (0..t.div_ceil(pt))
            .map(|j| Ok((j * pt, self.device.kv_row(id, j * pt)?, pt.min(t - j * pt))))
            .collect::<Result<Vec<_>>>()?;
        let mem = self.backend.memory().clone();
        let mut page = vec![0u8; pt * rb];
        for l in 0..layers {
            for &(first, row, n) in &runs {
                let rows = &mut page[..n * rb];
                if to_host {
                    mem.read(self.device.kv(l), row * rb, rows)?;
                    self.host.as_mut().ok_or_else(no_host_tier)?.write_rows(id, l, first, rows)?;
                } else {
                    self.read_host_rows(id, l, first, rows)?;
                    mem.write(self.device.kv_mut(l), row * rb, rows)?;
                }
            }
        }
        Ok((t * rb * layers) as u64)
    }

    /// Moves request `id` from device pages to a hot buffer and the host tier: every row it has
    /// copied to the host a page at a time, its pages freed, a seat taken and made fresh (a KV
    /// shorter than the buffer also read back into its slots, as admission places it).
    pub(crate) fn demote(&mut self, id: RequestId) -> Result<()> {
        let t = self.request(id)?.seq_len;
        let bytes = self.copy_pages(id, t, true)?;
        self.device.drop_pages(id)?;
        let seat = self.take_seat(id)?;
        let preload = t < self.cfg.hisparse.device_buffer_size;
        if preload {
            self.preload_from_host(id, t)?;
        }
        if let Some(swap) = self.swap.as_mut() {
            swap.reset_seat(seat, if preload { t } else { 0 })?;
        }
        self.placement.demotions += 1;
        self.placement.bytes_demoted += bytes;
        Ok(())
    }

    /// Writes positions `0..t` of request `id` from the host tier into its hot buffer's slots by
    /// position, in every layer (a KV shorter than the buffer, as admission preloads it).
    fn preload_from_host(&mut self, id: RequestId, t: usize) -> Result<()> {
        let rb = self.kv_row.row_bytes();
        let slots = (0..t).map(|p| Ok(self.device.hot_row(id, p)? as u32)).collect::<Result<Vec<_>>>()?;
        let mut rows = vec![0u8; t * rb];
        for l in 0..self.cfg.geometry.layers {
            self.read_host_rows(id, l, 0, &mut rows)?;
            self.backend.write_rows(self.device.hot_mut(l), rb, &slots, &rows)?;
        }
        Ok(())
    }

    /// Reads request `id`'s host rows of `layer` from position `first` into `rows` (whole rows).
    fn read_host_rows(&self, id: RequestId, layer: usize, first: usize, rows: &mut [u8]) -> Result<()> {
        let host = self.host.as_ref().ok_or_else(no_host_tier)?;
        for (p, out) in rows.chunks_exact_mut(self.kv_row.row_bytes()).enumerate() {
            host.read_row(id, layer, first + p, out)?;
        }
        Ok(())
    }

    /// Moves demoted requests back to device pages while the pool has them free (smallest
    /// reservation first): every row read back from the host tier once its backups landed.
    pub(super) fn promote_where_room(&mut self) -> Result<()> {
        if self.cfg.mode != Mode::Hybrid {
            return Ok(());
        }
        let mut demoted = Vec::new();
        for (&id, r) in &self.requests {
            if !self.device.holds_pages(id)? {
                demoted.push((r.reserved, id));
            }
        }
        demoted.sort_unstable();
        for (reserved, id) in demoted {
            if !self.device.can_place_pages(reserved)? {
                break;
            }
            self.promote(id)?;
        }
        Ok(())
    }

    fn promote(&mut self, id: RequestId) -> Result<()> {
        let (t, reserved) = {
            let r = self.request(id)?;
            (r.seq_len, r.reserved)
        };
        if let Some(bk) = self.backup.as_mut() {
            bk.wait_all()?;
        }
        self.device.release_seat(id)?;
        self.device.place_pages(id, reserved)?;
        let bytes = self.copy_pages(id, t, false)?;
        self.placement.promotions += 1;
        self.placement.bytes_promoted += bytes;
        Ok(())
    }
}
