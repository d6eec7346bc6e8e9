//! Every CUDA kernel source of the workspace, embedded in the binary, with the names under which
//! modules are compiled and cached. The kernel compile check (`hisparse check-kernels`, run by
//! `cargo xtask ci`) compiles each one for `sm_90a`.

/// One CUDA translation unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// A unique name (also the NVRTC program name).
    pub name: &'static str,
    /// The CUDA C++ source.
    pub code: String,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [&'static str],
}

/// All kernel sources.
pub fn all_sources() -> Vec<KernelSource> {
    vec![KernelSource {
        name: "fp8_convert",
        code: include_str!("../../kernels/fp8_convert.cu").to_owned(),
        kernels: &["e4m3_encode", "e4m3_decode"],
    }]
}

/// The source named `name`, if any.
pub fn source(name: &str) -> Option<KernelSource> {
    all_sources().into_iter().find(|s| s.name == name)
}
