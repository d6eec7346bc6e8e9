//! Admission accounting for both modes: what a request needs for its whole life (pages, a
//! hot-buffer seat, host pages), planned from byte budgets, and the decision to admit it now,
//! let it wait, or reject it whole because it can never fit.

use crate::device_tier::DeviceTierConfig;
use crate::error::{MemoryError, Result};
use crate::request::Mode;
use crate::row::{IndexKeyLayout, KvRowLayout};

/// Countable resources of the tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Device pages of full KV rows (resident mode).
    pub kv_pages: usize,
    /// Device pages of index keys.
    pub index_pages: usize,
    /// Device hot buffers (hisparse mode).
    pub seats: usize,
    /// Host-tier pages (hisparse mode).
    pub host_pages: usize,
}

impl Resources {
    /// What a request of `tokens` positions (prompt + output) needs in `mode`, with index-key
    /// pages where the tiers keep an index (`keeps_index`; see [`CapacityPlan::keeps_index`]).
    pub fn need(mode: Mode, tokens: usize, page_tokens: usize, keeps_index: bool) -> Self {
        let pages = tokens.div_ceil(page_tokens.max(1));
        let index_pages = if keeps_index { pages } else { 0 };
        match mode {
            Mode::Resident => Self { kv_pages: pages, index_pages, seats: 0, host_pages: 0 },
            // Hybrid placement reserves hisparse's whole-life resources: a request can always be
            // demoted, so the device's KV pages it may use meanwhile are not reserved.
            Mode::HiSparse | Mode::Hybrid => Self { kv_pages: 0, index_pages, seats: 1, host_pages: pages },
        }
    }

    fn fields(&self) -> [(&'static str, usize); 4] {
        [
            ("device KV pages", self.kv_pages),
            ("device index-key pages", self.index_pages),
            ("device hot-buffer seats", self.seats),
            ("host-tier pages", self.host_pages),
        ]
    }
}

/// The answer to "may this request start now?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Its resources are reserved; it may start.
    Admitted,
    /// It fits the capacity but not what is free now: it waits, holding nothing.
    Wait {
        /// The first resource short now.
        short: &'static str,
    },
    /// It can never fit: it is rejected whole, holding nothing.
    Rejected {
        /// Why, naming the resource and the amounts.
        reason: String,
    },
}

/// Reservations against fixed capacities.
///
/// Invariant: `reserved <= capacity` in every resource, and every reservation made by
/// [`AdmissionControl::try_admit`] is returned by exactly one [`AdmissionControl::release`].
#[derive(Clone, Debug)]
pub struct AdmissionControl {
    capacity: Resources,
    reserved: Resources,
}

impl AdmissionControl {
    /// Accounting against `capacity`.
    pub fn new(capacity: Resources) -> Self {
        Self { capacity, reserved: Resources::default() }
    }

    /// The capacities.
    pub fn capacity(&self) -> Resources {
        self.capacity
    }

    /// What admitted requests hold.
    pub fn reserved(&self) -> Resources {
        self.reserved
    }

    /// The decision for `need`, without reserving.
    pub fn decide(&self, need: &Resources) -> Admission {
        for ((name, want), ((_, cap), (_, used))) in
            need.fields().into_iter().zip(self.capacity.fields().into_iter().zip(self.reserved.fields()))
        {
            if want > cap {
                return Admission::Rejected { reason: format!("needs {want} {name}, the tier holds {cap} in all") };
            }
            if want > cap - used {
                return Admission::Wait { short: name };
            }
        }
        Admission::Admitted
    }

    /// Decides for `need` and reserves it when admitted.
    pub fn try_admit(&mut self, need: &Resources) -> Admission {
        let d = self.decide(need);
        if d == Admission::Admitted {
            self.reserved.kv_pages += need.kv_pages;
            self.reserved.index_pages += need.index_pages;
            self.reserved.seats += need.seats;
            self.reserved.host_pages += need.host_pages;
        }
        d
    }

    /// Returns what an admitted request reserved.
    pub fn release(&mut self, need: &Resources) -> Result<()> {
        let r = &mut self.reserved;
        if need.kv_pages > r.kv_pages
            || need.index_pages > r.index_pages
            || need.seats > r.seats
            || need.host_pages > r.host_pages
        {
            return Err(MemoryError::invalid("release", format!("{need:?}"), format!("more than reserved ({r:?})")));
        }
        r.kv_pages -= need.kv_pages;
        r.index_pages -= need.index_pages;
        r.seats -= need.seats;
        r.host_pages -= need.host_pages;
        Ok(())
    }
}

