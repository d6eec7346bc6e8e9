//! What the decode kernels (attention, indexer, top-k, rows) and their Rust launches share,
//! written once, here: the constants (tile and block sizes, shared-memory sizes) emitted as
//! `#define`s, the argument structs (`hisparse_memory::c_struct!`s), and the generated prelude
//! each of those kernel modules' source starts with ([`prelude`]). The swap-in's are in
//! `crate::cuda::swap_in::facts`. The `.cu` files declare none
//! of these; the prelude's `static_assert`s fail the NVRTC compile, naming the struct and field,
//! if C ever lays an argument struct out otherwise than Rust.
//!
//! Invariant: every struct passed to a decode kernel by value or in a device buffer is a
//! `c_struct!` here, listed in its module's prelude; every constant both sides use is a `const`
//! here.

use hisparse_memory::c_layout::{define, part};

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct GpuIndexerReq as IndexerReq {
        pub(crate) first_page: u32,
        pub(crate) seq_len: u32,
        pub(crate) score_offset: u32,
        pub(crate) pad: u32,
    }
}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct GpuSpan as Span {
        pub(crate) offset: u64,
        pub(crate) len: u64,
    }
}

// SAFETY: #[repr(C)] structs of plain numbers, whose C declarations are generated from them (the compile checks the layouts).
unsafe impl DeviceRepr for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuIndexerReq {}
// SAFETY: as above.
unsafe impl DeviceRepr for GpuSpan {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for GpuSpan {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub(crate) struct LocateReq {
        pub(crate) sel_offset: u64,
        pub(crate) sel_len: u64,
        pub(crate) first_page: u64,
        pub(crate) pages: u64,
    }
}

hisparse_memory::c_struct! {
    /// The arguments of `fill_new_rows` (the kernel's `NewRowsArgs`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct NewRowsArgs {
        pub(crate) n: u32,
        pub(crate) fp8: u32,
        pub(crate) blocked_dims: u32,
        pub(crate) bf16_dims: u32,
        pub(crate) row_bytes: u32,
        pub(crate) key_dim: u32,
        pub(crate) key_c: f32,
        pub(crate) key_b: f32,
        pub(crate) step: f32,
        pub(crate) half_width: f32,
    }
}

// SAFETY: a #[repr(C)] struct of plain numbers, whose C declaration is generated from it (`NewRowsArgs`).
unsafe impl DeviceRepr for NewRowsArgs {}

