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

/// All kernel sources: the fixed ones, a policy-hook harness and a swap-in module per
/// GPU-capable policy, and a harness per built-in prefetcher.
pub fn all_sources() -> Vec<KernelSource> {
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
        code: [include_str!("../../kernels/topk.cu"), include_str!("../../kernels/topk_split.cu")].concat(),
        kernels: &["top_k_select", "topk_hist", "topk_filter", "topk_resolve", "topk_place"],
    });
    v.push(KernelSource {
        name: "attention".into(),
        code: [
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
        name: "rows".into(),
        code: include_str!("../../kernels/rows.cu").to_owned(),
        kernels: &["write_rows", "locate_rows", "fill_unit_bf16", "fill_new_rows"],
    });
    for p in hisparse_policy::policy::builtin(0) {
        if let Some(src) = policy_harness(p.as_ref()) {
            v.push(src);
        }
        if let Some(src) = super::swap_module::swap_in_source(p.as_ref()) {
            v.push(src);
        }
    }
    for b in hisparse_policy::prefetch::BuiltinPrefetcher::ALL {
        let p = (b.spec().make)(&hisparse_policy::prefetch::PrefetcherConfig { budget: 0 });
        if let Some(src) = prefetcher_harness(p.as_ref()) {
            v.push(src);
        }
    }
    v
}

/// The nomination harness of `prefetcher` (named by its source), or `None` for a CPU-only
/// prefetcher.
pub fn prefetcher_harness(prefetcher: &dyn hisparse_policy::prefetch::Prefetcher) -> Option<KernelSource> {
    let program = hisparse_policy::prefetch::cuda::program(prefetcher)?;
    let code = include_str!("../../kernels/prefetch_harness.cu").replace("//@PREFETCHER@", &program);
    Some(KernelSource { name: module_name("prefetch", &code), code, kernels: &["prefetch_nominations"] })
}

/// `template` with `policy`'s CUDA program (prelude, hooks, defaults:
/// `hisparse_policy::policy::cuda::program`) spliced in at `//@POLICY@`, or `None` for a
/// CPU-only policy.
pub(crate) fn splice_policy(template: &str, policy: &dyn hisparse_policy::EvictionPolicy) -> Option<String> {
    let program = hisparse_policy::policy::cuda::program(policy)?;
    Some(template.replace("//@POLICY@", &program))
}

/// A module name for `code` built from `prefix`: named by what it contains (a hash of the
/// source), so two policies that share a name but not a source never share a compiled module.
pub(crate) fn module_name(prefix: &str, code: &str) -> String {
    format!("{prefix}_{:016x}", hisparse_policy::policy::cuda::program_hash(code))
}

/// The hook harness of `policy` (named by its source), or `None` for a CPU-only policy.
pub fn policy_harness(policy: &dyn hisparse_policy::EvictionPolicy) -> Option<KernelSource> {
    let code = splice_policy(include_str!("../../kernels/policy_harness.cu"), policy)?;
    Some(KernelSource { name: module_name("policy", &code), code, kernels: &["policy_hooks"] })
}

/// The source named `name`, if any.
pub fn source(name: &str) -> Option<KernelSource> {
    all_sources().into_iter().find(|s| s.name == name)
}
