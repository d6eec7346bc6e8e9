//! `PagePool`: a free list of fixed-size pages and the pages each request holds. Allocation is
//! all-or-nothing; freed pages are reused first (LIFO).

use std::collections::HashMap;

use crate::error::{MemoryError, Result};
use crate::request::RequestId;

/// Pages `0..total` handed out to requests.
///
/// Invariant: every page is either on the free list or held by exactly one request.
#[derive(Debug, Clone)]
pub struct PagePool {
    name: &'static str,
    total: usize,
    free: Vec<u32>,
    owners: HashMap<RequestId, Vec<u32>>,
}

impl PagePool {
    /// A pool of `total` pages (at most `u32::MAX`), named `name` in errors.
    pub fn new(name: &'static str, total: usize) -> Result<Self> {
        let total32 = u32::try_from(total).map_err(|_| MemoryError::invalid("pages", total, "at most 2^32 - 1"))?;
        // Pop order 0, 1, 2, ... so that the first requests get contiguous pages.
        Ok(Self { name, total, free: (0..total32).rev().collect(), owners: HashMap::new() })
    }

    /// Pages in the pool.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Pages on the free list.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Pages held by requests.
    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Requests registered.
    pub fn requests(&self) -> usize {
        self.owners.len()
    }

    /// Registers `req` with no pages.
    pub fn register(&mut self, req: RequestId) -> Result<()> {
        if self.owners.contains_key(&req) {
            return Err(MemoryError::DuplicateRequest { pool: self.name, request: req.0 });
        }
        self.owners.insert(req, Vec::new());
        Ok(())
    }

    /// Whether `req` is registered.
    pub fn contains(&self, req: RequestId) -> bool {
        self.owners.contains_key(&req)
    }

    /// Makes `req` hold at least `pages` pages, taking them from the free list; on failure
    /// nothing changes.
    pub fn grow_to(&mut self, req: RequestId, pages: usize) -> Result<&[u32]> {
        let held = self.owners.get_mut(&req).ok_or(MemoryError::UnknownRequest { pool: self.name, request: req.0 })?;
        let more = pages.saturating_sub(held.len());
        if more > self.free.len() {
            return Err(MemoryError::CapacityExhausted {
                pool: self.name,
                needed: more,
                free: self.free.len(),
                unit: "pages",
            });
        }
        let at = self.free.len() - more;
        // Take from the end in pop order.
        held.extend(self.free.drain(at..).rev());
        Ok(held)
    }

    /// The pages `req` holds, in allocation order.
    pub fn pages(&self, req: RequestId) -> Result<&[u32]> {
        self.owners.get(&req).map(Vec::as_slice).ok_or(MemoryError::UnknownRequest { pool: self.name, request: req.0 })
    }

    /// Unregisters `req` and returns its pages to the free list; returns how many.
    pub fn release(&mut self, req: RequestId) -> Result<usize> {
        let held = self.owners.remove(&req).ok_or(MemoryError::UnknownRequest { pool: self.name, request: req.0 })?;
        let n = held.len();
        self.free.extend(held.into_iter().rev());
        Ok(n)
    }

    /// Checks the pool's invariant (every page free or held exactly once).
    pub fn check(&self) -> Result<()> {
        let mut seen = vec![false; self.total];
        for p in self.free.iter().chain(self.owners.values().flatten()) {
            let i = *p as usize;
            if i >= self.total || std::mem::replace(&mut seen[i], true) {
                return Err(MemoryError::invalid(
                    "page",
                    i,
                    format!("{}: page listed twice or out of range", self.name),
                ));
            }
        }
        match seen.iter().position(|s| !s) {
            Some(i) => Err(MemoryError::invalid("page", i, format!("{}: page leaked", self.name))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_is_all_or_nothing_and_pages_are_reused() {
        let mut p = PagePool::new("test", 10).unwrap();
        let (a, b) = (RequestId(1), RequestId(2));
        p.register(a).unwrap();
        p.register(b).unwrap();
        assert_eq!(p.grow_to(a, 4).unwrap(), &[0, 1, 2, 3]);
        assert_eq!(p.grow_to(b, 3).unwrap(), &[4, 5, 6]);
        let e = p.grow_to(b, 7).unwrap_err();
        assert_eq!(e, MemoryError::CapacityExhausted { pool: "test", needed: 4, free: 3, unit: "pages" });
        assert_eq!(p.pages(b).unwrap(), &[4, 5, 6], "a failed grow changes nothing");
        assert_eq!(p.release(a).unwrap(), 4);
        assert_eq!(p.grow_to(b, 7).unwrap(), &[4, 5, 6, 0, 1, 2, 3], "freed pages are reused");
        p.check().unwrap();
        assert!(matches!(p.register(b), Err(MemoryError::DuplicateRequest { .. })));
        assert!(matches!(p.pages(a), Err(MemoryError::UnknownRequest { request: 1, .. })));
        assert_eq!(p.release(b).unwrap(), 7);
        assert_eq!((p.free(), p.used(), p.requests()), (10, 0, 0));
        p.check().unwrap();
    }
}
