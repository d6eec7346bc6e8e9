//! Admission into the cache: a request's whole-life reservation, its prompt's KV rows into the
//! host tier (hisparse, as a decode node receives them from a prefill node) or the device tier
//! (resident), its index keys into the device tier, a prompt that fits the hot buffer also
//! copied into it (the fast path), and its seat of the swap-in made fresh. Then growing a
//! reservation, and freeing or aborting.
//!
//! Invariant: admission is all or nothing: a failed [`KvCache::admit`] holds nothing.

use std::borrow::Cow;

use hisparse_kernels::{Backend, DeviceSwapIn, RowBackup};
use hisparse_memory::{Admission, DeviceMemory, Mode, RequestId, Resources};

use super::{CachedRequest, KvCache};
use crate::error::{EngineError, Result};

/// Rows handed over by the caller: in host memory, or in a buffer of the backend's memory.
pub enum Rows<'a, M: DeviceMemory> {
    /// Host bytes.
    Host(&'a [u8]),
    /// A device buffer (copied through the host at admission).
    Device(&'a M::Buffer<u8>),
}

impl<M: DeviceMemory> Rows<'_, M> {
    fn len(&self, mem: &M) -> usize {
        match self {
            Rows::Host(b) => b.len(),
            Rows::Device(b) => mem.len(*b),
        }
    }

    fn bytes(&self, mem: &M) -> Result<Cow<'_, [u8]>> {
        Ok(match self {
            Rows::Host(b) => Cow::Borrowed(*b),
            Rows::Device(b) => Cow::Owned(mem.download(*b)?),
        })
    }
}

/// A request's prompt as the prefill produced it.
pub struct Prompt<'a, M: DeviceMemory> {
    /// Its positions.
    pub tokens: usize,
    /// Per layer, `tokens` KV rows in the geometry's row format, position order.
    pub kv_rows: Vec<Rows<'a, M>>,
    /// Per layer that runs an indexer (`KvGeometry::full_layers`, in order), `tokens` index-key
    /// rows (e4m3 codes then the f32 scale), position order.
    pub index_keys: Vec<Rows<'a, M>>,
}

