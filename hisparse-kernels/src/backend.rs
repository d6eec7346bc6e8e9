//! The backend traits: [`Kernels`] (the kernels of one decode step — indexer, top-k, sparse
//! attention — and the row copies, over a backend's own device memory), [`StepControl`],
//! [`ModelKernels`] and [`Backend`]. Their argument types are `batch.rs`'s.

use half::bf16;
use hisparse_memory::{DeviceMemory, HostTier};

use crate::batch::{AttentionBatch, IndexerBatch, KernelStage, Span, StageSeconds, check_rows_fit};
use crate::error::Result;
use crate::new_rows::NewRows;
use crate::row_backup::{RowBackup, RowBackupConfig};
use crate::swap_in::{DeviceSwapIn, DeviceSwapInConfig};

/// A buffer of `T` in backend `B`'s device memory.
pub type Buf<B, T> = <<B as Kernels>::Memory as DeviceMemory>::Buffer<T>;

/// The kernels of one decode step, implemented once per device (CPU, CUDA): the lightning
/// indexer, top-k, sparse attention and the row copies of the resident mode. A new backend
/// implements these; the other concerns ([`StepControl`]: stage timing and launch capture;
/// [`ModelKernels`]: an emulated model's data, its GEMMs and collectives) have defaults that
/// run on the host or say what the backend lacks, and [`Backend`] adds the two objects the KV
/// cache takes from a backend.
///
/// Every method checks its arguments and returns a typed error naming the field at fault before
/// it writes anything.
pub trait Kernels: Send + Sync {
    /// The memory this backend's kernels read and write.
    type Memory: DeviceMemory;

    /// A short name (`"cpu"`, `"cuda"`).
    fn name(&self) -> &'static str;
    /// The backend's device memory, to allocate buffers and copy data in and out.
    fn memory(&self) -> &Self::Memory;
    /// Indexer scores for every position of every request of `batch`, written to
    /// `scores[r.score_offset..r.score_offset + r.seq_len]` for each request `r`. The spans must
    /// not overlap.
    fn indexer_scores(&self, batch: &IndexerBatch<'_, Self::Memory>, scores: &mut Buf<Self, f32>) -> Result<()>;
    /// The `k` highest scores of each request's span of `scores`, ties going to the lower
    /// position, as positions in ascending order: request `i` writes `out[i * k..(i + 1) * k]`
    /// (`out` holds at least `spans.len() * k`; the rest is left alone). Fails with
    /// [`crate::KernelError::TopKExceedsLength`] when a span is shorter than `k`.
    fn top_k(&self, scores: &Buf<Self, f32>, spans: &[Span], k: usize, out: &mut Buf<Self, i32>) -> Result<()>;
    /// Sparse attention of each request over its selected rows: `out` is `[batch, heads, d_v]`,
    /// `lse` is `[batch, heads]` (natural log of the softmax denominator, `-inf` for an empty
    /// selection, whose output is zero).
    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, Self::Memory>,
        out: &mut Buf<Self, f32>,
        lse: &mut Buf<Self, f32>,
    ) -> Result<()>;
    /// Writes row `i` of `data` (`rows.len()` rows of `row_bytes`) to row `rows[i]` of `pool`,
    /// for all rows at once (the default writes them one by one through [`Kernels::memory`]).
    /// All rows or none: every row index is checked before the first is written.
    fn write_rows(&self, pool: &mut Buf<Self, u8>, row_bytes: usize, rows: &[u32], data: &[u8]) -> Result<()> {
        check_rows_fit(rows, row_bytes, data.len(), self.memory().len(pool))?;
        for (&r, d) in rows.iter().zip(data.chunks_exact(row_bytes.max(1))) {
            self.memory().write(pool, r as usize * row_bytes, d)?;
        }
        Ok(())
    }
    /// Maps selected positions to pool rows through page tables: for request `i`,
    /// `out[s + j] = page_table[first_pages[i] + x / page_tokens] * page_tokens + x % page_tokens`
    /// with `x = selections[s + j]`, `s = spans[i].offset`, `j < spans[i].len` (the resident
    /// mode's rows by position). The default computes on the host.
    fn locate_rows(
        &self,
        selections: &Buf<Self, i32>,
        spans: &[Span],
        page_table: &Buf<Self, u32>,
        first_pages: &[usize],
        page_tokens: usize,
        out: &mut Buf<Self, i32>,
    ) -> Result<()> {
        crate::locate::locate_on_host(self.memory(), selections, spans, page_table, first_pages, page_tokens, out)
    }
    /// [`Kernels::write_rows`] with everything in device memory: row `i` of `data` goes to
    /// row `rows[i]` of `pool` (`data` holds `len(rows)` rows of `row_bytes`). All rows or none
    /// where the backend checks on the host; a row index the backend can only check on the
    /// device is written nowhere and reported by [`StepControl::finish_step`]. The default copies
    /// both to the host.
    fn scatter_rows(
        &self,
        pool: &mut Buf<Self, u8>,
        row_bytes: usize,
        rows: &Buf<Self, u32>,
        data: &Buf<Self, u8>,
    ) -> Result<()> {
        let (rows, data) = (self.memory().download(rows)?, self.memory().download(data)?);
        self.write_rows(pool, row_bytes, &rows, &data)
    }
}

