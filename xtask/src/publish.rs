//! The checks that our crates can be picked by others: the CUDA backend built beside candle's
//! cudarc features (a crate outside the workspace, `compat/beside-candle`), and every library
//! crate packaged as crates.io would take it (`cargo package`, built from the package).

use crate::{LIBRARIES, cargo, step, workspace_root};

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
            .env("CARGO_TARGET_DIR", root.join("target")),
    )
}

/// `cargo check` of `compat/beside-candle-cuda`: candle-core's own `cuda` feature (its kernels
/// built by `nvcc`) beside hisparse-engine's `candle-cuda`. Skipped, loudly, without `nvcc`.
pub fn beside_candle_cuda(nvcc: Option<&[(String, String)]>) -> bool {
    let Some(vars) = nvcc else {
        println!("!!!!! compat/beside-candle-cuda NOT CHECKED: no nvcc (run without --offline to set it up) !!!!!");
        return true;
    };
    let root = workspace_root();
    step(
        "candle-core's cuda beside hisparse-engine's candle-cuda (cargo check of compat/beside-candle-cuda)",
        cargo()
            .args(["check", "--quiet", "--manifest-path"])
            .arg(root.join("compat/beside-candle-cuda/Cargo.toml"))
            .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("CARGO_TARGET_DIR", root.join("target")),
    )
}

/// `cargo package` of every library crate (together, so each finds the others it depends on),
/// each then built from its package with default features: the files it needs are in it and its
/// metadata is complete.
pub fn package() -> bool {
    let mut c = cargo();
    c.args(["package", "--quiet", "--allow-dirty"]);
    for l in LIBRARIES {
        c.args(["-p", l]);
    }
    step("cargo package of every library crate (each built from its package)", &mut c)
}
