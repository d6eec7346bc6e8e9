//! `SharedPool`: one pool of rows per layer shared by hot-buffer seats and pages of full KV rows
//! (hybrid placement). Seat `s` covers rows `hot_seat_base(s) .. hot_seat_base(s + 1)` (the
//! kernels' one address rule), page `p` rows `p * page_rows .. (p + 1) * page_rows`. Seats are
//! taken lowest first and pages highest first, so the two grow towards each other: pages live
//! above the seats in use, and a seat taken past them first needs the pages over it moved or
//! freed (the caller's copies; [`SharedPool::pages_over_seat`] names them).
//!
//! Invariant: no live page shares a row with a live seat; every seat and every page is either
//! free or held by exactly one request.

use std::collections::{BTreeSet, HashMap};

use super::{hot_buffer_rows_of, hot_seat_base};
use crate::error::{MemoryError, Result};
use crate::request::RequestId;

/// Seats and pages over one pool of rows. See the module documentation.
#[derive(Clone, Debug)]
pub struct SharedPool {
    device_buffer_size: usize,
    page_rows: usize,
    free_seats: BTreeSet<u32>,
    free_pages: BTreeSet<u32>,
    seats: HashMap<RequestId, u32>,
    pages: HashMap<RequestId, Vec<u32>>,
    seat_total: usize,
    page_total: usize,
}

