//! Hybrid placement in the device tier: a request's KV pages placed in the shared pool (above
//! the seats in use), dropped when it is demoted, and moved when a seat about to be taken lies
//! under them; its index-key pages there too, for its whole reservation, where every layer keeps
//! keys; a seat taken when a request leaves the device and freed when it comes back. The
//! rows' contents are the caller's to copy in and out (host tier, prompt), except for a moved
//! page, which the tier copies itself in every layer.

use super::DeviceTier;
use super::{Held, Part, SharedPool};
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
        Ok(!self.shared()?.pages(req, Part::KvPage).is_empty())
    }

    /// Hybrid: gives `req` (registered, holding no pages) the lowest free seat, its hot buffer
    /// while it is off the device; refused, changing nothing, while held pages share the seat's
    /// bytes ([`DeviceTier::parts_over_next_seat`] names them).
    pub fn take_seat(&mut self, req: RequestId) -> Result<usize> {
        let held = self.held(req)?;
        if held.seat.is_some() || !self.shared()?.pages(req, Part::KvPage).is_empty() {
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

    /// Hybrid: pages that would hold positions `0..tokens`.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.page_tokens)
    }

    /// Hybrid: whether KV pages for positions `0..tokens` are free above every seat in use.
    pub fn can_place_pages(&self, tokens: usize) -> Result<bool> {
        let n = self.pages_for(tokens).max(1);
        Ok(self.shared()?.usable_free(Part::KvPage, n) >= n)
    }

    /// Hybrid: places registered `req`'s KV on the device: pages for positions `0..tokens`
    /// (all or nothing). Its rows are the caller's to write.
    pub fn place_pages(&mut self, req: RequestId, tokens: usize) -> Result<()> {
        self.held(req)?;
        let pages = self.pages_for(tokens).max(1);
        self.shared_mut()?.take_pages(req, Part::KvPage, pages)?;
        Ok(())
    }

    /// Hybrid: frees `req`'s KV pages (its rows must be elsewhere first); returns how many.
    pub fn drop_pages(&mut self, req: RequestId) -> Result<usize> {
        self.held(req)?;
        Ok(self.shared_mut()?.release_pages(req, Part::KvPage))
    }

    /// Hybrid: whether the index keys of positions `0..tokens` more than `req` holds fit in the
    /// shared pool now (always where keys have buffers of their own).
    pub fn can_take_keys(&self, req: RequestId, tokens: usize) -> Result<bool> {
        self.held(req)?;
        let s = self.shared()?;
        if !self.cfg.keys_in_shared_pool() {
            return Ok(true);
        }
        let more = self.pages_for(tokens).saturating_sub(s.pages(req, Part::KeyPage).len());
        Ok(s.usable_free(Part::KeyPage, more) >= more)
    }

    /// Hybrid: gives `req` the index-key pages of positions `0..tokens` in the shared pool, its
    /// whole reservation's (all or nothing; nothing to do where keys have buffers of their own,
    /// which [`DeviceTier::grow`] fills).
    pub fn take_keys(&mut self, req: RequestId, tokens: usize) -> Result<()> {
        self.held(req)?;
        if self.cfg.keys_in_shared_pool() {
            let n = self.pages_for(tokens);
            self.shared_mut()?.take_pages(req, Part::KeyPage, n)?;
        }
        Ok(())
    }

    /// Hybrid: the held pages over the seat the next seat taken gets, as (owner, kind, index in
    /// its pages of that kind); they must be moved ([`DeviceTier::move_page`]) or dropped first.
    pub fn parts_over_next_seat(&self) -> Result<Vec<(RequestId, Part, usize)>> {
        let s = self.shared()?;
        Ok(s.next_seat().map(|seat| s.parts_over_seat(seat)).unwrap_or_default())
    }

    /// Hybrid: whether a page of `part` can move out of the next seat's way.
    pub fn can_move_page(&self, part: Part) -> Result<bool> {
        Ok(self.shared()?.can_move(part))
    }

    /// Hybrid: moves `req`'s page of `part` number `index` to the highest usable free slot,
    /// copying its bytes in every layer that holds such pages; returns the bytes copied.
    pub fn move_page(&mut self, req: RequestId, part: Part, index: usize) -> Result<usize> {
        self.held(req)?;
        let (from, to) = self.shared_mut()?.move_page(req, part, index)?;
        let (bytes, layers) = match part {
            Part::KeyPage => (self.cfg.index_key.page_bytes(self.cfg.page_tokens)?, self.cfg.index_layers),
            _ => (self.cfg.page_tokens * self.cfg.kv_row.row_bytes(), self.cfg.layers),
        };
        let mut page = vec![0u8; bytes];
        for l in 0..layers {
            self.mem.read(&self.hot[l], from, &mut page)?;
            self.mem.write(&mut self.hot[l], to, &page)?;
        }
        Ok(bytes * layers)
    }
}
