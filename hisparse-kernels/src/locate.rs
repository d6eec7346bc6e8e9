//! Rows by position through page tables, on the host: the CPU form of
//! [`crate::Kernels::locate_rows`] (the resident mode's selected rows), with every index checked.

use hisparse_memory::DeviceMemory;

use crate::batch::Span;
use crate::error::{KernelError, Result};

/// See [`crate::Kernels::locate_rows`].
pub fn locate_on_host<M: DeviceMemory>(
    mem: &M,
    selections: &M::Buffer<i32>,
    spans: &[Span],
    page_table: &M::Buffer<u32>,
    first_pages: &[usize],
    page_tokens: usize,
    out: &mut M::Buffer<i32>,
) -> Result<()> {
    if page_tokens == 0 {
        return Err(KernelError::invalid("page_tokens", page_tokens, "must be at least 1"));
    }
    if first_pages.len() != spans.len() {
        return Err(KernelError::invalid("first_pages", first_pages.len(), format!("{} spans", spans.len())));
    }
    let sel = mem.download(selections)?;
    let table = mem.download(page_table)?;
    let mut locs = mem.download(out)?;
    for (i, (s, &first)) in spans.iter().zip(first_pages).enumerate() {
        if s.end() > sel.len() || s.end() > locs.len() {
            return Err(KernelError::invalid("spans", i, "span leaves the selections or the output"));
        }
        for j in s.offset..s.end() {
            let x = usize::try_from(sel[j])
                .map_err(|_| KernelError::invalid("selections", sel[j], format!("request {i}: negative position")))?;
            let page = *table.get(first + x / page_tokens).ok_or_else(|| {
                KernelError::invalid("selections", x, format!("request {i}: position past its pages"))
            })?;
            let row = page as usize * page_tokens + x % page_tokens;
            locs[j] = i32::try_from(row).map_err(|_| KernelError::invalid("page_table", page, "row past i32"))?;
        }
    }
    mem.write(out, 0, &locs)?;
    Ok(())
}