impl SharedPool {
    /// A pool of `seats` hot buffers of `device_buffer_size` regular slots, its rows also cut in
    /// pages of `page_rows` rows (the whole pages that fit).
    pub fn new(seats: usize, device_buffer_size: usize, page_rows: usize) -> Result<Self> {
        if page_rows == 0 {
            return Err(MemoryError::invalid("page_tokens", 0, "must be at least 1"));
        }
        let rows = seats
            .checked_mul(hot_buffer_rows_of(device_buffer_size))
            .ok_or_else(|| MemoryError::invalid("seats", seats, "the shared pool's rows overflow"))?;
        let pages = rows / page_rows;
        let count = |field: &'static str, n: usize| {
            u32::try_from(n).map_err(|_| MemoryError::invalid(field, n, "at most 2^32 - 1"))
        };
        let (s32, p32) = (count("seats", seats)?, count("kv_pages", pages)?);
        Ok(Self {
            device_buffer_size,
            page_rows,
            free_seats: (0..s32).collect(),
            free_pages: (0..p32).collect(),
            seats: HashMap::new(),
            pages: HashMap::new(),
            seat_total: seats,
            page_total: pages,
        })
    }

    /// Seats in the pool.
    pub fn seat_total(&self) -> usize {
        self.seat_total
    }

    /// Pages in the pool.
    pub fn page_total(&self) -> usize {
        self.page_total
    }

    /// Seats held.
    pub fn seats_used(&self) -> usize {
        self.seats.len()
    }

    /// Pages held.
    pub fn pages_used(&self) -> usize {
        self.page_total - self.free_pages.len()
    }

    fn seat_rows(&self, seat: u32) -> std::ops::Range<usize> {
        let b = self.device_buffer_size as u64;
        // Seats are bounded by the pool, whose rows fit a usize (checked in `new`).
        hot_seat_base(u64::from(seat), b) as usize..hot_seat_base(u64::from(seat) + 1, b) as usize
    }

    /// The first page no held seat reaches: pages from here up may be handed out.
    fn first_free_page(&self) -> u32 {
        let end = self.seats.values().max().map_or(0, |&s| self.seat_rows(s).end);
        // Below 2^32: a page index of the pool's rows.
        end.div_ceil(self.page_rows) as u32
    }

    /// Free pages above every held seat (what [`SharedPool::take_pages`] may hand out).
    pub fn usable_free_pages(&self) -> usize {
        self.free_pages.range(self.first_free_page()..).count()
    }

    /// The seat [`SharedPool::take_seat`] would hand out next (the lowest free one).
    pub fn next_seat(&self) -> Option<u32> {
        self.free_seats.first().copied()
    }

    /// The held pages sharing a row with `seat`: (owner, index in the owner's pages, page).
    pub fn pages_over_seat(&self, seat: u32) -> Vec<(RequestId, usize, u32)> {
        let rows = self.seat_rows(seat);
        let (lo, hi) = (rows.start / self.page_rows, rows.end.div_ceil(self.page_rows));
        let mut over: Vec<(RequestId, usize, u32)> = self
            .pages
            .iter()
            .flat_map(|(&r, ps)| ps.iter().enumerate().map(move |(i, &p)| (r, i, p)))
            .filter(|&(_, _, p)| (lo..hi).contains(&(p as usize)))
            .collect();
        over.sort_unstable_by_key(|&(r, i, _)| (r, i));
        over
    }

    /// Gives `req` the lowest free seat; refused (nothing changes) when `req` holds one, when
    /// none is free, or while held pages share its rows.
    pub fn take_seat(&mut self, req: RequestId) -> Result<u32> {
        if self.seats.contains_key(&req) {
            return Err(MemoryError::DuplicateRequest { pool: "shared pool seats", request: req.0 });
        }
        let seat = self.next_seat().ok_or(MemoryError::CapacityExhausted {
            pool: "device hot-buffer seats",
            needed: 1,
            free: 0,
            unit: "seats",
        })?;
        let over = self.pages_over_seat(seat).len();
        if over > 0 {
            return Err(MemoryError::CapacityExhausted {
                pool: "shared pool rows under KV pages",
                needed: over,
                free: 0,
                unit: "pages",
            });
        }
        self.free_seats.remove(&seat);
        self.seats.insert(req, seat);
        Ok(seat)
    }

    /// The seat `req` holds.
    pub fn seat(&self, req: RequestId) -> Option<u32> {
        self.seats.get(&req).copied()
    }

    /// The pages `req` holds, in position order (none when it holds none).
    pub fn pages(&self, req: RequestId) -> &[u32] {
        self.pages.get(&req).map_or(&[], Vec::as_slice)
    }

    /// Makes `req` hold at least `n` pages, the highest usable free ones; all or nothing.
    pub fn take_pages(&mut self, req: RequestId, n: usize) -> Result<&[u32]> {
        let have = self.pages(req).len();
        let more = n.saturating_sub(have);
        let usable: Vec<u32> = self.free_pages.range(self.first_free_page()..).rev().take(more).copied().collect();
        if usable.len() < more {
            return Err(MemoryError::CapacityExhausted {
                pool: "shared pool KV pages",
                needed: more,
                free: usable.len(),
                unit: "pages",
            });
        }
        for p in &usable {
            self.free_pages.remove(p);
        }
        let held = self.pages.entry(req).or_default();
        held.extend(usable);
        Ok(held)
    }

    /// The first page above both the held seats and the next seat.
    fn first_page_past_next_seat(&self) -> u32 {
        let next_end = self.next_seat().map_or(0, |s| self.seat_rows(s).end.div_ceil(self.page_rows));
        // Below 2^32: a page index of the pool's rows.
        self.first_free_page().max(next_end as u32)
    }

    /// Free pages a page can move to ([`SharedPool::move_page`]).
    pub fn free_pages_past_next_seat(&self) -> usize {
        self.free_pages.range(self.first_page_past_next_seat()..).count()
    }

    /// Moves `req`'s page number `index` to the highest free page above both the held seats
    /// and the next seat (out of the way of [`SharedPool::take_seat`]); returns the page it left
    /// and the page it now holds. Refused where no such page is free.
    pub fn move_page(&mut self, req: RequestId, index: usize) -> Result<(u32, u32)> {
        let first = self.first_page_past_next_seat();
        let to = *self.free_pages.range(first..).next_back().ok_or(MemoryError::CapacityExhausted {
            pool: "shared pool KV pages",
            needed: 1,
            free: 0,
            unit: "pages",
        })?;
        let held = self
            .pages
            .get_mut(&req)
            .ok_or(MemoryError::UnknownRequest { pool: "shared pool pages", request: req.0 })?;
        let from = *held
            .get(index)
            .ok_or_else(|| MemoryError::invalid("index", index, format!("request {req} holds {} pages", held.len())))?;
        held[index] = to;
        self.free_pages.remove(&to);
        self.free_pages.insert(from);
        Ok((from, to))
    }

    /// Frees every page `req` holds; returns how many.
    pub fn release_pages(&mut self, req: RequestId) -> usize {
        let held = self.pages.remove(&req).unwrap_or_default();
        let n = held.len();
        self.free_pages.extend(held);
        n
    }

    /// Frees `req`'s seat, if it holds one.
    pub fn release_seat(&mut self, req: RequestId) {
        if let Some(s) = self.seats.remove(&req) {
            self.free_seats.insert(s);
        }
    }

    /// Checks the invariant of the module documentation.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(MemoryError::invalid("shared pool", "inconsistent", why));
        let held_pages: usize = self.pages.values().map(Vec::len).sum();
        let mut seen = BTreeSet::new();
        for p in self.pages.values().flatten() {
            if !seen.insert(*p) || self.free_pages.contains(p) || *p as usize >= self.page_total {
                return bad(format!("page {p} held twice, held and free, or out of the pool"));
            }
        }
        if held_pages + self.free_pages.len() != self.page_total {
            return bad(format!("{held_pages} held + {} free pages of {}", self.free_pages.len(), self.page_total));
        }
        let held_seats: BTreeSet<u32> = self.seats.values().copied().collect();
        if held_seats.len() != self.seats.len()
            || held_seats.len() + self.free_seats.len() != self.seat_total
            || held_seats.iter().any(|s| self.free_seats.contains(s))
        {
            return bad("a seat held twice, or held and free".into());
        }
        if let Some(&s) = held_seats.iter().find(|&&s| !self.pages_over_seat(s).is_empty()) {
            return bad(format!("seat {s} shares rows with a held page"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seats_rise_from_the_bottom_and_pages_fall_from_the_top() {
        // 4 seats of 6 rows (5 slots + the reserved one) = 24 rows, pages of 4 rows: 6 pages.
        let mut p = SharedPool::new(4, 5, 4).unwrap();
        assert_eq!((p.seat_total(), p.page_total()), (4, 6));
        let (a, b, c) = (RequestId(1), RequestId(2), RequestId(3));
        assert_eq!(p.take_seat(a).unwrap(), 0);
        assert_eq!(p.usable_free_pages(), 4, "seat 0 covers rows 0..6: pages 0 and 1");
        assert_eq!(p.take_pages(b, 3).unwrap(), &[5, 4, 3]);
        assert_eq!(p.next_seat(), Some(1));
        // Seat 1 covers rows 6..12: pages 1 and 2, both free.
        assert_eq!(p.take_seat(b).unwrap(), 1);
        // Seat 2 covers rows 12..18: pages 3 and 4, held by b.
        assert_eq!(p.pages_over_seat(2), vec![(b, 1, 4), (b, 2, 3)]);
        let e = p.take_seat(c).unwrap_err();
        assert!(matches!(e, MemoryError::CapacityExhausted { needed: 2, .. }), "{e}");
        assert!(p.take_pages(c, 1).is_err(), "no usable page is free above seat 1");
        p.check().unwrap();
        p.release_pages(b);
        assert_eq!(p.take_seat(c).unwrap(), 2);
        assert_eq!(p.usable_free_pages(), 1, "rows 18..24: page 5 (page 4 holds row 18 of seat 2)");
        p.release_seat(a);
        assert_eq!(p.next_seat(), Some(0));
        p.check().unwrap();
    }

    #[test]
    fn a_page_moves_to_the_highest_free_page() {
        let mut p = SharedPool::new(4, 5, 4).unwrap();
        let r = RequestId(7);
        p.take_pages(r, 2).unwrap();
        p.release_pages(r);
        p.take_pages(r, 1).unwrap();
        assert_eq!(p.pages(r), &[5]);
        assert!(p.take_pages(r, 7).unwrap_err().to_string().contains("shared pool KV pages"));
        p.release_pages(r);
        p.take_pages(r, 1).unwrap();
        p.take_pages(r, 3).unwrap();
        assert_eq!(p.pages(r), &[5, 4, 3]);
        p.release_pages(r);
        p.take_pages(r, 6).unwrap();
        assert!(p.move_page(r, 0).is_err(), "no page free");
        p.release_pages(r);
        p.take_pages(r, 2).unwrap(); // 5, 4
        assert_eq!(p.move_page(r, 1).unwrap(), (4, 3));
        assert_eq!(p.pages(r), &[5, 3]);
        p.check().unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random seats and pages taken, moved and freed never break the invariant, and a seat
        /// is refused exactly while pages sit over it.
        #[test]
        fn random_operations_keep_the_invariant(ops in prop::collection::vec((0u8..5, 0u64..6, 0usize..5), 1..80)) {
            let mut p = SharedPool::new(5, 7, 3).unwrap();
            for (op, r, n) in ops {
                let r = RequestId(r);
                match op {
                    0 => {
                        let over = p.next_seat().map(|s| p.pages_over_seat(s).len());
                        let had = p.seat(r).is_some();
                        let got = p.take_seat(r);
                        prop_assert_eq!(got.is_ok(), !had && over == Some(0));
                    }
                    1 => {
                        let (have, free) = (p.pages(r).len(), p.usable_free_pages());
                        let got = p.take_pages(r, have + n);
                        prop_assert_eq!(got.is_ok(), n <= free);
                    }
                    2 => {
                        let (can, held) = (p.free_pages_past_next_seat() > 0, n < p.pages(r).len());
                        prop_assert_eq!(p.move_page(r, n).is_ok(), can && held);
                    }
                    3 => { p.release_pages(r); }
                    _ => p.release_seat(r),
                }
                p.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
    }
}