/// Stage timing on the backend's own clock, fault reports, and capture and replay of launch
/// sequences. Every method has a default for a backend that launches synchronously and
/// captures nothing.
pub trait StepControl: Kernels {
    /// Marks the beginning (`begin`) or end of a stage on the backend's own clock. Launches are
    /// asynchronous on some backends, so host timers around them measure nothing; the default
    /// does nothing and [`StepControl::finish_step`] then returns `None`.
    fn mark_stage(&self, stage: KernelStage, begin: bool) -> Result<()> {
        let _ = (stage, begin);
        Ok(())
    }
    /// Waits for all launched work, reports any fault a kernel found in its data (an
    /// out-of-range page id or row location), and returns the seconds measured per stage since
    /// the last call (or `None` where the backend does not time stages itself).
    fn finish_step(&self) -> Result<Option<StageSeconds>> {
        Ok(None)
    }
    /// The print of every launch since the last call (kernel, grid and every argument, by value
    /// or by device address), which starts a new one: two launch sequences with equal prints do
    /// the same work, so one captured earlier may be replayed instead ([`StepControl::replay`]).
    /// `0` on backends that do not capture.
    fn launch_print(&self) -> u64 {
        0
    }
    /// Starts capturing: launches until [`StepControl::end_capture`] are recorded, not run. `false`
    /// (the default) where the backend cannot capture; its launches then run as usual.
    fn begin_capture(&self) -> Result<bool> {
        Ok(false)
    }
    /// Ends the capture and keeps what was recorded under `key` (replacing what was kept);
    /// fails, keeping nothing, when something in the capture could not be recorded.
    fn end_capture(&self, key: u64) -> Result<()> {
        let _ = key;
        Ok(())
    }
    /// Runs the launch sequence kept under `key`; `false` when none is kept under it.
    fn replay(&self, key: u64) -> Result<bool> {
        let _ = key;
        Ok(false)
    }
}

