//! Hybrid placement in the device tier: a request's KV pages placed in the shared pool (above
//! the seats in use), dropped when it is demoted, and moved when a seat about to be taken lies
//! under them; a seat taken when a request leaves the device and freed when it comes back. The
//! rows' contents are the caller's to copy in and out (host tier, prompt), except for a moved
//! page, which the tier copies itself in every layer.

use super::DeviceTier;
use super::{Held, SharedPool};
use crate::device_memory::DeviceMemory;
use crate::error::{MemoryError, Result};
use crate::request::RequestId;

impl<M: DeviceMemory> DeviceTier<M> {
    fn shared(&self) -> Result<&SharedPool> {
        self.shared.as_ref().ok_or_else(|| MemoryError::invalid("mode", "not hybrid", "the tier has no shared pool"))
    }

    fn shared_mut(&mut self) -> Result<&mut SharedPool> {
        self.shared.as_mut().ok_or_else(|| MemoryError::invalid("mode", "not hybrid", "the tier has no shared pool"))
    }

    /// Hybrid: whether `req` holds KV pages (its whole KV is on the device, read by position).
    pub fn holds_pages(&self, req: RequestId) -> Result<bool> {
        self.held(req)?;
        Ok(!self.shared()?.pages(req).is_empty())
    }

    /// Hybrid: gives `req` (registered, holding no pages) the lowest free seat, its hot buffer
    /// while it is off the device; refused, changing nothing, while held pages share the seat's
    /// rows ([`DeviceTier::pages_over_next_seat`] names them).
    pub fn take_seat(&mut self, req: RequestId) -> Result<usize> {
        let held = self.held(req)?;
        if held.seat.is_some() || !self.shared()?.pages(req).is_empty() {
            return Err(MemoryError::invalid(
                "request",
                req,
                "a hybrid request takes a seat once, after leaving its pages",
            ));
        }
        let seat = self.shared_mut()?.take_seat(req)?;
        self.held.insert(req, Held { seat: Some(seat), ..held });
        Ok(seat as usize)
    }

    /// Hybrid: frees `req`'s seat (it is back on the device in pages).
    pub fn release_seat(&mut self, req: RequestId) -> Result<()> {
        let held = self.held(req)?;
        self.shared_mut()?.release_seat(req);
        self.held.insert(req, Held { seat: None, ..held });
        Ok(())
    }

    /// Hybrid: pages of the shared pool free above every seat in use.
    pub fn usable_free_pages(&self) -> Result<usize> {
        Ok(self.shared()?.usable_free_pages())
    }

    /// Hybrid: pages that would hold positions `0..tokens`.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.page_tokens)
    }

    /// Hybrid: places registered `req`'s KV on the device: pages for positions `0..tokens`
    /// (all or nothing). Its rows are the caller's to write.
    pub fn place_pages(&mut self, req: RequestId, tokens: usize) -> Result<()> {
        self.held(req)?;
        let pages = self.pages_for(tokens).max(1);
        self.shared_mut()?.take_pages(req, pages)?;
        Ok(())
    }

    /// Hybrid: frees `req`'s KV pages (its rows must be elsewhere first); returns how many.
    pub fn drop_pages(&mut self, req: RequestId) -> Result<usize> {
        self.held(req)?;
        Ok(self.shared_mut()?.release_pages(req))
    }

    /// Hybrid: the held pages over the seat the next registration takes, as (owner, index in
    /// its pages); they must be moved ([`DeviceTier::move_page`]) or dropped first.
    pub fn pages_over_next_seat(&self) -> Result<Vec<(RequestId, usize)>> {
        let s = self.shared()?;
        Ok(s.next_seat()
            .map(|seat| s.pages_over_seat(seat).into_iter().map(|(r, i, _)| (r, i)).collect())
            .unwrap_or_default())
    }

    /// Hybrid: whether a page can move out of the next seat's way (a page above it is free).
    pub fn can_move_page(&self) -> Result<bool> {
        Ok(self.shared()?.free_pages_past_next_seat() > 0)
    }

    /// Hybrid: moves `req`'s page number `index` to the highest usable free page, copying its
    /// rows in every layer; returns the bytes copied.
    pub fn move_page(&mut self, req: RequestId, index: usize) -> Result<usize> {
        self.held(req)?;
        let (from, to) = self.shared_mut()?.move_page(req, index)?;
        let bytes = self.cfg.page_tokens * self.cfg.kv_row.row_bytes();
        let mut page = vec![0u8; bytes];
        for l in 0..self.cfg.layers {
            self.mem.read(&self.hot[l], from as usize * bytes, &mut page)?;
            self.mem.write(&mut self.hot[l], to as usize * bytes, &page)?;
        }
        Ok(bytes * self.cfg.layers)
    }
}
