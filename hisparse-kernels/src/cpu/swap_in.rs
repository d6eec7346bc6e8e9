//! `CpuSwapIn`: the CPU backend's [`DeviceSwapIn`] — the CPU swap-in step
//! (`hisparse_policy::SwapInState::step`) per (seat, layer), reading the step's selections from
//! the selection buffer and writing hot-buffer rows and row locations into the backend's
//! buffers, as the CUDA swap-in does on the GPU; missed rows are read from the host tier by row
//! index (with `MissFill::NoCopies`, the timing bound, only into a slot whose row was never
//! written: the CPU attention refuses an all-zero row, the CUDA one reads it). It also runs the prefetcher on the host (`hisparse_policy::prefetch::PrefetchQueue`,
//! in the simulator's order): nominations after each layer's selection, applied before their
//! layer's swap-in or at the step's end.

use std::sync::Arc;

use hisparse_memory::{EmulatedDevice, HostRowReader, HostTier, HostTierLayout};
use hisparse_policy::prefetch::{Due, LayerPicked, PrefetchCounts, PrefetchQueue, PrefetchStep, When};
use hisparse_policy::{OnlinePolicy, PolicyError, StepCtx, SwapInPlan, SwapInState, SwapInputs};

use crate::error::{KernelError, Result};
use crate::swap_in::{DeviceSwapIn, DeviceSwapInConfig, DeviceSwapReq, SwapCounts};

/// One hot buffer's state in every layer, and its request's queued prefetches.
struct Seat {
    swap: Vec<SwapInState>,
    prefetch: PrefetchQueue,
}

/// The CPU swap-in: see the module documentation.
pub struct CpuSwapIn {
    cfg: DeviceSwapInConfig,
    host: HostRowReader,
    seats: Vec<Option<Seat>>,
    reqs: Vec<DeviceSwapReq>,
    pages: Vec<u32>,
    /// Each request's end in `pages` (its pages are `page_offset..page_end`).
    page_end: Vec<usize>,
    /// The scores the last launch saw (for the end-of-step prefetch of score-aware policies).
    last_scores: Vec<f32>,
    plan: SwapInPlan,
    row: Vec<u8>,
    counts: SwapCounts,
    next_layer: usize,
    /// Rows are copied (false: `MissFill::NoCopies`).
    copies: bool,
}

fn bad(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid { field, value: value.to_string(), reason: reason.into() }
}

/// One request's rows as the CPU swap-in copies them: read from the host tier through its host
/// pages, written into its seat of a layer's hot-buffer pool.
struct RequestRows<'a> {
    host: &'a HostRowReader,
    layout: HostTierLayout,
    /// The request's host page ids.
    pages: &'a [u32],
    req: &'a DeviceSwapReq,
    device_buffer_size: usize,
    /// Without copies (a timing bound), only rows never written (all zero) are filled.
    copies: bool,
}

/// Copies host rows `(token, slot)` of `src`'s request at `layer` into its seat of `hot`;
/// returns the bytes copied. Every index is checked before its row is read or written (a
/// policy-level error: the prefetch queue calls it).
fn copy_rows(
    src: &RequestRows<'_>,
    layer: usize,
    rows: &[(u32, u32)],
    hot: &mut [u8],
    buf: &mut Vec<u8>,
) -> hisparse_policy::Result<usize> {
    let RequestRows { host, layout, pages, req, device_buffer_size, copies } = *src;
    let rb = layout.row_bytes;
    buf.resize(rb, 0);
    let mut copied = 0;
    // Seats and slots fit the pool, whose rows fit an i32 (KvCache::new).
    let base = hisparse_memory::device_tier::hot_seat_base(u64::from(req.seat), device_buffer_size as u64) as usize;
    for &(token, slot) in rows {
        let page = pages
            .get(token as usize / layout.page_tokens)
            .ok_or_else(|| bad("host_pages", token, format!("request {} holds no host page there", req.request)))?;
        let at = (base + slot as usize) * rb;
        let dst = hot.get_mut(at..at + rb).ok_or_else(|| bad("hot", at, "a hot-buffer row outside the pool"))?;
        if !copies && dst.iter().any(|&b| b != 0) {
            continue;
        }
        // SAFETY: every backup of this layer was fenced before the layer's swap-in (the
        // cache's order), so nothing writes the row while it is read.
        unsafe { host.read(layout.row(layer, *page, token as usize), buf)? };
        dst.copy_from_slice(buf);
        copied += 1;
    }
    Ok(copied * rb)
}