/// What an emulated model runs on the backend: its data (new rows, the unit stream), its bf16
/// GEMMs and a deployment's collectives. The defaults generate and multiply on the host and have
/// no collectives.
pub trait ModelKernels: Kernels {
    /// An emulated model's new rows ([`crate::new_rows`]): `rows` gets one KV row per seed of
    /// `fill.kv_seeds`, `keys` (with `fill.key_seeds`) one index key each. The default generates
    /// on the host ([`crate::new_rows::fill_new_rows_host`]) and copies.
    fn fill_new_rows(
        &self,
        fill: &NewRows<'_, Self::Memory>,
        rows: &mut Buf<Self, u8>,
        keys: Option<&mut Buf<Self, u8>>,
    ) -> Result<()> {
        let mem = self.memory();
        let seeds = mem.download(fill.kv_seeds)?;
        let key_seeds = fill.key_seeds.map(|k| mem.download(k)).transpose()?;
        let mut r = vec![0u8; mem.len(rows)];
        let mut k = keys.as_ref().map(|k| vec![0u8; mem.len(*k)]);
        crate::new_rows::fill_new_rows_host(
            fill.kv_layout,
            &seeds,
            fill.key_layout,
            key_seeds.as_deref(),
            fill.key_mix,
            &mut r,
            k.as_deref_mut(),
        )?;
        mem.write(rows, 0, &r)?;
        if let (Some(keys), Some(k)) = (keys, k) {
            mem.write(keys, 0, &k)?;
        }
        Ok(())
    }
    /// Fills `out` with `seeds.len()` segments of `len` values: segment `i` is the unit stream
    /// seeded `seeds[i]` ([`crate::unit_stream`]) rounded to bf16 — an emulated model's data,
    /// generated where it is used. The default generates on the host and copies.
    fn fill_unit_bf16(&self, seeds: &[u64], len: usize, out: &mut Buf<Self, bf16>) -> Result<()> {
        crate::error::check_len("out", seeds.len() * len, self.memory().len(out))?;
        let (mut v, mut host) = (vec![0f32; len], Vec::with_capacity(seeds.len() * len));
        for &s in seeds {
            crate::unit_stream::fill_unit(s, &mut v);
            host.extend(v.iter().map(|&x| bf16::from_f32(x)));
        }
        self.memory().write(out, 0, &host)?;
        Ok(())
    }
    /// [`ModelKernels::fill_unit_bf16`] with the seeds already in device memory. The default copies
    /// them to the host.
    fn fill_unit_bf16_seeded(&self, seeds: &Buf<Self, u64>, len: usize, out: &mut Buf<Self, bf16>) -> Result<()> {
        let host = self.memory().download(seeds)?;
        self.fill_unit_bf16(&host, len, out)
    }
    /// A batch of bf16 GEMMs ([`crate::GemmShape`]): `c_i = a_i · b_i`, f32 accumulation. The
    /// default runs the CPU twin ([`crate::gemm::gemm_bf16`]) on host copies.
    fn gemm_bf16(
        &self,
        shape: &crate::GemmShape,
        a: &Buf<Self, bf16>,
        b: &Buf<Self, bf16>,
        c: &mut Buf<Self, bf16>,
    ) -> Result<()> {
        let mem = self.memory();
        shape.check(mem.len(a), mem.len(b), mem.len(c))?;
        let (ha, hb) = (mem.download(a)?, mem.download(b)?);
        let mut hc = vec![bf16::ZERO; shape.c_len()];
        crate::gemm::gemm_bf16(shape, &ha, &hb, &mut hc)?;
        mem.write(c, 0, &hc)?;
        Ok(())
    }
    /// This backend's side of a group of ranks (one engine per device of a deployment), for
    /// `member`: the CPU takes [`crate::collectives::RankMember::Cpu`], CUDA
    /// [`crate::collectives::RankMember::Nccl`]; the default has no collectives.
    fn join_group(
        &self,
        member: crate::collectives::RankMember,
    ) -> Result<Box<dyn crate::collectives::Collectives<Self::Memory>>> {
        Err(crate::KernelError::invalid(
            "gpus",
            member.ranks(),
            format!("the {} backend has no collectives", self.name()),
        ))
    }
}

/// A backend the KV cache runs on: its kernels, step control and model kernels, and the two
/// objects it makes for the cache — the swap-in (`crate::swap_in`) and the backup of new rows.
pub trait Backend: Kernels + StepControl + ModelKernels {
    /// The backend's swap-in ([`Backend::device_swap_in`]): a backend over
    /// [`hisparse_memory::EmulatedDevice`] may name [`crate::CpuSwapIn`].
    type SwapIn: DeviceSwapIn<Self::Memory>;

    /// The backend's backup of new rows to the host tier ([`Backend::row_backup`]): a backend
    /// over [`hisparse_memory::EmulatedDevice`] may name [`crate::cpu::CpuRowBackup`].
    type Backup: RowBackup<Self::Memory>;

    /// The swap-in over `host` (registered with the device here where the backend needs it):
    /// selections, scores, hot buffers and locations stay in the backend's memory.
    fn device_swap_in(&self, cfg: &DeviceSwapInConfig, host: &mut HostTier) -> Result<Self::SwapIn>;
    /// Who brings each layer's missed rows into its hot buffer in this backend's swap-in (the
    /// backend's option; [`crate::MissFill::SwapIn`], the swap-in's own copies, unless set).
    fn miss_fill(&self) -> crate::MissFill {
        crate::MissFill::SwapIn
    }
    /// The backup of new rows from the hot buffers into `host`.
    fn row_backup(&self, cfg: &RowBackupConfig, host: &mut HostTier) -> Result<Self::Backup>;
}
