//! `cargo xtask`: the project's one entry point for chores (see matklad/cargo-xtask).
//!
//! * `cargo xtask ci` — what CI runs, in order: `cargo fmt --check`; clippy on all targets and
//!   features with `-D warnings`; the tests (all features); `cargo doc --no-deps` with warnings
//!   denied; and the CUDA kernel compile check for sm_90a when an NVRTC library is present (one
//!   loud SKIPPED line otherwise). The test runner's summary is printed last.
//!
//! This crate has no dependencies on purpose: it only runs cargo.

// A command-line tool: printing is its job.
#![allow(clippy::print_stdout)]

mod tidy;

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn workspace_root() -> std::path::PathBuf {
    // xtask lives one level below the workspace root.
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(ToOwned::to_owned).unwrap_or_default()
}

/// Runs a step; returns whether it succeeded.
fn step(name: &str, cmd: &mut Command) -> bool {
    println!("\n=== xtask ci: {name}");
    match cmd.status() {
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

/// Runs the workspace tests, echoing their output and adding up the summaries.
fn run_tests() -> (bool, TestTotals) {
    println!("\n=== xtask ci: tests (cargo test --workspace --all-features)");
    let mut totals = TestTotals::default();
    let child = cargo().args(["test", "--workspace", "--all-features"]).stdout(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            println!("=== xtask ci: tests could not start: {e}");
            return (false, totals);
        }
    };
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            totals.add_line(&line);
        }
    }
    let ok = child.wait().map(|s| s.success()).unwrap_or(false);
    (ok && totals.failed == 0, totals)
}

fn ci() -> bool {
    let mut steps_ok = step("cargo fmt --check", cargo().args(["fmt", "--all", "--", "--check"]))
        && step(
            "clippy (all targets, all features, -D warnings)",
            cargo().args(["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"]),
        );
    if !steps_ok {
        return false;
    }
    let (tests_ok, totals) = run_tests();
    steps_ok = tests_ok
        && step(
            "cargo doc --no-deps (warnings denied)",
            cargo().args(["doc", "--workspace", "--no-deps", "--all-features"]).env("RUSTDOCFLAGS", "-D warnings"),
        )
        && kernel_check();
    println!("\n=== xtask ci: {}", if steps_ok { "all steps passed" } else { "FAILED" });
    println!("{}", totals.summary());
    steps_ok
}

/// Compiles every CUDA kernel source for sm_90a through `hisparse check-kernels`.
fn kernel_check() -> bool {
    println!("\n=== xtask ci: CUDA kernel compile check (NVRTC, sm_90a)");
    let status = cargo()
        .args(["run", "--quiet", "-p", "hisparse-bench", "--all-features", "--bin", "hisparse", "--", "check-kernels"])
        .status();
    match status.map(|s| s.code()) {
        Ok(Some(0)) => true,
        Ok(Some(3)) => {
            println!(
                "!!!!! KERNEL COMPILE CHECK SKIPPED: no NVRTC library here (source ../shared/tools/nvrtc-env.sh first) !!!!!"
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
            if ci() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => {
            println!("usage: cargo xtask ci    # fmt, clippy, tests, docs, CUDA kernel compile check");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
