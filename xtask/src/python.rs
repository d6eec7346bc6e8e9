//! The Python package's tests: a virtual environment (`target/py-venv`, made once) with
//! maturin, NumPy, pandas and pytest from PyPI, the package built into it by `maturin develop`,
//! then `pytest hisparse-py/tests`.

use std::path::Path;
use std::process::Command;

use crate::{step, workspace_root};

fn venv_has(venv: &Path, what: &[&str]) -> bool {
    what.iter().all(|w| venv.join("bin").join(w).exists())
}

/// Builds the package into the environment and runs its tests.
pub fn tests() -> bool {
    let root = workspace_root();
    let venv = root.join("target/py-venv");
    let python = venv.join("bin/python");
    if !venv_has(&venv, &["python", "maturin", "pytest"]) {
        let ok = step(
            "Python: a virtual environment in target/py-venv",
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
        ) && step(
            "Python: maturin, numpy, pandas, pytest from PyPI",
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "maturin>=1.9,<2",
                "numpy",
                "pandas",
                "pytest",
            ]),
        );
        if !ok {
            return false;
        }
    }
    let manifest = root.join("hisparse-py/Cargo.toml");
    let lint = step(
        "Python: the extension's Rust (fmt --check, clippy -D warnings)",
        crate::cargo().args(["fmt", "--check", "--manifest-path"]).arg(&manifest),
    ) && step(
        "Python: clippy of hisparse-py",
        crate::cargo()
            .args(["clippy", "--quiet", "--all-targets", "--manifest-path"])
            .arg(&manifest)
            .args(["--", "-D", "warnings"])
            .env("CARGO_TARGET_DIR", crate::target_dir().join("py")),
    );
    if !lint {
        return false;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![venv.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(paths).unwrap_or(path);
    step(
        "Python: the package built into the environment (maturin develop)",
        Command::new(venv.join("bin/maturin"))
            .args(["develop", "--quiet", "-m"])
            .arg(root.join("hisparse-py/Cargo.toml"))
            .env("VIRTUAL_ENV", &venv)
            .env("PATH", &path)
            .env("CARGO_TARGET_DIR", crate::target_dir().join("py")),
    ) && step(
        "Python: pytest hisparse-py/tests",
        Command::new(venv.join("bin/pytest")).args(["-q"]).arg(root.join("hisparse-py/tests")).env("PATH", &path),
    )
}