impl<B: Backend> KvCache<B>
where
    B::Memory: Clone,
{
    /// Admits request `id` with `prompt`, reserving room for `reserve_tokens` positions in all
    /// (prompt and the tokens it may decode; [`KvCache::reserve`] raises it later). Returns
    /// [`Admission::Admitted`] when the request now holds its reservation and prompt;
    /// [`Admission::Wait`] or [`Admission::Rejected`] when it holds nothing. Bad input fails
    /// with an error naming the field, holding nothing.
    pub fn admit(&mut self, id: RequestId, prompt: &Prompt<'_, B::Memory>, reserve_tokens: usize) -> Result<Admission> {
        self.check_prompt(id, prompt, reserve_tokens)?;
        let mem = self.backend.memory().clone();
        let g = self.cfg.geometry.clone();
        self.admit_with(id, prompt.tokens, reserve_tokens, |l, rows, keys| {
            rows.copy_from_slice(&prompt.kv_rows[l].bytes(&mem)?);
            if let (Some(k), Some(slot)) = (keys, g.index_slot(l)) {
                k.copy_from_slice(&prompt.index_keys[slot].bytes(&mem)?);
            }
            Ok(())
        })
    }

    /// [`KvCache::admit`] with the prompt produced one layer at a time (so that a long prompt's
    /// rows never all sit in memory at once): `fill(l, rows, keys)` writes layer `l`'s `tokens`
    /// KV rows into `rows` and, on a layer that runs an indexer, its index keys into `keys`.
    /// It is called only once the request is admitted, layers in order.
    pub fn admit_with<F>(&mut self, id: RequestId, tokens: usize, reserve_tokens: usize, fill: F) -> Result<Admission>
    where
        F: FnMut(usize, &mut [u8], Option<&mut [u8]>) -> Result<()>,
    {
        self.check_request(id, tokens, reserve_tokens)?;
        let need = self.need(reserve_tokens);
        match self.admission.try_admit(&need) {
            Admission::Admitted => {}
            other => return Ok(other),
        }
        match self.start(id, tokens, reserve_tokens, fill) {
            Ok(()) => {
                let admitted = self.admissions;
                self.admissions += 1;
                let r = CachedRequest {
                    seq_len: tokens,
                    reserved: reserve_tokens,
                    need,
                    steps: 0,
                    broken: false,
                    admitted,
                };
                self.requests.insert(id, r);
                Ok(Admission::Admitted)
            }
            Err(e) => {
                // Undo whatever was taken, then report.
                let _ = self.device.release(id);
                if let Some(h) = self.host.as_mut() {
                    let _ = h.release(id);
                }
                self.admission.release(&need)?;
                Err(e)
            }
        }
    }

    fn check_request(&self, id: RequestId, t: usize, reserve: usize) -> Result<()> {
        let bad = |field: String, value: String, reason: String| Err(EngineError::Input { field, value, reason });
        if self.requests.contains_key(&id) {
            return Err(EngineError::Request { id: id.0, reason: "already admitted".into() });
        }
        if t == 0 {
            return bad("prompt.tokens".into(), "0".into(), "a prompt has at least one position".into());
        }
        // Keeps every position of the request within the kernels' 32-bit fields.
        if reserve < t || reserve > u32::MAX as usize / 2 {
            return bad(
                "reserve_tokens".into(),
                reserve.to_string(),
                format!("must lie between the prompt's {t} positions and 2^31 - 1"),
            );
        }
        self.check_dense_length("reserve_tokens", reserve)
    }

    /// Refuses `tokens` past top-k in a cache that keeps no index keys (see
    /// [`CacheConfig::keeps_index`]): such a request would need a selection, and so keys.
    fn check_dense_length(&self, field: &str, tokens: usize) -> Result<()> {
        let k = self.cfg.geometry.top_k;
        if !self.cfg.keeps_index() && tokens > k {
            return Err(EngineError::Input {
                field: field.into(),
                value: tokens.to_string(),
                reason: format!(
                    "this cache attends to every position and keeps no index keys (resident, top_k {k} at least \
                     max_request_tokens {}): at most {k} positions",
                    self.cfg.hisparse.max_request_tokens
                ),
            });
        }
        Ok(())
    }

    fn check_prompt(&self, id: RequestId, prompt: &Prompt<'_, B::Memory>, reserve: usize) -> Result<()> {
        self.check_request(id, prompt.tokens, reserve)?;
        let bad = |field: String, value: String, reason: String| Err(EngineError::Input { field, value, reason });
        let t = prompt.tokens;
        let g = &self.cfg.geometry;
        let mem = self.backend.memory();
        for (name, rows, want, row_bytes) in [
            ("prompt.kv_rows", &prompt.kv_rows, g.layers, self.kv_row.row_bytes()),
            ("prompt.index_keys", &prompt.index_keys, g.index_layers(), self.key.row_bytes()),
        ] {
            if rows.len() != want {
                return bad(name.into(), format!("{} entries", rows.len()), format!("the geometry needs {want}"));
            }
            let bytes = t.saturating_mul(row_bytes);
            if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len(mem) != bytes) {
                return bad(
                    format!("{name}[{i}]"),
                    format!("{} bytes", r.len(mem)),
                    format!("{t} rows of {row_bytes} bytes are {bytes}"),
                );
            }
        }
        Ok(())
    }

    /// Registers `id` in the tiers, writes its prompt and makes its swap-in seat fresh. In
    /// hybrid placement the request goes on the device (its rows written as resident mode's,
    /// no seat taken) where pages for `reserve` positions can be had, else into a seat.
    fn start<F>(&mut self, id: RequestId, t: usize, reserve: usize, mut fill: F) -> Result<()>
    where
        F: FnMut(usize, &mut [u8], Option<&mut [u8]>) -> Result<()>,
    {
        let (layers, b) = (self.cfg.geometry.layers, self.cfg.hisparse.device_buffer_size);
        self.device.register(id, self.cfg.mode)?;
        // Where this request's rows go: hybrid placement picks by room.
        if self.cfg.mode == Mode::Hybrid {
            self.take_keys(id, reserve)?;
        }
        let mode = match self.cfg.mode {
            Mode::Hybrid => match self.place_new(id, reserve)? {
                true => Mode::Resident,
                false => Mode::HiSparse,
            },
            m => m,
        };
        self.device.grow(id, t)?;
        if let Some(h) = self.host.as_mut() {
            h.register(id)?;
            h.grow(id, t)?;
        }
        let preload = mode == Mode::HiSparse && t < b;
        let (kb, keyb) = (self.kv_row.row_bytes(), self.key.row_bytes());
        // Destination rows of the prompt's keys and KV rows (the same in every layer).
        let keeps_index = self.cfg.keeps_index();
        // A page summary's row holds several positions: one destination per row.
        let summaries = self.key.positions_per_row() > 1;
        let key_rows = (0..t)
            .step_by(self.key.positions_per_row())
            .filter(|_| keeps_index)
            .map(|p| Ok(self.device.index_key_row(id, p)? as u32))
            .collect::<Result<Vec<_>>>()?;
        let kv_rows = (0..t)
            .map(|p| {
                Ok(match mode {
                    Mode::Resident => self.device.kv_row(id, p)? as u32,
                    Mode::HiSparse | Mode::Hybrid if preload => self.device.hot_row(id, p)? as u32,
                    Mode::HiSparse | Mode::Hybrid => 0,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (mut rows, mut keys) = (vec![0u8; t * kb], vec![0u8; t * keyb]);
        for l in 0..layers {
            let slot = self.cfg.geometry.index_slot(l);
            fill(l, &mut rows, slot.map(|_| keys.as_mut_slice()))?;
            if let (Some(slot), true) = (slot, keeps_index) {
                let folded = if summaries { Some(self.key.fold_positions(&keys)?) } else { None };
                self.backend.write_rows(
                    self.device.keys_mut(slot),
                    keyb,
                    &key_rows,
                    folded.as_deref().unwrap_or(&keys),
                )?;
            }
            match mode {
                Mode::Resident => self.backend.write_rows(self.device.kv_mut(l), kb, &kv_rows, &rows)?,
                Mode::HiSparse | Mode::Hybrid => {
                    if let Some(h) = self.host.as_mut() {
                        h.write_rows(id, l, 0, &rows)?;
                    }
                    if preload {
                        self.backend.write_rows(self.device.hot_mut(l), kb, &kv_rows, &rows)?;
                    }
                }
            }
        }
        if let (Some(swap), Mode::HiSparse) = (self.swap.as_mut(), mode) {
            swap.reset_seat(self.device.seat(id)?, if preload { t } else { 0 })?;
        }
        Ok(())
    }

    /// Raises request `id`'s reservation to `tokens` positions in all. Returns
    /// [`Admission::Admitted`] when it holds them now (nothing changes when it held as many);
    /// otherwise it keeps what it held.
    pub fn reserve(&mut self, id: RequestId, tokens: usize) -> Result<Admission> {
        let r = self.request(id)?;
        if tokens > u32::MAX as usize / 2 {
            return Err(EngineError::Input {
                field: "tokens".into(),
                value: tokens.to_string(),
                reason: "positions stay below 2^31".into(),
            });
        }
        if tokens <= r.reserved {
            return Ok(Admission::Admitted);
        }
        self.check_dense_length("tokens", tokens)?;
        let (old, new) = (r.need, self.need(tokens));
        let more = Resources {
            kv_pages: new.kv_pages - old.kv_pages,
            index_pages: new.index_pages - old.index_pages,
            seats: new.seats - old.seats,
            host_pages: new.host_pages - old.host_pages,
        };
        let got = self.admission.try_admit(&more);
        if got == Admission::Admitted && self.cfg.mode == Mode::Hybrid {
            // Keys for the whole reservation first; a refusal returns what was reserved.
            if let Err(e) = self.take_keys(id, tokens) {
                self.admission.release(&more)?;
                return Err(e);
            }
        }
        if got == Admission::Admitted {
            // The request exists: `request` succeeded above.
            if let Some(r) = self.requests.get_mut(&id) {
                r.reserved = tokens;
                r.need = new;
            }
            // Hybrid: a request on the device holds pages for its whole reservation, or leaves.
            if self.cfg.mode == Mode::Hybrid
                && self.device.holds_pages(id)?
                && self.device.place_pages(id, tokens).is_err()
            {
                self.demote(id)?;
            }
        }
        Ok(got)
    }

    /// Frees everything request `id` holds once its backups are complete; returns the decode
    /// steps it ran.
    pub fn free(&mut self, id: RequestId) -> Result<u32> {
        let r = self.requests.remove(&id).ok_or(EngineError::Request { id: id.0, reason: "not admitted".into() })?;
        let waited = match self.backup.as_mut() {
            Some(bk) => bk.wait_all(),
            None => Ok(()),
        };
        // Everything is returned even when a backup copy failed (its row is gone with the request).
        let dev = self.device.release(id);
        let host = self.host.as_mut().map_or(Ok(()), |h| h.release(id));
        self.admission.release(&r.need)?;
        dev?;
        host?;
        waited?;
        Ok(r.steps)
    }

    /// Ends request `id` between any two steps, before its output is complete — also one whose
    /// last step failed — returning everything it holds ([`KvCache::free`]).
    pub fn abort(&mut self, id: RequestId) -> Result<u32> {
        self.free(id)
    }
}
