//! `SharedPool`: one pool of bytes per layer shared by hot-buffer seats, pages of full KV rows
//! and (where the tier keeps them there) pages of index keys (hybrid placement). Seat `s` covers
//! the bytes of rows `hot_seat_base(s) .. hot_seat_base(s + 1)` (the kernels' one address rule),
//! KV page `p` the bytes `p * kv_page .. (p + 1) * kv_page`, key page `k` the bytes
//! `k * key_page .. (k + 1) * key_page`: each kind is an array over the same bytes, so a kernel
//! addresses a page of either kind as it addresses a pool of its own. Seats are taken lowest
//! first and pages highest first, above every seat in use, so the two grow towards each other;
//! a seat taken past them first needs the pages over it moved or freed (the caller's copies;
//! [`SharedPool::parts_over_seat`] names them).
//!
//! Invariant: no two held parts share a byte; every byte is either free or held by exactly one
//! part of exactly one request.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{hot_buffer_rows_of, hot_seat_base};
use crate::error::{MemoryError, Result};
use crate::request::RequestId;

/// What a span of a shared pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// A hot-buffer seat.
    Seat,
    /// A page of full KV rows.
    KvPage,
    /// A page of index keys.
    KeyPage,
}

/// The sizes of a shared pool's parts, in bytes of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPoolShape {
    /// Hot-buffer seats.
    pub seats: usize,
    /// Regular slots per seat (`device_buffer_size`).
    pub device_buffer_size: usize,
    /// Bytes of one KV row.
    pub kv_row_bytes: usize,
    /// Positions per page.
    pub page_tokens: usize,
    /// Bytes of one page of index keys, and the pages of index keys the pool holds beside its
    /// seats (`None`: index keys live in buffers of their own).
    pub key_pages: Option<(usize, usize)>,
}

impl SharedPoolShape {
    /// Bytes of one seat.
    fn seat_bytes(&self) -> Option<usize> {
        (self.device_buffer_size < usize::MAX)
            .then(|| hot_buffer_rows_of(self.device_buffer_size))
            .and_then(|r| r.checked_mul(self.kv_row_bytes))
    }