impl CpuSwapIn {
    /// A swap-in over `host` for `cfg`'s seats and layers.
    pub fn new(cfg: &DeviceSwapInConfig, host: &HostTier, fill: crate::MissFill) -> Result<Self> {
        if host.layers() != cfg.geometry.layers {
            return Err(KernelError::invalid(
                "layers",
                host.layers(),
                format!("the geometry has {}", cfg.geometry.layers),
            ));
        }
        Ok(Self {
            cfg: cfg.clone(),
            host: host.row_reader(),
            seats: (0..cfg.seats).map(|_| None).collect(),
            reqs: Vec::new(),
            pages: Vec::new(),
            page_end: Vec::new(),
            last_scores: Vec::new(),
            plan: SwapInPlan::default(),
            row: Vec::new(),
            counts: SwapCounts::default(),
            next_layer: 0,
            copies: fill.copies(),
        })
    }

    fn step_of(&self, r: &DeviceSwapReq) -> PrefetchStep {
        PrefetchStep {
            request: r.request,
            step: r.step,
            seq_len: r.seq_len as usize,
            device_buffer_size: self.cfg.device_buffer_size,
        }
    }

    fn add_prefetch(&mut self, c: PrefetchCounts) {
        self.counts.prefetched += c.rows;
        self.counts.bytes_h2d_prefetch += c.bytes;
        self.counts.bytes_h2d += c.bytes;
        self.counts.prefetch_wasted += c.wasted;
    }
}

/// Request `r`'s slice of `scores` (by position), when scores were given.
fn own_scores<'a>(scores: Option<&'a [f32]>, r: &DeviceSwapReq) -> Result<Option<&'a [f32]>> {
    let Some(s) = scores else { return Ok(None) };
    let (a, n) = (r.score_offset as usize, r.seq_len as usize);
    s.get(a..a + n)
        .map(Some)
        .ok_or_else(|| KernelError::invalid("scores", s.len(), format!("request {} scores past the buffer", r.request)))
}

impl DeviceSwapIn<EmulatedDevice> for CpuSwapIn {
    fn reset_seat(&mut self, seat: usize, preload: usize) -> Result<()> {
        let layers = self.cfg.geometry.layers;
        let slot = self
            .seats
            .get_mut(seat)
            .ok_or_else(|| KernelError::invalid("seat", seat, format!("the swap-in has {} seats", self.cfg.seats)))?;
        let mut swap = Vec::with_capacity(layers);
        for _ in 0..layers {
            let mut s = SwapInState::new(self.cfg.device_buffer_size)?;
            if preload > 0 {
                s.preload(preload)?;
            }
            swap.push(s);
        }
        *slot = Some(Seat { swap, prefetch: PrefetchQueue::default() });
        Ok(())
    }

    fn set_policy(&mut self, policy: OnlinePolicy) -> Result<()> {
        for seat in self.seats.iter_mut().flatten() {
            seat.swap.iter_mut().for_each(SwapInState::reset_policy);
        }
        self.cfg.policy = policy;
        Ok(())
    }