// SAFETY: a #[repr(C)] struct of plain numbers, whose C declaration is generated from it (`LocateReq`).
unsafe impl DeviceRepr for LocateReq {}
// SAFETY: as above.
unsafe impl ValidAsZeroBits for LocateReq {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct SplitArgs {
        pub(crate) k: u32,
        pub(crate) chunk: u32,
        pub(crate) blocks: u32,
        pub(crate) pad: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for SplitArgs {}

hisparse_memory::c_struct! {
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct AttnParams {
        /// Query heads of a request.
        pub(crate) heads: u32,
        /// 1152 (bf16) or 656 (fp8).
        pub(crate) row_bytes: u32,
        /// 1: FlashMLA fp8 rows.
        pub(crate) fp8: u32,
        /// Blocks per (request, head group).
        pub(crate) splits: u32,
        /// Rows of the pool.
        pub(crate) pool_rows: u64,
        /// softmax_scale * log2(e).
        pub(crate) scale_log2: f32,
        /// Fills only: 1 writes each filled row to its location.
        pub(crate) write_back: u32,
        /// The mapped host tier (fills only).
        pub(crate) host_base: u64,
        /// Rows of the host tier (fills only).
        pub(crate) host_rows: u64,
        /// Warpgroup-MMA kernels: leave out (mask) rows whose fill word is set (`hits-first`).
        pub(crate) skip_filled: u32,
        /// With `part_stride`: the first partial of this launch per (request, head).
        pub(crate) part_base: u32,
        /// 0: partials as `splits` says; else always partials, this many per (request, head).
        pub(crate) part_stride: u32,
        /// Zero (keeps the size a multiple of 8).
        pub(crate) pad: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for AttnParams {}

hisparse_memory::c_struct! {
    /// The parameters of the grouped-query attention (`kernels/gqa_attention.cu`).
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct GqaParams {
        /// Rows of the pool.
        pub(crate) pool_rows: u64,
        /// Query heads of a request.
        pub(crate) heads: u32,
        /// KV heads (groups) of a row; `heads` is a multiple of them.
        pub(crate) kv_heads: u32,
        /// Dims of a head.
        pub(crate) head_dim: u32,
        /// Bytes of a row.
        pub(crate) row_bytes: u32,
        /// 1: e4m3 rows with a scale per 128 values.
        pub(crate) fp8: u32,
        /// fp8 rows: where the scales start (after the `2 kv_heads head_dim` codes).
        pub(crate) scales_at: u32,
        /// Multiplier of `q . k` before the softmax.
        pub(crate) scale: f32,
        /// Zero (keeps the size a multiple of 8).
        pub(crate) pad: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for GqaParams {}

hisparse_memory::c_struct! {
    /// The parameters of the oracle's scores (`kernels/oracle_index.cu`).
    #[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
    pub(crate) struct OracleArgs {
        /// Query heads of a request.
        pub(crate) heads: u32,
        /// Dims of a key (every KV head's).
        pub(crate) dim: u32,
        /// Bytes of a key row in the pool (fp8: the e4m3 key and its f32 scale; top-channel: the
        /// places, the codes and the scale).
        pub(crate) key_bytes: u32,
        /// Positions per page of the key pool.
        pub(crate) page_tokens: u32,
        /// Pages of the key pool.
        pub(crate) pool_pages: u32,
        /// The first `sink` positions are scored +inf (at most the longest request).
        pub(crate) sink: u32,
        /// The last `window` positions are scored +inf (at most the longest request).
        pub(crate) window: u32,
        /// 1: the newest position is scored +inf.
        pub(crate) pin_newest: u32,
        /// 1: the heads' largest weight; 0: their sum.
        pub(crate) combine_max: u32,
        /// Tiles of `ORACLE_TILE` positions of the longest request (the partials' stride).
        pub(crate) tiles: u32,
        /// Bytes between a tile's key rows in shared memory (`oracle_tile_stride`).
        pub(crate) tile_stride: u32,
        /// 16-dim chunks of a key (`dim / 16`, at most `ORACLE_MAX_CHUNKS`).
        pub(crate) chunks: u32,
        /// Top-channel keys: values kept of every `group` (0: fp8 keys, staged as they are).
        pub(crate) keep: u32,
        /// Top-channel keys: values per group (0 for fp8 keys).
        pub(crate) group: u32,
    }
}

// SAFETY: #[repr(C)] struct of plain numbers, whose C declaration is generated from it (the compile checks the layout).
unsafe impl DeviceRepr for OracleArgs {}

/// The oracle's scores: threads per block (C `ORACLE_THREADS`): eight warps, four row groups of
/// 16 positions times two sets of head blocks.
pub(crate) const ORACLE_THREADS: usize = 256;
/// The oracle's logits: positions per block (C `ORACLE_TILE`: four row groups of 16).
pub(crate) const ORACLE_TILE: usize = 64;
/// The oracle's logits: blocks of 8 heads each warp accumulates (C `ORACLE_HEAD_BLOCKS`).
pub(crate) const ORACLE_HEAD_BLOCKS: usize = 8;
/// The oracle's scores: the most query heads (two sets of `ORACLE_HEAD_BLOCKS` blocks of 8).
pub(crate) const ORACLE_MAX_HEADS: usize = 2 * ORACLE_HEAD_BLOCKS * 8;
/// The oracle's scores: the most 16-dim chunks of a key (C `ORACLE_MAX_CHUNKS`; a head block's
/// list of the chunks it reads has a count byte, then one byte per chunk).
pub(crate) const ORACLE_MAX_CHUNKS: usize = 80;

/// Bytes between two key rows of the oracle's tile in shared memory: the row's words rounded up
/// to 4 more than a multiple of 32, so that a warp's 4-byte loads of 8 rows (4 threads a row)
/// hit 32 banks.
pub(crate) fn oracle_tile_stride(key_bytes: usize) -> usize {
    let words = key_bytes.div_ceil(4);
    4 * (words + (4 + 32 - words % 32) % 32)
}

/// The new rows' fill: threads per block (each request's row and key).
pub(crate) const NEW_ROWS_THREADS: usize = 128;
/// The new rows' fill: the longest index key (a grouped-query model's keys are every KV head's).
pub(crate) const NEW_ROWS_MAX_KEY_DIM: usize = 1024;

/// Grouped-query attention: threads per block (C `GQA_THREADS`).
pub(crate) const GQA_THREADS: usize = 128;
/// Grouped-query attention: the largest head it takes (its query sits in shared memory).
pub(crate) const GQA_MAX_HEAD_DIM: usize = 256;
/// Grouped-query attention: selected rows per block (C `GQA_CHUNK`).
pub(crate) const GQA_CHUNK: usize = 128;
/// Grouped-query attention: the most query heads per KV head (C `GQA_MAX_GROUP`).
pub(crate) const GQA_MAX_GROUP: usize = 8;

/// The MLA row the attention kernels are built for: its latent dims (C `DV`, the value dims).
pub(crate) const MLA_D_LATENT: usize = 512;
/// Its rope dims.
pub(crate) const MLA_D_ROPE: usize = 64;
/// Its query-key dims (C `DQK`).
pub(crate) const MLA_D_QK: usize = MLA_D_LATENT + MLA_D_ROPE;
/// Bytes of a bf16 row (C `ROW_BF16`; `KvRowLayout`'s, checked by a test).
pub(crate) const ROW_BF16: usize = 2 * MLA_D_QK;
/// Bytes of a FlashMLA fp8 row (C `ROW_FP8`): the latent as e4m3, an f32 scale per 128 dims,
/// the rope as bf16.
pub(crate) const ROW_FP8: usize = FP8_ROPE_AT + 2 * MLA_D_ROPE;
/// Where a FlashMLA fp8 row's rope starts (C `FP8_ROPE_AT`): after the e4m3 latent and its scales.
pub(crate) const FP8_ROPE_AT: usize = MLA_D_LATENT + 4 * (MLA_D_LATENT / 128);
/// The indexer's key dims (C `KEY_DIM`).
pub(crate) const KEY_DIM: usize = 128;
/// Bytes of an indexer key row (C `KEY_BYTES`): the e4m3 key and its f32 scale
/// (`IndexKeyLayout`'s, checked by a test).
pub(crate) const KEY_BYTES: usize = KEY_DIM + 4;
/// Indexer (warpgroup MMA): a staging tile of 64 key rows (C `WGI_TILE`).
pub(crate) const WGI_TILE: usize = 64 * KEY_BYTES;
/// Indexer (warpgroup MMA): staging tiles a block (C `WGI_STAGES`; four blocks an SM for 64
/// heads, five for 32). More tiles in fewer blocks measured slower (64 heads: 5 tiles in 3
/// blocks 63% of the HBM copy, 7 in 3 62%, 11 in 2 53%, against 69%: BENCHMARKS.md); what bounds
/// the kernel is the instructions a chunk takes, not the copies in flight.
pub(crate) const WGI_STAGES: usize = 4;

/// Attention: query heads of one block (C `HB`).
pub(crate) const HEAD_BLOCK: usize = 64;
/// Attention (mma.sync): rows per tile.
pub(crate) const TILE: usize = 32;
/// Attention: threads per block.
pub(crate) const ATTN_THREADS: usize = 256;
/// Attention: padded bf16 stride of the Q and K rows in shared memory (1168 B).
const LDS: usize = 584;
/// Attention: padded bf16 stride of the P rows.
const LDP: usize = 40;
/// Attention: padded f32 stride of the partial-S rows.
const LDX: usize = 40;
/// Attention: bytes of a tile's raw rows (bf16 rows of 1152 B).
const RAW_BYTES: usize = TILE * ROW_BF16;
/// Shared memory of the mma.sync attention: Q and K tiles, P, two partial-S buffers, two tiles
/// of locations and of fill words, the raw rows.
pub(crate) const ATTN_SMEM: usize = HEAD_BLOCK * LDS * 2
    + TILE * LDS * 2
    + HEAD_BLOCK * LDP * 2
    + 2 * HEAD_BLOCK * LDX * 4
    + 2 * TILE * 4
    + 2 * TILE * 8
    + RAW_BYTES;
/// Attention (warpgroup MMA): rows per tile.
pub(crate) const WG_TILE: usize = 64;
/// Attention (warpgroup MMA): one 64-dim atom of a 64-row bf16 operand.
const WG_ATOM: usize = 8192;
/// Attention (warpgroup MMA): the fp8 form's raw staging tile (64 rows of 656 B).
const WG_RAW_FP8: usize = WG_TILE * ROW_FP8;
/// Shared memory of the warpgroup-MMA attention over bf16 rows: Q and two K operands of nine
/// atoms, P, alpha, l and m, the skip flags.
pub(crate) const WG_SMEM: usize = 3 * 9 * WG_ATOM + WG_ATOM + 3 * WG_TILE * 4 + 128;
/// The fp8 form's: Q and one K operand, the raw fp8 tile, P, the statistics, the flags.
pub(crate) const WG_SMEM_FP8: usize = 2 * 9 * WG_ATOM + WG_RAW_FP8 + WG_ATOM + 3 * WG_TILE * 4 + 128;

/// Top-k: threads of the one-block kernel.
pub(crate) const TOPK_THREADS: usize = 1024;
/// Top-k: radix bins of a pass.
pub(crate) const TOPK_BINS: usize = 2048;
/// Top-k: copies of the histogram in shared memory.
const TOPK_COPIES: usize = 8;
/// Top-k: candidates kept in shared memory once a pass's threshold bin is this small.
const TOPK_CAP: usize = 8192;
/// Top-k: positions the candidates' bitmaps cover.
const TOPK_FAST_N: usize = 262_144;
/// Dynamic shared memory of the one-block top-k: the histograms, the candidates' keys and
/// positions, the bitmap.
pub(crate) const TOPK_SMEM: usize = (TOPK_COPIES * TOPK_BINS + 2 * TOPK_CAP + TOPK_FAST_N / 32) * 4;
/// Top-k (several blocks per request): threads per block.
pub(crate) const SPLIT_THREADS: usize = 512;

/// The kernel modules whose sources start with a generated prelude.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// `attention.cu`, `attention_wgmma.cu`.
    Attention,
    /// `indexer.cu`, `indexer_wgmma.cu`.
    Indexer,
    /// `topk.cu`, `topk_split.cu`.
    TopK,
    /// `rows.cu`.
    Rows,
    /// `gqa_attention.cu`.
    GqaAttention,
    /// `oracle_index.cu`.
    Oracle,
}

/// The generated head of `module`'s source: its constants, structs and formulas.
pub fn prelude(module: Module) -> String {
    use hisparse_memory::c_layout::prelude as make;
    match module {
        Module::Attention => make(
            &[
                define("HB", HEAD_BLOCK),
                define("TILE", TILE),
                define("THREADS", ATTN_THREADS),
                define("LDS", LDS),
                define("LDP", LDP),
                define("LDX", LDX),
                define("RAW_BYTES", RAW_BYTES),
                define("WG_TILE", WG_TILE),
                define("WG_ATOM", WG_ATOM),
                define("WG_RAW_FP8", WG_RAW_FP8),
                define("WG_SMEM", WG_SMEM),
                define("WG_SMEM_FP8", WG_SMEM_FP8),
                define("DQK", MLA_D_QK),
                define("DV", MLA_D_LATENT),
                define("ROW_BF16", ROW_BF16),
                define("ROW_FP8", ROW_FP8),
                define("FP8_ROPE_AT", FP8_ROPE_AT),
            ],
            &[part::<GpuSpan>(), part::<AttnParams>()],
        ),
        Module::Indexer => make(
            &[
                define("KEY_DIM", KEY_DIM),
                define("KEY_BYTES", KEY_BYTES),
                define("WGI_TILE", WGI_TILE),
                define("WGI_STAGES", WGI_STAGES),
            ],
            &[part::<GpuIndexerReq>()],
        ),
        Module::TopK => make(
            &[
                define("THREADS", TOPK_THREADS),
                define("BINS", TOPK_BINS),
                define("COPIES", TOPK_COPIES),
                define("CAP", TOPK_CAP),
                define("FAST_N", TOPK_FAST_N),
                define("SPLIT_THREADS", SPLIT_THREADS),
            ],
            &[part::<GpuSpan>(), part::<SplitArgs>()],
        ),
        Module::Rows => make(
            &[define("NEW_ROWS_KEY_PER_THREAD", NEW_ROWS_MAX_KEY_DIM / NEW_ROWS_THREADS)],
            &[part::<LocateReq>(), part::<NewRowsArgs>()],
        ),
        Module::GqaAttention => make(
            &[
                define("GQA_THREADS", GQA_THREADS),
                define("GQA_CHUNK", GQA_CHUNK),
                define("GQA_MAX_GROUP", GQA_MAX_GROUP),
                define("GQA_MAX_HEAD_DIM", GQA_MAX_HEAD_DIM),
            ],
            &[part::<GpuSpan>(), part::<GqaParams>()],
        ),
        Module::Oracle => make(
            &[
                define("ORACLE_THREADS", ORACLE_THREADS),
                define("ORACLE_TILE", ORACLE_TILE),
                define("ORACLE_HEAD_BLOCKS", ORACLE_HEAD_BLOCKS),
                define("ORACLE_MAX_HEADS", ORACLE_MAX_HEADS),
                define("ORACLE_MAX_CHUNKS", ORACLE_MAX_CHUNKS),
            ],
            &[part::<GpuIndexerReq>(), part::<OracleArgs>()],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_sizes_are_the_kernels_formulas() {
        // The values the kernels were written for.
        assert_eq!(
            ATTN_SMEM,
            64 * 584 * 2 + 32 * 584 * 2 + 64 * 40 * 2 + 2 * 64 * 40 * 4 + 2 * 32 * 4 + 2 * 32 * 8 + 32 * 1152
        );
        assert_eq!(WG_SMEM, 3 * 9 * 8192 + 8192 + 3 * 64 * 4 + 128);
        assert_eq!(WG_SMEM_FP8, 2 * 9 * 8192 + 64 * 656 + 8192 + 3 * 64 * 4 + 128);
        assert_eq!(TOPK_SMEM, (8 * 2048 + 2 * 8192 + 8192) * 4);
        assert!(prelude(Module::Attention).contains("static_assert(sizeof(AttnParams)"));
    }

    #[test]
    fn the_row_sizes_are_the_memory_crates_layouts() {
        use hisparse_memory::{IndexKeyLayout, KvRowFormat, KvRowLayout};
        let bf16 = KvRowLayout::new(KvRowFormat::Bf16, MLA_D_LATENT, MLA_D_ROPE).unwrap();
        let fp8 = KvRowLayout::new(KvRowFormat::Fp8, MLA_D_LATENT, MLA_D_ROPE).unwrap();
        assert_eq!((bf16.row_bytes(), fp8.row_bytes()), (ROW_BF16, ROW_FP8));
        assert_eq!((ROW_BF16, ROW_FP8, FP8_ROPE_AT, MLA_D_QK), (1152, 656, 528, 576));
        let key = IndexKeyLayout::new(KEY_DIM).unwrap();
        assert_eq!((key.row_bytes(), key.dim()), (KEY_BYTES, KEY_DIM));
    }

    /// The facts the kernels share with Rust are spelled only in the generated prelude: the
    /// `.cu` files' code (comments aside) never writes the row's dims and sizes, the key row's
    /// size or the indexer's shared-memory formula.
    #[test]
    fn the_kernels_spell_no_shared_literal() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let checks: [(&str, &[&str]); 4] = [
            ("attention.cu", &["576", "512", "656", "1152", "528", "72", "36", "41"]),
            ("attention_wgmma.cu", &["576", "512", "656", "1152", "528", "72", "36", "41"]),
            ("indexer.cu", &["132", "33"]),
            ("indexer_wgmma.cu", &["132", "WGI_SMEM", "define WGI_"]),
        ];
        for (file, banned) in checks {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let code = code.split("/*").next().unwrap_or("");
                for b in banned {
                    let found = code.match_indices(b).any(|(at, _)| {
                        let before = code[..at].chars().next_back();
                        let after = code[at + b.len()..].chars().next();
                        let word =
                            |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
                        b.starts_with(|c: char| !c.is_ascii_digit()) || (!word(before) && !word(after))
                    });
                    assert!(!found, "{file}:{}: spells {b}, a fact of src/cuda/facts.rs: {line}", i + 1);
                }
            }
        }
    }
}