    /// Bytes of the pool in one layer: the seats, rounded up to whole key pages, then the key
    /// pages, so that every key page still fits above any set of seats (and the pool is a whole
    /// number of key pages, as an indexer reads it); at most one key page more than the two
    /// alone. `None` on overflow.
    pub fn bytes(&self) -> Option<usize> {
        let seats = self.seat_bytes()?.checked_mul(self.seats)?;
        match self.key_pages {
            None => Some(seats),
            Some((page, n)) => seats.div_ceil(page.max(1)).checked_add(n)?.checked_mul(page),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Span {
    end: usize,
    part: Part,
    owner: RequestId,
}

/// Seats and pages over one pool of bytes. See the module documentation.
#[derive(Clone, Debug)]
pub struct SharedPool {
    device_buffer_size: usize,
    kv_row_bytes: usize,
    seat_bytes: usize,
    kv_page: usize,
    key_page: usize,
    bytes: usize,
    seat_total: usize,
    free_seats: BTreeSet<u32>,
    /// Free byte ranges, start to end, none touching another.
    free: BTreeMap<usize, usize>,
    /// Held byte ranges by start.
    held: BTreeMap<usize, Span>,
    /// Bytes the held ranges cover.
    used: usize,
    seats: HashMap<RequestId, u32>,
    pages: HashMap<(RequestId, Part), Vec<u32>>,
}

fn overflow(field: &'static str, v: usize) -> MemoryError {
    MemoryError::invalid(field, v, "the shared pool's size overflows")
}

impl SharedPool {
    /// A pool of `shape`.
    pub fn new(shape: SharedPoolShape) -> Result<Self> {
        if shape.page_tokens == 0 {
            return Err(MemoryError::invalid("page_tokens", 0, "must be at least 1"));
        }
        let seat_bytes = shape.seat_bytes().ok_or_else(|| overflow("device_buffer_size", shape.device_buffer_size))?;
        let kv_page = shape.kv_row_bytes.checked_mul(shape.page_tokens).ok_or_else(|| overflow("page_tokens", 0))?;
        let bytes = shape.bytes().ok_or_else(|| overflow("seats", shape.seats))?;
        let key_page = shape.key_pages.map_or(0, |(p, _)| p);
        if kv_page == 0 || shape.key_pages.is_some_and(|(p, _)| p == 0) {
            return Err(MemoryError::invalid("kv_row", 0, "a page of the shared pool has at least one byte"));
        }
        let count = |field: &'static str, n: usize| {
            u32::try_from(n).map_err(|_| MemoryError::invalid(field, n, "at most 2^32 - 1"))
        };
        count("kv_pages", bytes / kv_page)?;
        if let Some(slots) = bytes.checked_div(key_page) {
            count("index_pages", slots)?;
        }
        Ok(Self {
            device_buffer_size: shape.device_buffer_size,
            kv_row_bytes: shape.kv_row_bytes,
            seat_bytes,
            kv_page,
            key_page,
            bytes,
            seat_total: shape.seats,
            free_seats: (0..count("seats", shape.seats)?).collect(),
            free: if bytes > 0 { BTreeMap::from([(0, bytes)]) } else { BTreeMap::new() },
            held: BTreeMap::new(),
            used: 0,
            seats: HashMap::new(),
            pages: HashMap::new(),
        })
    }

    /// Whether index keys live in this pool.
    pub fn holds_keys(&self) -> bool {
        self.key_page > 0
    }

    /// Bytes of the pool in one layer.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Seats in the pool.
    pub fn seat_total(&self) -> usize {
        self.seat_total
    }

    /// Seats held.
    pub fn seats_used(&self) -> usize {
        self.seats.len()
    }

    /// Bytes held, of one layer.
    pub fn bytes_used(&self) -> usize {
        self.used
    }

    /// Pages of `part` held.
    pub fn pages_used(&self, part: Part) -> usize {
        self.pages.iter().filter(|((_, p), _)| *p == part).map(|(_, v)| v.len()).sum()
    }

    fn size(&self, part: Part) -> usize {
        match part {
            Part::Seat => self.seat_bytes,
            Part::KvPage => self.kv_page,
            Part::KeyPage => self.key_page,
        }
    }

    /// The bytes of `part` number `index`.
    fn span(&self, part: Part, index: u32) -> std::ops::Range<usize> {
        if part == Part::Seat {
            // Seats are bounded by the pool, whose bytes fit a usize (checked in `new`).
            let row = hot_seat_base(u64::from(index), self.device_buffer_size as u64) as usize;
            let s = row * self.kv_row_bytes;
            return s..s + self.seat_bytes;
        }
        let z = self.size(part);
        index as usize * z..(index as usize + 1) * z
    }

    /// The first byte pages may take: past every held seat.
    fn floor(&self) -> usize {
        self.seats.values().max().map_or(0, |&s| self.span(Part::Seat, s).end)
    }

    /// The first byte past both the held seats and the next seat (where a moved page goes).
    fn floor_past_next_seat(&self) -> usize {
        let next = self.next_seat().map_or(0, |s| self.span(Part::Seat, s).end);
        self.floor().max(next)
    }

    /// Up to `n` free slots of `part` at or above byte `floor`, highest first.
    fn free_slots(&self, part: Part, floor: usize, n: usize) -> Vec<u32> {
        let z = self.size(part);
        let mut got = Vec::new();
        for (&a, &b) in self.free.iter().rev() {
            if b <= floor || got.len() >= n {
                break;
            }
            let lo = a.max(floor).div_ceil(z);
            let mut hi = b / z;
            while hi > lo && got.len() < n {
                hi -= 1;
                // Below 2^32: a slot of the pool's bytes (checked in `new`).
                got.push(hi as u32);
            }
        }
        got
    }

    fn hold(&mut self, range: std::ops::Range<usize>, part: Part, owner: RequestId) {
        // The range lies in one free range: every caller found it there.
        let (&a, &b) = self.free.range(..=range.start).next_back().expect("a held range comes from a free one");
        debug_assert!(b >= range.end);
        self.free.remove(&a);
        if a < range.start {
            self.free.insert(a, range.start);
        }
        if range.end < b {
            self.free.insert(range.end, b);
        }
        self.used += range.len();
        self.held.insert(range.start, Span { end: range.end, part, owner });
    }

    fn unhold(&mut self, start: usize) {
        let Some(span) = self.held.remove(&start) else { return };
        self.used -= span.end - start;
        let (mut a, mut b) = (start, span.end);
        if let Some((&pa, &pb)) = self.free.range(..a).next_back()
            && pb == a
        {
            self.free.remove(&pa);
            a = pa;
        }
        if let Some(nb) = self.free.remove(&b) {
            b = nb;
        }
        self.free.insert(a, b);
    }

    /// Free slots of `part` above every seat in use (what [`SharedPool::take_pages`] may hand
    /// out), counted up to `limit`.
    pub fn usable_free(&self, part: Part, limit: usize) -> usize {
        self.free_slots(part, self.floor(), limit).len()
    }

    /// The seat [`SharedPool::take_seat`] would hand out next (the lowest free one).
    pub fn next_seat(&self) -> Option<u32> {
        self.free_seats.first().copied()
    }

    /// The held pages sharing a byte with `seat`: (owner, kind, index in the owner's pages).
    pub fn parts_over_seat(&self, seat: u32) -> Vec<(RequestId, Part, usize)> {
        let r = self.span(Part::Seat, seat);
        let before = self.held.range(..r.start).next_back().filter(|(_, s)| s.end > r.start);
        let mut over: Vec<(RequestId, Part, usize)> = before
            .into_iter()
            .chain(self.held.range(r.start..r.end))
            .map(|(&start, s)| {
                let z = self.size(s.part);
                // A held page is listed in its owner's pages (the module's invariant).
                let i = self.pages(s.owner, s.part).iter().position(|&p| p as usize * z == start).unwrap_or(0);
                (s.owner, s.part, i)
            })
            .collect();
        over.sort_unstable();
        over
    }

    /// Gives `req` the lowest free seat; refused (nothing changes) when `req` holds one, when
    /// none is free, or while held pages share its bytes.
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
        let over = self.parts_over_seat(seat).len();
        if over > 0 {
            return Err(MemoryError::CapacityExhausted {
                pool: "shared pool bytes under pages",
                needed: over,
                free: 0,
                unit: "pages",
            });
        }
        self.free_seats.remove(&seat);
        self.seats.insert(req, seat);
        self.hold(self.span(Part::Seat, seat), Part::Seat, req);
        Ok(seat)
    }

    /// The seat `req` holds.
    pub fn seat(&self, req: RequestId) -> Option<u32> {
        self.seats.get(&req).copied()
    }

    /// The pages of `part` `req` holds, in position order (none when it holds none).
    pub fn pages(&self, req: RequestId, part: Part) -> &[u32] {
        self.pages.get(&(req, part)).map_or(&[], Vec::as_slice)
    }

    /// Makes `req` hold at least `n` pages of `part` (a page kind), the highest usable free
    /// ones; all or nothing.
    pub fn take_pages(&mut self, req: RequestId, part: Part, n: usize) -> Result<&[u32]> {
        if part == Part::Seat || self.size(part) == 0 {
            return Err(MemoryError::invalid("part", format!("{part:?}"), "not a page of this pool"));
        }
        let more = n.saturating_sub(self.pages(req, part).len());
        let slots = self.free_slots(part, self.floor(), more);
        if slots.len() < more {
            return Err(MemoryError::CapacityExhausted {
                pool: if part == Part::KvPage { "shared pool KV pages" } else { "shared pool index-key pages" },
                needed: more,
                free: slots.len(),
                unit: "pages",
            });
        }
        for &p in &slots {
            self.hold(self.span(part, p), part, req);
        }
        let held = self.pages.entry((req, part)).or_default();
        held.extend(slots);
        Ok(held)
    }

    /// Whether a page of `part` can move out of the next seat's way (a slot above it is free).
    pub fn can_move(&self, part: Part) -> bool {
        !self.free_slots(part, self.floor_past_next_seat(), 1).is_empty()
    }

    /// Moves `req`'s page of `part` number `index` to the highest free slot above both the held
    /// seats and the next seat (out of the way of [`SharedPool::take_seat`]); returns the byte
    /// offsets it left and now holds. Refused where no such slot is free.
    pub fn move_page(&mut self, req: RequestId, part: Part, index: usize) -> Result<(usize, usize)> {
        let from = *self.pages(req, part).get(index).ok_or_else(|| {
            MemoryError::invalid(
                "index",
                index,
                format!("request {req} holds {} such pages", self.pages(req, part).len()),
            )
        })?;
        let to = *self
            .free_slots(part, self.floor_past_next_seat(), 1)
            .first()
            .ok_or(MemoryError::CapacityExhausted { pool: "shared pool pages", needed: 1, free: 0, unit: "pages" })?;
        let (a, b) = (self.span(part, from), self.span(part, to));
        self.hold(b.clone(), part, req);
        self.unhold(a.start);
        // The page was found above: its list exists.
        if let Some(held) = self.pages.get_mut(&(req, part)) {
            held[index] = to;
        }
        Ok((a.start, b.start))
    }

    /// Frees every page of `part` `req` holds; returns how many.
    pub fn release_pages(&mut self, req: RequestId, part: Part) -> usize {
        let held = self.pages.remove(&(req, part)).unwrap_or_default();
        for &p in &held {
            self.unhold(self.span(part, p).start);
        }
        held.len()
    }

    /// Frees `req`'s seat, if it holds one.
    pub fn release_seat(&mut self, req: RequestId) {
        if let Some(s) = self.seats.remove(&req) {
            self.unhold(self.span(Part::Seat, s).start);
            self.free_seats.insert(s);
        }
    }

    /// Checks the invariant of the module documentation.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(MemoryError::invalid("shared pool", "inconsistent", why));
        let mut all: Vec<(usize, usize, bool)> = self.held.iter().map(|(&s, p)| (s, p.end, true)).collect();
        all.extend(self.free.iter().map(|(&a, &b)| (a, b, false)));
        all.sort_unstable();
        let mut at = 0;
        for w in all.windows(2) {
            if !w[0].2 && !w[1].2 && w[0].1 == w[1].0 {
                return bad(format!("free ranges at {} and {} touch", w[0].0, w[1].0));
            }
        }
        for (a, b, _) in all {
            if a != at || b <= a {
                return bad(format!("byte {at}: a range {a}..{b} overlaps, leaves a gap or is empty"));
            }
            at = b;
        }
        if at != self.bytes {
            return bad(format!("ranges end at {at} of {} bytes", self.bytes));
        }
        if self.used != self.held.iter().map(|(s, span)| span.end - s).sum::<usize>() {
            return bad(format!("{} bytes counted held, not what the held ranges cover", self.used));
        }
        let listed = self.seats.len() + self.pages.values().map(Vec::len).sum::<usize>();
        if listed != self.held.len() {
            return bad(format!("{listed} parts listed, {} held", self.held.len()));
        }
        let owned = |req: RequestId, part: Part, i: u32| {
            let r = self.span(part, i);
            self.held.get(&r.start).is_some_and(|s| s.end == r.end && s.part == part && s.owner == req)
        };
        if let Some((r, s)) =
            self.seats.iter().find(|&(&r, &s)| !owned(r, Part::Seat, s) || self.free_seats.contains(&s))
        {
            return bad(format!("seat {s} of request {r} is not held as listed"));
        }
        if self.seats.len() + self.free_seats.len() != self.seat_total {
            return bad("a seat held twice, or lost".into());
        }
        for (&(r, part), ps) in &self.pages {
            if let Some(p) = ps.iter().find(|&&p| !owned(r, part, p)) {
                return bad(format!("{part:?} {p} of request {r} is not held as listed"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