/// Byte budgets and shapes from which tier capacities are planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityPlan {
    /// Serving mode.
    pub mode: Mode,
    /// Layers.
    pub layers: usize,
    /// Layers that store index keys (an IndexShare model's full layers; else `layers`).
    pub index_layers: usize,
    /// KV row layout.
    pub kv_row: KvRowLayout,
    /// Index key layout.
    pub index_key: IndexKeyLayout,
    /// Whether the device keeps index keys. Not where every request attends to all its
    /// positions (dense attention: resident mode with top-k past every request's length), so a
    /// dense cache spends its whole budget on KV rows.
    ///
    /// Invariant: `keeps_index` is true in hisparse mode (its selection reads the keys).
    pub keeps_index: bool,
    /// Positions per page.
    pub page_tokens: usize,
    /// Regular hot-buffer slots (`device_buffer_size`).
    pub device_buffer_size: usize,
    /// Device bytes for KV, index keys and hot buffers.
    pub device_bytes: usize,
    /// Host-tier bytes (hisparse mode).
    pub host_bytes: usize,
    /// The request length (positions) the device split between hot buffers and index keys is
    /// sized for in hisparse mode.
    pub typical_tokens: usize,
}

fn overflow(field: &'static str, value: usize) -> MemoryError {
    MemoryError::invalid(field, value, "the tier sizes computed from it overflow")
}

/// What one request of a given length takes of each tier's budget, in bytes
/// ([`CapacityPlan::request_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBytes {
    /// Device bytes: its KV rows (resident) or hot-buffer seat (hisparse), with its index keys
    /// where the plan keeps them.
    pub device: usize,
    /// Host-tier bytes: its KV rows in hisparse mode, 0 in resident mode.
    pub host: usize,
}

impl CapacityPlan {
    fn mul(a: usize, b: usize, field: &'static str, v: usize) -> Result<usize> {
        a.checked_mul(b).ok_or_else(|| overflow(field, v))
    }

    /// Bytes of one page of KV rows in every layer (a device page in resident mode, a host page
    /// in hisparse mode).
    fn kv_page_bytes(&self) -> Result<usize> {
        let p = self.page_tokens.max(1);
        Self::mul(Self::mul(p, self.kv_row.row_bytes(), "page_tokens", p)?, self.layers, "layers", self.layers)
    }

    /// Bytes of one page of index keys in every layer that stores them (0 without keys).
    fn index_page_bytes(&self) -> Result<usize> {
        let l = self.index_layers;
        let page = if self.keeps_index { self.index_key.page_bytes(self.page_tokens.max(1))? } else { 0 };
        Self::mul(page, l, "index_layers", l)
    }

    /// Bytes of one request's hot-buffer seat in every layer (hisparse mode).
    fn seat_bytes(&self) -> Result<usize> {
        let d = self.device_buffer_size;
        // The hot buffer's rows by its one rule (regular slots and the reserved one), for any
        // count below usize::MAX (a u64 sum that cannot wrap).
        let rows = (d < usize::MAX)
            .then(|| crate::device_tier::hot_buffer_rows_of(d))
            .ok_or_else(|| overflow("device_buffer_size", d))?;
        Self::mul(
            Self::mul(rows, self.kv_row.row_bytes(), "device_buffer_size", d)?,
            self.layers,
            "layers",
            self.layers,
        )
    }

    /// What one request of `tokens` positions takes of each tier, by the rule
    /// [`CapacityPlan::device_tier`] and [`CapacityPlan::host_pages`] size the tiers with: whole
    /// pages of rows and keys, one seat in hisparse mode. Refused, naming the field, where a size
    /// overflows.
    pub fn request_bytes(&self, tokens: usize) -> Result<RequestBytes> {
        let pages = tokens.div_ceil(self.page_tokens.max(1));
        let keys = Self::mul(pages, self.index_page_bytes()?, "tokens", tokens)?;
        let rows = Self::mul(pages, self.kv_page_bytes()?, "tokens", tokens)?;
        let (device, host) = match self.mode {
            Mode::Resident => (rows.checked_add(keys), 0),
            Mode::HiSparse | Mode::Hybrid => (self.seat_bytes()?.checked_add(keys), rows),
        };
        Ok(RequestBytes { device: device.ok_or_else(|| overflow("tokens", tokens))?, host })
    }

