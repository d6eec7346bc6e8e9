//! Every CUDA kernel source of the workspace, embedded in the binary, with the names under which
//! modules are compiled and cached. The kernel compile check (`hisparse check-kernels`, run by
//! `cargo xtask ci`) compiles each one for `sm_90a`.

/// One CUDA translation unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// A unique name (also the NVRTC program name).
    pub name: String,
    /// The CUDA C++ source.
    pub code: String,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [&'static str],
}

use super::facts::{Module, prelude};

/// The fixed kernel sources (each starting with its generated prelude: `facts.rs`); the
/// swap-in's are generated per policy and prefetcher (`super::all_sources` lists both).
pub fn fixed_sources() -> Vec<KernelSource> {
    let mut v = vec![KernelSource {
        name: "fp8_convert".into(),
        code: include_str!("../../kernels/fp8_convert.cu").to_owned(),
        kernels: &["e4m3_encode", "e4m3_decode"],
    }];
    v.push(KernelSource {
        name: "backup".into(),
        code: include_str!("../../kernels/backup.cu").to_owned(),
        kernels: &["scatter_rows", "delay_ns"],
    });
    v.push(KernelSource {
        name: "indexer".into(),
        code: [
            &prelude(Module::Indexer),
            include_str!("../../kernels/indexer.cu"),
            include_str!("../../kernels/wgmma_common.cu"),
            include_str!("../../kernels/indexer_wgmma.cu"),
        ]
        .concat(),
        kernels: &[
            "indexer_scores",
            "indexer_scores_fp8",
            "indexer_scores_fp8_h32",
            "indexer_scores_fp8_h64",
            "indexer_scores_wg_h32",
            "indexer_scores_wg_h64",
            "indexer_scores_fp8_wg_h32",
            "indexer_scores_fp8_wg_h64",
        ],
    });
    v.push(KernelSource {
        name: "topk".into(),
        code: [
            &prelude(Module::TopK),
            include_str!("../../kernels/topk.cu"),
            include_str!("../../kernels/topk_split.cu"),
        ]
        .concat(),
        kernels: &["top_k_select", "topk_hist", "topk_filter", "topk_resolve", "topk_place"],
    });
    v.push(KernelSource {
        name: "attention".into(),
        code: [
            &prelude(Module::Attention),
            include_str!("../../kernels/attention.cu"),
            include_str!("../../kernels/wgmma_common.cu"),
            include_str!("../../kernels/attention_wgmma.cu"),
        ]
        .concat(),
        kernels: &["sparse_mla_decode", "merge_splits", "sparse_mla_decode_wgmma", "sparse_mla_decode_wgmma_fp8"],
    });
    v.push(KernelSource {
        name: "wgmma_probe".into(),
        code: [include_str!("../../kernels/wgmma_common.cu"), include_str!("../../kernels/wgmma_probe.cu")].concat(),
        kernels: &["wgmma_probe_ss", "wgmma_probe_rs", "wgmma_probe_ss_t256"],
    });
    v.push(KernelSource {
        name: "gqa_attention".into(),
        code: prelude(Module::GqaAttention) + include_str!("../../kernels/gqa_attention.cu"),
        kernels: &["sparse_gqa_split", "sparse_gqa_merge"],
    });
    v.push(KernelSource {
        name: "oracle_index".into(),
        code: prelude(Module::Oracle) + include_str!("../../kernels/oracle_index.cu"),
        kernels: &["oracle_chunks", "oracle_logits", "oracle_stats", "oracle_combine"],
    });
    v.push(KernelSource {
        name: "rows".into(),
        code: prelude(Module::Rows) + include_str!("../../kernels/rows.cu"),
        kernels: &["write_rows", "locate_rows", "fill_unit_bf16", "fill_new_rows"],
    });
    v
}

/// A module name for `code` built from `prefix`: named by what it contains (an FNV-1a hash of
/// the source), so two sources that share a prefix but not their code never share a compiled
/// module.
pub(crate) fn module_name(prefix: &str, code: &str) -> String {
    let hash = code.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{prefix}_{hash:016x}")
}

/// The fixed source named `name`, if any.
pub fn source(name: &str) -> Option<KernelSource> {
    fixed_sources().into_iter().find(|s| s.name == name)
}
