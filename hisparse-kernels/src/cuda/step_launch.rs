//! The step helpers' launches of [`CudaBackend`]: batched row writes (from the host or from
//! device buffers), rows by position through page tables, the unit stream generated on the
//! device, and an emulated model's new rows encoded there.

use super::facts::{LocateReq, NewRowsArgs};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig};
use half::bf16;
use hisparse_memory::cuda::CudaMemory;

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaFunction;

use super::buffers::{lock, room, upload_cached};
use super::device::CudaDevice;
use super::driver_error;
use super::printed_launch::PrintedLaunch;
use super::scratch::Scratch;
use crate::batch::Span;
use crate::error::{KernelError, Result, check_len};
use crate::new_rows::NewRows;

/// What the row and unit-stream launches use of the backend.
pub(crate) struct StepLaunch<'a> {
    pub(crate) dev: &'a Arc<CudaDevice>,
    pub(crate) scratch: &'a Mutex<Scratch>,
    pub(crate) sms: usize,
    pub(crate) write_rows: &'a CudaFunction,
    pub(crate) locate_rows: &'a CudaFunction,
    pub(crate) fill_unit: &'a CudaFunction,
    pub(crate) fill_new_rows: &'a CudaFunction,
}

impl StepLaunch<'_> {
    pub(crate) fn launch_write_rows(
        &self,
        pool: &mut CudaSlice<u8>,
        row_bytes: usize,
        rows: &[u32],
        data: &[u8],
    ) -> Result<()> {
        check_row_bytes(row_bytes)?;
        // All rows or none: the indices are checked here, before the launch.
        crate::batch::check_rows_fit(rows, row_bytes, data.len(), pool.len())?;
        if rows.is_empty() {
            return Ok(());
        }
        // One upload: the destination rows, then the data.
        let mut packed = Vec::with_capacity(4 * rows.len() + data.len());
        rows.iter().for_each(|r| packed.extend_from_slice(&r.to_le_bytes()));
        packed.extend_from_slice(data);
        let mut sc = lock(self.scratch)?;
        room(self.dev, &mut sc.rows_data, packed.len())?;
        let s = self.dev.stream();
        s.memcpy_htod(&packed, &mut sc.rows_data.slice_mut(..packed.len())).map_err(driver_error("row data"))?;
        let n = rows.len();
        let Scratch { fault, rows_data, .. } = &mut *sc;
        // SAFETY: the packed rows are whole words (indices and rows are multiples of 4 bytes).
        let words = unsafe { rows_data.transmute::<u32>(packed.len() / 4) }
            .ok_or_else(|| KernelError::invalid("packed", packed.len(), "cannot be viewed as words"))?;
        self.write_indexed(pool, row_bytes, &words.slice(..n), &words.slice(n..), fault)
    }

    pub(crate) fn launch_scatter_rows(
        &self,
        pool: &mut CudaSlice<u8>,
        row_bytes: usize,
        rows: &CudaSlice<u32>,
        data: &CudaSlice<u8>,
    ) -> Result<()> {
        check_row_bytes(row_bytes)?;
        let n = rows.len();
        check_len("data", n * row_bytes, data.len())?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `data` holds n rows of whole words (row_bytes is a multiple of 4).
        let words = unsafe { data.transmute::<u32>(data.len() / 4) }
            .ok_or_else(|| KernelError::invalid("data", data.len(), "cannot be viewed as words"))?;
        let mut sc = lock(self.scratch)?;
        self.write_indexed(pool, row_bytes, &rows.as_view(), &words, &mut sc.fault)
    }

    /// The write kernel: row `i` of `src` to row `idx[i]` of `pool` (`idx.len()` rows; indices
    /// are checked in the kernel, which raises the fault flag instead of writing).
    fn write_indexed(
        &self,
        pool: &mut CudaSlice<u8>,
        row_bytes: usize,
        idx: &CudaView<'_, u32>,
        src: &CudaView<'_, u32>,
        fault: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let n = idx.len();
        let s = self.dev.stream();
        let (n32, words, pool_rows) = (n as u32, (row_bytes / 4) as u32, (pool.len() / row_bytes) as u64);
        let pool_len = pool.len();
        // SAFETY: the pool is viewed as whole words (rows checked in the kernel).
        let mut pool_words = unsafe { pool.transmute_mut::<u32>(pool_len / 4) }
            .ok_or_else(|| KernelError::invalid("pool", pool_len, "cannot be viewed as words"))?;
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = PrintedLaunch::new(&self.dev.print, s, self.write_rows);
        b.arg(idx).arg(src).arg(&n32).arg(&words).arg(&pool_rows).arg_mut(&mut pool_words).arg_mut(fault);
        // SAFETY: n row indices and n rows of `words` words (checked by the callers); pool rows
        // are checked in the kernel.
        unsafe { b.launch(cfg) }.map_err(driver_error("write rows launch"))?;
        Ok(())
    }

    pub(crate) fn launch_fill_new_rows(
        &self,
        fill: &NewRows<'_, CudaMemory>,
        rows: &mut CudaSlice<u8>,
        keys: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        let (kv, key) = (fill.kv_layout, fill.key_layout);
        super::decode_launch::refuse_unread_format(key)?;
        let n = fill.kv_seeds.len();
        check_len("rows", n * kv.row_bytes(), rows.len())?;
        let fp8 = kv.format() == hisparse_memory::KvRowFormat::Fp8;
        if fp8 && !kv.blocked_dims().is_multiple_of(128) {
            return Err(KernelError::invalid("blocked_dims", kv.blocked_dims(), "fp8 rows need a multiple of 128"));
        }
        if key.dim() > super::facts::NEW_ROWS_MAX_KEY_DIM {
            return Err(KernelError::invalid(
                "index_dim",
                key.dim(),
                format!("the CUDA row fill handles up to {}", super::facts::NEW_ROWS_MAX_KEY_DIM),
            ));
        }
        let with_keys = match (&keys, fill.key_seeds) {
            (Some(k), Some(ks)) => {
                check_len("key_seeds", 2 * n, ks.len())?;
                check_len("keys", n * key.row_bytes(), k.len())?;
                true
            }
            (None, None) => false,
            _ => return Err(KernelError::invalid("keys", "one of two", "key seeds and a key buffer come together")),
        };
        if n == 0 {
            return Ok(());
        }
        let a = NewRowsArgs {
            n: n as u32,
            fp8: u32::from(fp8),
            blocked_dims: kv.blocked_dims() as u32,
            bf16_dims: kv.bf16_dims() as u32,
            row_bytes: kv.row_bytes() as u32,
            key_dim: if with_keys { key.dim() as u32 } else { 0 },
            key_c: fill.key_mix.0,
            key_b: fill.key_mix.1,
            step: crate::unit_stream::STEP,
            half_width: crate::unit_stream::HALF_WIDTH,
        };
        let mut sc = lock(self.scratch)?;
        let s = self.dev.stream();
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (super::facts::NEW_ROWS_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let key_seeds = fill.key_seeds.unwrap_or(fill.kv_seeds);
        let mut b = PrintedLaunch::new(&self.dev.print, s, self.fill_new_rows);
        b.params(&a).arg(fill.kv_seeds).arg(key_seeds).arg_mut(rows);
        match keys {
            Some(k) => b.arg_mut(k),
            // Not read or written without keys (key_dim 0).
            None => b.arg_mut(&mut sc.rows_data),
        };
        // SAFETY: n blocks, each writing its own row of `rows` (n rows, checked) and, with keys,
        // its own key (n keys, 2 n seeds, checked); it reads n kv seeds.
        unsafe { b.launch(cfg) }.map_err(driver_error("fill new rows launch"))?;
        Ok(())
    }

    pub(crate) fn launch_locate_rows(
        &self,
        selections: &CudaSlice<i32>,
        spans: &[Span],
        page_table: &CudaSlice<u32>,
        first_pages: &[usize],
        page_tokens: usize,
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        if page_tokens == 0 {
            return Err(KernelError::invalid("page_tokens", page_tokens, "must be at least 1"));
        }
        if first_pages.len() != spans.len() {
            return Err(KernelError::invalid("first_pages", first_pages.len(), format!("{} spans", spans.len())));
        }
        let mut host = Vec::with_capacity(spans.len());
        for (i, (s, &first)) in spans.iter().zip(first_pages).enumerate() {
            if s.end() > selections.len() || s.end() > out.len() {
                return Err(KernelError::invalid("spans", i, "span leaves the selections or the output"));
            }
            if first > page_table.len() {
                return Err(KernelError::invalid("first_pages", first, format!("request {i}: past the page table")));
            }
            // Pages a request may use: up to the next request's first page (or the table's end).
            let next = first_pages.get(i + 1).copied().filter(|&f| f >= first).unwrap_or(page_table.len());
            host.push(LocateReq {
                sel_offset: s.offset as u64,
                sel_len: s.len as u64,
                first_page: first as u64,
                pages: (next.min(page_table.len()) - first) as u64,
            });
        }
        if spans.is_empty() {
            return Ok(());
        }
        let n = spans.len();
        let mut sc = lock(self.scratch)?;
        let Scratch { locate: ld, locate_c, .. } = &mut *sc;
        upload_cached(self.dev, ld, locate_c, &host)?;
        let s = self.dev.stream();
        let pt = page_tokens as u32;
        let Scratch { fault, locate, .. } = &mut *sc;
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = PrintedLaunch::new(&self.dev.print, s, self.locate_rows);
        b.arg(selections).arg(&*locate).arg(page_table).arg(&pt).arg_mut(out).arg_mut(fault);
        // SAFETY: spans lie within selections and out; page indices are checked in the kernel
        // against each request's share of the table (which lies within it).
        unsafe { b.launch(cfg) }.map_err(driver_error("locate rows launch"))?;
        Ok(())
    }

    pub(crate) fn launch_fill_unit(&self, seeds: &[u64], len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        check_len("out", seeds.len() * len, out.len())?;
        if seeds.is_empty() || len == 0 {
            return Ok(());
        }
        let n = seeds.len();
        let mut sc = lock(self.scratch)?;
        room(self.dev, &mut sc.seeds, n)?;
        let s = self.dev.stream();
        s.memcpy_htod(seeds, &mut sc.seeds.slice_mut(..n)).map_err(driver_error("stream seeds"))?;
        self.fill_with(&sc.seeds, n, len, out)
    }

    pub(crate) fn launch_fill_unit_seeded(
        &self,
        seeds: &CudaSlice<u64>,
        len: usize,
        out: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        check_len("out", seeds.len() * len, out.len())?;
        if seeds.is_empty() || len == 0 {
            return Ok(());
        }
        self.fill_with(seeds, seeds.len(), len, out)
    }

    /// The unit-stream kernel: `n` segments of `len` values from the seeds on the device.
    fn fill_with(&self, seeds: &CudaSlice<u64>, n: usize, len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        let s = self.dev.stream();
        let total = n * len.div_ceil(2);
        let blocks = total.div_ceil(256).min(8 * self.sms) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (segs, l32) =
            (n as u32, u32::try_from(len).map_err(|_| KernelError::invalid("len", len, "must fit 32 bits"))?);
        let (step, half) = (crate::unit_stream::STEP, crate::unit_stream::HALF_WIDTH);
        let mut b = PrintedLaunch::new(&self.dev.print, s, self.fill_unit);
        b.arg(seeds).arg(&segs).arg(&l32).arg(&step).arg(&half).arg_mut(out);
        // SAFETY: `out` holds n * len values (checked by the callers); the kernel writes no
        // others and reads n seeds.
        unsafe { b.launch(cfg) }.map_err(driver_error("fill launch"))?;
        Ok(())
    }
}

/// Rows the write kernel can move: whole words.
fn check_row_bytes(row_bytes: usize) -> Result<()> {
    if row_bytes == 0 || !row_bytes.is_multiple_of(4) {
        return Err(KernelError::invalid("row_bytes", row_bytes, "must be a non-zero multiple of 4"));
    }
    Ok(())
}