    /// Device tier capacities: resident mode spends the budget on pages of KV rows plus index
    /// keys (KV rows alone where it keeps no index); hisparse mode on as many (seat + index
    /// pages of a typical request) as fit, then the rest on index pages. Every product is
    /// checked: a plan whose sizes overflow is refused, naming the field.
    pub fn device_tier(&self) -> Result<DeviceTierConfig> {
        if !self.keeps_index && self.mode.has_host_tier() {
            return Err(MemoryError::invalid("keeps_index", false, "hisparse mode selects through the index keys"));
        }
        let index_page = self.index_page_bytes()?;
        let (kv_pages, index_pages, seats) = match self.mode {
            Mode::Resident => {
                let pages = self.device_bytes / self.request_bytes(self.page_tokens.max(1))?.device.max(1);
                (pages, if self.keeps_index { pages } else { 0 }, 0)
            }
            Mode::HiSparse | Mode::Hybrid => {
                let (seat, t) = (self.seat_bytes()?, self.typical_tokens);
                let seats =
                    self.device_bytes / self.request_bytes(t).map_err(|_| overflow("typical_tokens", t))?.device.max(1);
                // Hybrid: the seats' rows are also cut in pages of full KV rows (one pool).
                let shared = if self.mode == Mode::Hybrid {
                    let rows = crate::device_tier::hot_buffer_rows_of(self.device_buffer_size);
                    seats.checked_mul(rows).ok_or_else(|| overflow("device_buffer_size", self.device_buffer_size))?
                        / self.page_tokens.max(1)
                } else {
                    0
                };
                // seats * seat <= device_bytes: no overflow.
                (shared, (self.device_bytes - seats * seat) / index_page.max(1), seats)
            }
        };
        let mut tier = DeviceTierConfig {
            layers: self.layers,
            index_layers: self.index_layers,
            kv_row: self.kv_row,
            index_key: self.index_key,
            keeps_index: self.keeps_index,
            page_tokens: self.page_tokens.max(1),
            kv_pages,
            index_pages,
            seats,
            device_buffer_size: self.device_buffer_size,
            shared_pool: self.mode == Mode::Hybrid,
        };
        // The shared pool rounds its seats up to whole key pages (`SharedPoolShape::bytes`):
        // one key page fewer where the budget's remainder does not cover it.
        if tier.keys_in_shared_pool() && tier.bytes() > self.device_bytes {
            tier.index_pages = tier.index_pages.saturating_sub(1);
        }
        Ok(tier)
    }

    /// Host-tier pages (per layer): zero in resident mode.
    pub fn host_pages(&self) -> Result<usize> {
        match self.mode {
            Mode::Resident => Ok(0),
            Mode::HiSparse | Mode::Hybrid => Ok(self.host_bytes / self.kv_page_bytes()?.max(1)),
        }
    }

    /// All capacities, for [`AdmissionControl::new`].
    pub fn resources(&self) -> Result<Resources> {
        let d = self.device_tier()?;
        Ok(Resources {
            // Hybrid: KV pages are the seats' rows, placed but never reserved.
            kv_pages: if d.shared_pool { 0 } else { d.kv_pages },
            index_pages: d.index_pages,
            seats: d.seats,
            host_pages: self.host_pages()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::KvRowFormat;

    fn plan(mode: Mode) -> CapacityPlan {
        CapacityPlan {
            mode,
            layers: 61,
            index_layers: 61,
            kv_row: KvRowLayout::new(KvRowFormat::Fp8, 512, 64).unwrap(),
            index_key: IndexKeyLayout::new(128).unwrap(),
            keeps_index: true,
            page_tokens: 64,
            device_buffer_size: 4096,
            device_bytes: 40 << 30,
            host_bytes: 100 << 30,
            typical_tokens: 40 * 1024,
        }
    }

    #[test]
    fn hisparse_fits_many_more_requests_than_resident() {
        let res = plan(Mode::Resident).resources().unwrap();
        let hs = plan(Mode::HiSparse).resources().unwrap();
        let need_res = Resources::need(Mode::Resident, 40 * 1024, 64, true);
        let need_hs = Resources::need(Mode::HiSparse, 40 * 1024, 64, true);
        let fit = |cap: Resources, need: Resources| {
            let mut a = AdmissionControl::new(cap);
            let mut n = 0;
            while a.try_admit(&need) == Admission::Admitted {
                n += 1;
            }
            n
        };
        let (r, h) = (fit(res, need_res), fit(hs, need_hs));
        // 40 GiB / (40k tokens x 61 layers x 788 B) = 21 resident requests.
        assert_eq!(r, 21);
        // Each hisparse request needs 4097 x 61 x 656 B of hot buffer plus its index keys on the
        // device, and 40k x 61 x 656 B on the host: 100 GiB of host bytes hold 65.
        assert!(h >= 3 * r, "hisparse {h} vs resident {r}");
        assert_eq!(h, 65.min(plan(Mode::HiSparse).device_tier().unwrap().seats));
    }

    #[test]
    fn a_dense_plan_spends_the_budget_on_kv_rows_alone() {
        let dense = CapacityPlan { keeps_index: false, ..plan(Mode::Resident) };
        let (d, r) = (dense.device_tier().unwrap(), plan(Mode::Resident).device_tier().unwrap());
        // 40 GiB over pages of 64 rows of 656 B in 61 layers, against 788 B with the keys.
        assert_eq!(d.kv_pages, (40usize << 30) / (64 * 656 * 61));
        assert_eq!(r.kv_pages, (40usize << 30) / (64 * 788 * 61));
        assert_eq!(d.index_pages, 0);
        assert!(d.bytes() <= 40 << 30 && d.bytes() > (40 << 30) - 64 * 656 * 61, "{}", d.bytes());
        let need = Resources::need(Mode::Resident, 40 * 1024, 64, false);
        assert_eq!((need.kv_pages, need.index_pages), (640, 0));
        let mut a = AdmissionControl::new(dense.resources().unwrap());
        let mut n = 0;
        while a.try_admit(&need) == Admission::Admitted {
            n += 1;
        }
        // 40 GiB / (40k tokens x 61 layers x 656 B): 26 requests, against 21 with the keys.
        assert_eq!(n, 26);
        let e = CapacityPlan { keeps_index: false, ..plan(Mode::HiSparse) }.device_tier().unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "keeps_index", .. }), "{e}");
    }

