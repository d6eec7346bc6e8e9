//! The step helpers' launches of [`CudaBackend`]: batched row writes, rows by position through
//! page tables, and the unit stream generated on the device.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use half::bf16;

use super::backend::{CudaBackend, Scratch, lock, room, upload_cached};
use super::driver_error;
use crate::backend::Span;
use crate::error::{KernelError, Result, check_len};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct LocateReq {
    pub(super) sel_offset: u64,
    pub(super) sel_len: u64,
    pub(super) first_page: u64,
    pub(super) pages: u64,
}

// SAFETY: a #[repr(C)] struct of plain numbers, laid out as the kernel's `LocateReq`.
unsafe impl DeviceRepr for LocateReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for LocateReq {}

impl CudaBackend {
    pub(super) fn launch_write_rows(
        &self,
        pool: &mut CudaSlice<u8>,
        row_bytes: usize,
        rows: &[u32],
        data: &[u8],
    ) -> Result<()> {
        check_len("data", rows.len() * row_bytes, data.len())?;
        if row_bytes == 0 || !row_bytes.is_multiple_of(4) {
            return Err(KernelError::invalid("row_bytes", row_bytes, "must be a non-zero multiple of 4"));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        // One upload: the destination rows, then the data.
        let mut packed = Vec::with_capacity(4 * n + data.len());
        rows.iter().for_each(|r| packed.extend_from_slice(&r.to_le_bytes()));
        packed.extend_from_slice(data);
        let mut sc = lock(&self.scratch)?;
        room(&self.dev, &mut sc.rows_data, packed.len())?;
        let s = self.dev.stream();
        s.memcpy_htod(&packed, &mut sc.rows_data.slice_mut(..packed.len())).map_err(driver_error("row data"))?;
        let (n32, words, pool_rows) = (n as u32, (row_bytes / 4) as u32, (pool.len() / row_bytes) as u64);
        let Scratch { fault, rows_data, .. } = &mut *sc;
        // SAFETY: the packed buffer holds whole words (rows and data are multiples of 4 bytes).
        let words_view = unsafe { rows_data.transmute::<u32>(packed.len() / 4) }
            .ok_or_else(|| KernelError::invalid("data", data.len(), "cannot be viewed as words"))?;
        let pool_len = pool.len();
        // SAFETY: as above; the pool is viewed as whole words (rows checked in the kernel).
        let mut pool_words = unsafe { pool.transmute_mut::<u32>(pool_len / 4) }
            .ok_or_else(|| KernelError::invalid("pool", pool_len, "cannot be viewed as words"))?;
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(&self.write_rows);
        b.arg(&words_view).arg(&n32).arg(&words).arg(&pool_rows).arg(&mut pool_words).arg(fault);
        // SAFETY: n row indices then n rows of `words` words in the packed buffer; pool rows are
        // checked in the kernel.
        unsafe { b.launch(cfg) }.map_err(driver_error("write rows launch"))?;
        Ok(())
    }

    pub(super) fn launch_locate_rows(
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
        let mut sc = lock(&self.scratch)?;
        let Scratch { locate: ld, locate_c, .. } = &mut *sc;
        upload_cached(&self.dev, ld, locate_c, &host)?;
        let s = self.dev.stream();
        let pt = page_tokens as u32;
        let Scratch { fault, locate, .. } = &mut *sc;
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(&self.locate_rows);
        b.arg(selections).arg(&*locate).arg(page_table).arg(&pt).arg(out).arg(fault);
        // SAFETY: spans lie within selections and out; page indices are checked in the kernel
        // against each request's share of the table (which lies within it).
        unsafe { b.launch(cfg) }.map_err(driver_error("locate rows launch"))?;
        Ok(())
    }

    pub(super) fn launch_fill_unit(&self, seeds: &[u64], len: usize, out: &mut CudaSlice<bf16>) -> Result<()> {
        check_len("out", seeds.len() * len, out.len())?;
        if seeds.is_empty() || len == 0 {
            return Ok(());
        }
        let n = seeds.len();
        let mut sc = lock(&self.scratch)?;
        room(&self.dev, &mut sc.seeds, n)?;
        let s = self.dev.stream();
        s.memcpy_htod(seeds, &mut sc.seeds.slice_mut(..n)).map_err(driver_error("stream seeds"))?;
        let total = n * len.div_ceil(2);
        let blocks = total.div_ceil(256).min(8 * self.sms) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (segs, l32) =
            (n as u32, u32::try_from(len).map_err(|_| KernelError::invalid("len", len, "must fit 32 bits"))?);
        let (step, half) = (crate::unit_stream::STEP, crate::unit_stream::HALF_WIDTH);
        let mut b = s.launch_builder(&self.fill_unit);
        b.arg(&sc.seeds).arg(&segs).arg(&l32).arg(&step).arg(&half).arg(out);
        // SAFETY: `out` holds seeds.len() * len values (checked); the kernel writes no others.
        unsafe { b.launch(cfg) }.map_err(driver_error("fill launch"))?;
        Ok(())
    }
}