    fn begin_step(&mut self, reqs: &[DeviceSwapReq], host_pages: &[u32]) -> Result<()> {
        let mut ends = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            if self.seats.get(r.seat as usize).is_none_or(Option::is_none) {
                return Err(KernelError::invalid(
                    "seat",
                    r.seat,
                    format!("request {} has no swap-in state", r.request),
                ));
            }
            // Pages are listed request after request.
            let end = reqs.get(i + 1).map_or(host_pages.len(), |n| n.page_offset as usize);
            if (r.page_offset as usize) > end || end > host_pages.len() {
                return Err(KernelError::invalid("page_offset", r.page_offset, "outside the step's host pages"));
            }
            ends.push(end);
        }
        self.reqs.clear();
        self.reqs.extend_from_slice(reqs);
        self.pages.clear();
        self.pages.extend_from_slice(host_pages);
        self.page_end = ends;
        self.counts = SwapCounts::default();
        self.next_layer = 0;
        Ok(())
    }

    fn launch(
        &mut self,
        layer: usize,
        selections: &Vec<i32>,
        scores: Option<&Vec<f32>>,
        hot: &mut [Vec<u8>],
        locations: &mut Vec<i32>,
    ) -> Result<()> {
        let hot = hot.get_mut(layer).ok_or_else(|| KernelError::invalid("hot", layer, "no pool for that layer"))?;
        if layer >= self.cfg.geometry.layers {
            return Err(KernelError::invalid(
                "layer",
                layer,
                format!("the swap-in has {} layers", self.cfg.geometry.layers),
            ));
        }
        let (b, layout) = (self.cfg.device_buffer_size, self.host.layout());
        let policy = Arc::clone(self.cfg.policy.get());
        let prefetcher = Arc::clone(&self.cfg.prefetcher);
        let scores = scores.map(Vec::as_slice);
        let mut sel = Vec::new();
        for i in 0..self.reqs.len() {
            let r = self.reqs[i];
            let (a, n) = (r.sel_offset as usize, r.sel_len as usize);
            let picked = selections.get(a..a + n).filter(|_| a + n <= locations.len());
            let picked = picked.ok_or_else(|| KernelError::invalid("sel_offset", r.sel_offset, "past the buffers"))?;
            sel.clear();
            for &x in picked {
                sel.push(u32::try_from(x).map_err(|_| KernelError::invalid("selections", x, "a negative position"))?);
            }
            let own = own_scores(scores, &r)?;
            let step = self.step_of(&r);
            let pages = &self.pages[r.page_offset as usize..self.page_end[i]];
            let Self { host, seats, row, plan, copies, .. } = self;
            let src = RequestRows { host, layout, pages, req: &r, device_buffer_size: b, copies: *copies };
            // `begin_step` checked that the seat has a state.
            let Some(seat) = seats.get_mut(r.seat as usize).and_then(Option::as_mut) else { continue };
            // Rows nominated for this layer earlier in the step come in first.
            let got = seat.prefetch.apply(
                Due { layer: Some(layer), when: When::ThisStep },
                policy.as_ref(),
                step,
                own,
                &mut seat.swap,
                &mut |_, fills| copy_rows(&src, layer, fills, hot, row),
            )?;
            let ctx = StepCtx {
                step: r.step,
                layer: layer as u32,
                request: r.request,
                device_buffer_size: b as u32,
                seed: policy.seed(),
            };
            let inputs = SwapInputs { next_use: None, scores: own };
            seat.swap[layer].step(policy.as_ref(), &sel, r.seq_len as usize, &ctx, inputs, plan)?;
            let bytes = copy_rows(&src, layer, &plan.misses, hot, row)?;
            let base = hisparse_memory::device_tier::hot_seat_base(u64::from(r.seat), b as u64) as i32;
            for (o, &slot) in locations[a..a + n].iter_mut().zip(&plan.locations) {
                *o = base + slot as i32;
            }
            let budget = self.cfg.prefetch_budget;
            let picked = LayerPicked { layer, selected: &sel, scores: own };
            seat.prefetch.nominate(prefetcher.as_ref(), &self.cfg.geometry, budget, step, picked);
            let c = &mut self.counts;
            c.hits += plan.hits.len() as u64;
            c.misses += plan.misses.len() as u64;
            c.max_misses = c.max_misses.max(plan.misses.len() as u64);
            c.bytes_h2d += bytes as u64;
            c.prefetch_useful += plan.prefetch_used as u64;
            c.prefetch_wasted += plan.prefetch_wasted as u64;
            self.add_prefetch(got);
        }
        if policy.needs_scores() && prefetcher.name() != "none" {
            self.last_scores.clear();
            self.last_scores.extend_from_slice(scores.unwrap_or(&[]));
        }
        self.next_layer = layer + 1;
        Ok(())
    }

    fn note_replayed(&mut self, layers: usize) {
        // The CPU backend never captures: nothing is replayed.
        let _ = layers;
    }

    fn end_step(&mut self, hot: &mut [Vec<u8>]) -> Result<SwapCounts> {
        if self.cfg.prefetcher.name() != "none" {
            let (b, layout) = (self.cfg.device_buffer_size, self.host.layout());
            let policy = Arc::clone(self.cfg.policy.get());
            let scores = std::mem::take(&mut self.last_scores);
            for i in 0..self.reqs.len() {
                let r = self.reqs[i];
                let own = if scores.is_empty() { None } else { own_scores(Some(&scores), &r)? };
                let step = self.step_of(&r);
                let pages = &self.pages[r.page_offset as usize..self.page_end[i]];
                let Self { host, seats, row, copies, .. } = self;
                let src = RequestRows { host, layout, pages, req: &r, device_buffer_size: b, copies: *copies };
                let Some(seat) = seats.get_mut(r.seat as usize).and_then(Option::as_mut) else { continue };
                let mut copy = |target: usize, fills: &[(u32, u32)]| {
                    let pool =
                        hot.get_mut(target).ok_or_else(|| bad("hot", target, "no hot-buffer pool for that layer"))?;
                    copy_rows(&src, target, fills, pool, row)
                };
                let got = seat.prefetch.apply(
                    Due { layer: None, when: When::NextStep },
                    policy.as_ref(),
                    step,
                    own,
                    &mut seat.swap,
                    &mut copy,
                )?;
                seat.prefetch.end_step();
                self.add_prefetch(got);
            }
        }
        Ok(self.counts)
    }
}
