//! Hybrid placement ([`Mode::Hybrid`]): where each request's KV lives between steps, and the
//! copies that move it. A request is admitted with hisparse's whole-life reservation (a seat,
//! host pages, index keys), so it can always live in its hot buffer; meanwhile its whole KV sits
//! in pages of the device's shared pool when they are free, and attention reads it there by
//! position, with no swap-in and no backup. Demotion (device → host tier, pages freed, the hot
//! buffer made fresh) happens only when admitting a request needs the pages, victims in
//! [`DemotionOrder`]; promotion (host tier → pages) at the start of a step, when pages are free.
//! Every copy is counted in [`PlacementCounters`].
//!
//! Invariant: a request on the device holds pages for its whole reservation, so a step never
//! needs a page; a demoted request's host rows hold every position it has, as hisparse's do.

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

    /// Frees the rows of the seat the next admission takes: pages over it move above it where
    /// free pages allow, else requests on the device are demoted in order.
    pub(super) fn clear_next_seat(&mut self) -> Result<()> {
        while let Some(&(owner, index)) = self.device.pages_over_next_seat()?.first() {
            if self.device.can_move_page()? {
                let bytes = self.device.move_page(owner, index)?;
                self.placement.moved_pages += 1;
                self.placement.bytes_moved += bytes as u64;
            } else {
                // A request on the device holds the page over the seat: there is a victim.
                let victim = self.next_victim(None)?.unwrap_or(owner);
                self.demote(victim)?;
            }
        }
        Ok(())
    }

    /// Places admitted-to-be request `id` (registered, holding its seat) on the device for
    /// `reserve` positions when the pool can give the pages, demoting others in order where
    /// that makes room; returns whether it is on the device.
    pub(super) fn place_new(&mut self, id: RequestId, reserve: usize) -> Result<bool> {
        let want = self.device.pages_for(reserve).max(1);
        let on_device: usize =
            self.requests.keys().map(|&r| Ok(self.device.kv_pages(r)?.len())).sum::<Result<usize>>()?;
        if self.device.usable_free_pages()? + on_device < want {
            return Ok(false);
        }
        while self.device.usable_free_pages()? < want {
            let Some(victim) = self.next_victim(Some(id))? else { return Ok(false) };
            self.demote(victim)?;
        }
        self.device.place_pages(id, reserve)?;
        Ok(true)
    }

    /// Copies request `id`'s rows of positions `0..t` between its device pages and the host
    /// tier, in every layer, one page's rows at a time (a page's rows are consecutive in every
    /// layer's pool; the staging is bounded by the page): to the host, then also into its hot
    /// buffer's slots by position where `preload`, or back to the device. Returns the bytes.
    fn copy_pages(&mut self, id: RequestId, t: usize, to_host: bool, preload: bool) -> Result<u64> {
        let (layers, pt, rb) = (self.cfg.geometry.layers, self.cfg.hisparse.page_tokens, self.kv_row.row_bytes());
        let runs = (0..t.div_ceil(pt))
            .map(|j| Ok((j * pt, self.device.kv_row(id, j * pt)?, pt.min(t - j * pt))))
            .collect::<Result<Vec<_>>>()?;
        let mem = self.backend.memory().clone();
        let mut page = vec![0u8; pt * rb];
        let no_host = || EngineError::Worker("hybrid mode without a host tier".into());
        for l in 0..layers {
            for &(first, row, n) in &runs {
                let rows = &mut page[..n * rb];
                if !to_host {
                    let host = self.host.as_ref().ok_or_else(no_host)?;
                    for (p, out) in rows.chunks_exact_mut(rb).enumerate() {
                        host.read_row(id, l, first + p, out)?;
                    }
                    mem.write(self.device.kv_mut(l), row * rb, rows)?;
                    continue;
                }
                mem.read(self.device.kv(l), row * rb, rows)?;
                self.host.as_mut().ok_or_else(no_host)?.write_rows(id, l, first, rows)?;
                if preload {
                    // A KV shorter than the buffer: position p in slot p, as admission places it.
                    let slots = (first..first + n).map(|p| Ok(self.device.hot_row(id, p)? as u32));
                    let slots = slots.collect::<Result<Vec<_>>>()?;
                    self.backend.write_rows(self.device.hot_mut(l), rb, &slots, rows)?;
                }
            }
        }
        Ok((t * rb * layers) as u64)
    }

    /// Moves request `id` from device pages to its hot buffer and the host tier: every row it
    /// has copied to the host a page at a time, a KV shorter than the buffer also into its slots
    /// as admission does, its seat made fresh, its pages freed.
    pub(crate) fn demote(&mut self, id: RequestId) -> Result<()> {
        let t = self.request(id)?.seq_len;
        let preload = t < self.cfg.hisparse.device_buffer_size;
        let bytes = self.copy_pages(id, t, true, preload)?;
        if let Some(swap) = self.swap.as_mut() {
            swap.reset_seat(self.device.seat(id)?, if preload { t } else { 0 })?;
        }
        self.device.drop_pages(id)?;
        self.placement.demotions += 1;
        self.placement.bytes_demoted += bytes;
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
            if self.device.usable_free_pages()? < self.device.pages_for(reserved).max(1) {
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
        self.device.place_pages(id, reserved)?;
        let bytes = self.copy_pages(id, t, false, false)?;
        self.placement.promotions += 1;
        self.placement.bytes_promoted += bytes;
        Ok(())
    }
}