    #[test]
    fn one_request_takes_what_the_tiers_are_sized_by() {
        let (kv, key) = (656, IndexKeyLayout::new(128).unwrap().row_bytes());
        let t = 40 * 1024 + 1; // 641 pages
        let r = plan(Mode::Resident).request_bytes(t).unwrap();
        assert_eq!(r, RequestBytes { device: 641 * 64 * (kv + key) * 61, host: 0 });
        let dense = CapacityPlan { keeps_index: false, ..plan(Mode::Resident) }.request_bytes(t).unwrap();
        assert_eq!(dense.device, 641 * 64 * kv * 61);
        let h = plan(Mode::HiSparse).request_bytes(t).unwrap();
        assert_eq!(h, RequestBytes { device: 4097 * kv * 61 + 641 * 64 * key * 61, host: 641 * 64 * kv * 61 });
        // A device of exactly one request's bytes seats one; a byte less seats none.
        for (mode, need) in [(Mode::HiSparse, h.device), (Mode::Resident, r.device)] {
            for (bytes, fits) in [(need, 1), (need - 1, 0)] {
                let p = CapacityPlan { device_bytes: bytes, typical_tokens: t, host_bytes: h.host, ..plan(mode) };
                let mut a = AdmissionControl::new(p.resources().unwrap());
                let admitted = a.try_admit(&Resources::need(mode, t, 64, true)) == Admission::Admitted;
                assert_eq!(usize::from(admitted), fits, "{mode:?} with {bytes} B");
            }
        }
        let e = plan(Mode::Resident).request_bytes(usize::MAX).unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "tokens", .. }), "{e}");
    }

    #[test]
    fn overflowing_plans_are_refused_naming_the_field() {
        let huge = CapacityPlan { device_buffer_size: usize::MAX / 2, ..plan(Mode::HiSparse) };
        let e = huge.device_tier().unwrap_err();
        assert!(matches!(e, MemoryError::InvalidField { field: "device_buffer_size", .. }), "{e}");
        let huge = CapacityPlan { typical_tokens: usize::MAX, ..plan(Mode::HiSparse) };
        assert!(matches!(huge.resources().unwrap_err(), MemoryError::InvalidField { field: "typical_tokens", .. }));
        let huge = CapacityPlan { layers: usize::MAX / 8, ..plan(Mode::Resident) };
        assert!(matches!(huge.resources().unwrap_err(), MemoryError::InvalidField { field: "layers", .. }));
        let huge = CapacityPlan { page_tokens: usize::MAX / 2, ..plan(Mode::HiSparse) };
        assert!(huge.host_pages().is_err());
    }

    #[test]
    fn wait_then_admit_and_reject_whole() {
        let cap = Resources { kv_pages: 10, index_pages: 10, seats: 0, host_pages: 0 };
        let mut a = AdmissionControl::new(cap);
        let six = Resources::need(Mode::Resident, 6 * 64, 64, true);
        assert_eq!(a.try_admit(&six), Admission::Admitted);
        assert_eq!(a.try_admit(&six), Admission::Wait { short: "device KV pages" });
        assert_eq!(a.reserved().kv_pages, 6, "a waiting request holds nothing");
        let huge = Resources::need(Mode::Resident, 11 * 64, 64, true);
        match a.try_admit(&huge) {
            Admission::Rejected { reason } => {
                assert!(reason.contains("needs 11 device KV pages") && reason.contains("10 in all"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        a.release(&six).unwrap();
        assert_eq!(a.try_admit(&six), Admission::Admitted);
        assert!(a.release(&huge).is_err(), "cannot release more than reserved");
        let hs = Resources::need(Mode::HiSparse, 100, 64, true);
        assert!(matches!(a.decide(&hs), Admission::Rejected { .. }), "no seats in a resident plan");
    }
}
