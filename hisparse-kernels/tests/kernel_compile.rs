//! Every CUDA kernel source compiles for sm_90a under NVRTC (when an NVRTC library is present;
//! otherwise the test says it was skipped).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use hisparse_kernels::cuda;

#[test]
fn every_kernel_source_compiles_for_sm90a() {
    if !cuda::nvrtc_available() {
        eprintln!("SKIPPED: no NVRTC library here (source ../shared/tools/nvrtc-env.sh)");
        return;
    }
    let sources = cuda::all_sources();
    // A hook harness and a swap-in module for every policy with a GPU form.
    for p in hisparse_policy::policy::builtin(0).into_iter().filter(|p| p.cuda().is_some()) {
        let harness = cuda::policy_harness(p.as_ref()).unwrap();
        assert!(sources.iter().any(|s| s.name == harness.name), "no harness for {}", p.name());
        let swap = cuda::swap_in_source(p.as_ref()).unwrap();
        assert!(sources.iter().any(|s| s.name == swap.name), "no swap-in for {}", p.name());
    }
    // A nomination harness for every built-in prefetcher.
    for b in hisparse_policy::prefetch::BuiltinPrefetcher::ALL {
        let p = (b.spec().make)(&hisparse_policy::prefetch::PrefetcherConfig { budget: 0 });
        let h = cuda::prefetcher_harness(p.as_ref()).unwrap_or_else(|| panic!("{} has no GPU form", b.spec().name));
        assert!(sources.iter().any(|s| s.name == h.name), "no harness for {}", b.spec().name);
    }
    for src in sources {
        let k = cuda::compile(&src).unwrap_or_else(|e| panic!("{e}"));
        let ptx = k.ptx.to_src();
        assert!(ptx.contains(".target sm_90a"), "{}: {}", src.name, &ptx[..200.min(ptx.len())]);
        for name in src.kernels {
            assert!(ptx.contains(&format!(".entry {name}")), "{}: kernel {name} missing", src.name);
        }
    }
}

#[test]
fn a_broken_source_reports_the_compiler_log() {
    if !cuda::nvrtc_available() {
        eprintln!("SKIPPED: no NVRTC library here");
        return;
    }
    let bad = cuda::KernelSource {
        name: "broken".into(),
        code: "extern \"C\" __global__ void k() { undefined_thing(); }".into(),
        kernels: &["k"],
    };
    let e = cuda::compile(&bad).err().expect("must fail");
    let msg = e.to_string();
    assert!(msg.contains("broken") && msg.contains("undefined_thing"), "{msg}");
}

/// The layout checks of the generated preludes bite: a copy of the swap-in module whose `SwapReq`
/// declaration has one field's type changed, or two fields swapped, fails to compile with a
/// message naming the struct and the field; the unchanged copy compiles.
#[test]
fn a_struct_laid_out_otherwise_than_rust_fails_the_compile_naming_it() {
    if !cuda::nvrtc_available() {
        eprintln!("SKIPPED: no NVRTC library here (source ../shared/tools/nvrtc-env.sh)");
        return;
    }
    let lru = hisparse_policy::policy::by_name("lru", 0).unwrap();
    let good = cuda::swap_in_source(lru.as_ref()).unwrap();
    let decl = "struct SwapReq {\n    unsigned int seat;\n    unsigned int seq_len;\n";
    assert!(good.code.contains(decl), "the generated declaration: {}", &good.code[..1500.min(good.code.len())]);
    cuda::compile(&good).unwrap_or_else(|e| panic!("the generated source compiles: {e}"));
    for (what, changed, needle) in [
        ("a field's type", "struct SwapReq {\n    unsigned int seat;\n    unsigned long long seq_len;\n", "SwapReq"),
        ("two fields' order", "struct SwapReq {\n    unsigned int seq_len;\n    unsigned int seat;\n", "SwapReq.seat"),
    ] {
        let bad = cuda::KernelSource {
            name: format!("swap_in_{}", what.len()),
            code: good.code.replacen(decl, changed, 1),
            kernels: good.kernels,
        };
        let e = cuda::compile(&bad).err().unwrap_or_else(|| panic!("{what}: compiled")).to_string();
        assert!(e.contains("static assertion failed") && e.contains(needle), "{what}: {e}");
    }
}
