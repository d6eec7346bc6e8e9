//! The checks that our crates can be picked by others: the CUDA backend built beside candle's
//! cudarc features (a crate outside the workspace, `compat/beside-candle`), and every library
//! crate packaged as crates.io would take it (`cargo package`, built from the package).

use crate::{LIBRARIES, cargo, step, target_dir, workspace_root};

/// `cargo check` of `compat/beside-candle`: hisparse's `cuda` features beside cudarc with
/// candle-core 0.11's exact features (`dynamic-linking`, `cuda-version-from-build-system`).
/// Without `nvcc` here, `CUDARC_CUDA_VERSION` stands in for the build system's version, as
/// cudarc's build script allows.
pub fn beside_candle() -> bool {
    let root = workspace_root();
    step(
        "hisparse's CUDA backend beside candle's cudarc features (cargo check of compat/beside-candle)",
        cargo()
            .args(["check", "--quiet", "--manifest-path"])
            .arg(root.join("compat/beside-candle/Cargo.toml"))
            .env("CUDARC_CUDA_VERSION", "13000")
            .env("CARGO_TARGET_DIR", target_dir()),
    )
}

/// `cargo check` of `compat/beside-candle-cuda`: candle-core's own `cuda` feature beside
/// hisparse-engine's `candle-cuda`, with `vars` naming the nvcc its build scripts run (the CI's
/// stand-in: candle's kernels are not compiled, a check neither reads nor links them).
pub fn beside_candle_cuda(vars: &[(String, String)]) -> bool {
    let root = workspace_root();
    step(
        "candle-core's cuda beside hisparse-engine's candle-cuda (cargo check of compat/beside-candle-cuda, the stand-in nvcc)",
        cargo()
            .args(["check", "--quiet", "--manifest-path"])
            .arg(root.join("compat/beside-candle-cuda/Cargo.toml"))
            .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("CARGO_TARGET_DIR", target_dir()),
    )
}

/// `cargo package` of every library crate (together, so each finds the others it depends on),
/// each then built from its package with default features: the files it needs are in it and its
/// metadata is complete.
pub fn package() -> bool {
    forget_extracted_packages();
    let mut c = cargo();
    c.args(["package", "--quiet", "--allow-dirty"]);
    for l in LIBRARIES {
        c.args(["-p", l]);
    }
    step("cargo package of every library crate (each built from its package)", &mut c)
}

/// Removes what earlier runs of [`package`] left extracted in cargo's registry cache: cargo
/// serves the packages to each other from a registry of its own making (a folder of
/// `$CARGO_HOME/registry/src` whose name starts with `-`) and never extracts a crate again
/// whose name and version are there already, so a package changed since would be built from
/// its old sources (a method added to one crate and called from another then fails to
/// verify). Folders of other registries are left alone.
fn forget_extracted_packages() {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else { return };
    let Ok(registries) = std::fs::read_dir(&src) else { return };
    for reg in registries.flatten().filter(|r| r.file_name().to_string_lossy().starts_with('-')) {
        let Ok(crates) = std::fs::read_dir(reg.path()) else { continue };
        for c in crates.flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            if is_our_package(&name) {
                let _ = std::fs::remove_dir_all(c.path());
            }
        }
    }
}

/// Whether `folder` (`name-version`) is one of our library crates' extracted packages.
fn is_our_package(folder: &str) -> bool {
    LIBRARIES.iter().any(|l| {
        folder
            .strip_prefix(l)
            .and_then(|v| v.strip_prefix('-'))
            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::is_our_package;

    #[test]
    fn only_our_crates_extracted_packages_are_forgotten() {
        assert!(is_our_package("hisparse-policy-0.1.0"));
        assert!(is_our_package("hisparse-engine-12.3.4"));
        // hisparse-memory is ours; a crate whose name merely starts like it is not.
        assert!(!is_our_package("hisparse-memory-extra-0.1.0"));
        assert!(!is_our_package("hisparse-bench-0.1.0"));
        assert!(!is_our_package("serde-1.0.0"));
    }
}
