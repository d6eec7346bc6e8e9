//! NVRTC compilation of kernel sources for `sm_90a` (the H200), with the CUDA headers found
//! through `HISPARSE_CUDA_INCLUDE` (then `CUDA_PATH`, `CUDA_HOME`, `/usr/local/cuda`).

use std::path::PathBuf;

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::libs::nvrtc_available;
use super::sources::KernelSource;
use crate::error::{KernelError, Result};

/// The architecture every kernel is compiled for (Hopper with its `a` features: wgmma, TMA).
pub const ARCH: &str = "sm_90a";

/// The NVRTC version `(major, minor)`, or `CudaUnavailable`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(unavailable());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); the pointers are valid for the call.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        Ok((major, minor))
    } else {
        Err(KernelError::Cuda { context: "nvrtcVersion".into(), message: format!("{r:?}") })
    }
}

fn unavailable() -> KernelError {
    KernelError::CudaUnavailable {
        reason: "the NVRTC library (libnvrtc.so) was not found; source ../shared/tools/nvrtc-env.sh or install the CUDA 13.0 toolkit".into(),
    }
}

/// The folder holding `cuda_fp8.h` and friends.
pub fn cuda_include_dir() -> Result<PathBuf> {
    let candidates = std::env::var_os("HISPARSE_CUDA_INCLUDE")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            ["CUDA_PATH", "CUDA_HOME"]
                .into_iter()
                .filter_map(std::env::var_os)
                .map(|p| PathBuf::from(p).join("include")),
        )
        .chain([PathBuf::from("/usr/local/cuda/include")]);
    let mut tried = Vec::new();
    for dir in candidates {
        if dir.join("cuda_fp8.h").is_file() {
            return Ok(dir);
        }
        tried.push(dir.display().to_string());
    }
    Err(KernelError::CudaUnavailable {
        reason: format!("no CUDA headers (cuda_fp8.h) in HISPARSE_CUDA_INCLUDE or {}", tried.join(", ")),
    })
}

/// A compiled kernel module: PTX text for `sm_90a`.
pub struct CompiledKernel {
    /// The source's name.
    pub name: String,
    /// The PTX, ready for `CudaContext::load_module`.
    pub ptx: Ptx,
}

/// Compiles `source` for [`ARCH`] (NVRTC also runs ptxas for an `sm_` target, so assembler
/// errors surface here too).
pub fn compile(source: &KernelSource) -> Result<CompiledKernel> {
    if !nvrtc_available() {
        return Err(unavailable());
    }
    let include = cuda_include_dir()?;
    let opts = CompileOptions {
        arch: Some(ARCH),
        include_paths: vec![include.display().to_string()],
        options: vec!["--std=c++17".into(), "-lineinfo".into(), "-default-device".into()],
        name: Some(format!("{}.cu", source.name)),
        ..CompileOptions::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(&source.code, opts).map_err(|e| KernelError::Compile {
        kernel: source.name.clone(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })?;
    Ok(CompiledKernel { name: source.name.clone(), ptx })
}
