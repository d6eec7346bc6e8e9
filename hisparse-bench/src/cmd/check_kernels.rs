//! `hisparse check-kernels`: compiles every CUDA kernel source for sm_90a with NVRTC (or those
//! `--only` names) and reports each one; exits 3 (and says SKIPPED) where no NVRTC library can be
//! loaded.

use crate::error::Result;

/// Options of `hisparse check-kernels`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CheckKernelsArgs {
    /// Compile only these sources (comma separated names, as the report lists them).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Exit status meaning "no NVRTC here, nothing was compiled".
pub const SKIPPED: i32 = 3;

/// Runs the check; returns the process exit status.
#[cfg(feature = "cuda")]
pub fn run(args: &CheckKernelsArgs) -> Result<i32> {
    use hisparse_kernels::cuda;
    let mut sources = cuda::all_sources();
    if let Some(name) = args.only.iter().find(|n| !sources.iter().any(|s| &s.name == *n)) {
        let known: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        return Err(crate::error::BenchError::flag(
            "only",
            name,
            format!("no such source (known: {})", known.join(", ")),
        ));
    }
    if !args.only.is_empty() {
        sources.retain(|s| args.only.contains(&s.name));
    }
    if !cuda::nvrtc_available() {
        crate::console::note(
            "check-kernels: SKIPPED: no NVRTC library could be loaded (source ../shared/tools/nvrtc-env.sh)",
        );
        return Ok(SKIPPED);
    }
    let (major, minor) = cuda::nvrtc_version()?;
    let include = cuda::cuda_include_dir()?;
    crate::console::note(&format!("check-kernels: NVRTC {major}.{minor}, headers in {}", include.display()));
    let mut failed = 0;
    for src in &sources {
        let t = std::time::Instant::now();
        match cuda::compile(src) {
            Ok(k) => crate::console::note(&format!(
                "  ok    {:<20} {:>7} B of PTX for sm_90a in {:>4} ms ({})",
                src.name,
                k.ptx.to_src().len(),
                t.elapsed().as_millis(),
                src.kernels.join(", ")
            )),
            Err(e) => {
                failed += 1;
                crate::console::note(&format!("  FAIL  {}: {e}", src.name));
            }
        }
    }
    crate::console::note(&format!("check-kernels: {} sources, {failed} failed", sources.len()));
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Without the `cuda` feature there are no kernels to compile.
#[cfg(not(feature = "cuda"))]
pub fn run(_: &CheckKernelsArgs) -> Result<i32> {
    crate::console::note("check-kernels: SKIPPED: this build has no `cuda` feature");
    Ok(SKIPPED)
}
