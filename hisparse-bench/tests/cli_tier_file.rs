//! The host-tier file flags, alone and together, in `run` (both modes) and `sweep` (several
//! engines in one command): `--host-tier-file` makes a new file and removes it at exit;
//! `--keep-host-tier-file` keeps it (every engine of the command using it in turn);
//! `--overwrite-host-tier-file` replaces a file that was there; without it such a file is
//! refused and left as it was.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};

use common::{run_in, split};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-tier-file-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `args` in `d`; returns the exit code and standard error.
fn go(d: &Path, args: &str) -> (Option<i32>, String) {
    let e = run_in(d, &split(args), std::time::Duration::from_secs(300));
    (e.code, e.stderr)
}

const RUN: &str = "run --backend cpu --concurrency 2 --context 600 --output 4 --out o";
const SWEEP: &str = "sweep --backend cpu --concurrency 1,2 --context 600 --warmup 0 --window 1 --out s";

#[test]
fn each_tier_file_flag_alone_and_together() {
    let d = tmp("flags");
    let tier = d.join("t.bin");
    for cmd in [RUN, SWEEP] {
        // Alone: made, then removed at exit.
        let (code, err) = go(&d, &format!("{cmd} --host-tier-file t.bin"));
        assert_eq!(code, Some(0), "{cmd}: {err}");
        assert!(!tier.exists(), "{cmd}: the tier file outlived the command");
        // Kept: every engine of the command uses it in turn; it stays, of the tier's size.
        let (code, err) = go(&d, &format!("{cmd} --host-tier-file t.bin --keep-host-tier-file"));
        assert_eq!(code, Some(0), "{cmd}: {err}");
        let len = std::fs::metadata(&tier).unwrap().len();
        assert!(len > 1 << 20, "{cmd}: {len} B");
        // Now it exists: refused (naming the flag that would replace it), left as it was.
        std::fs::write(&tier, b"the user's bytes").unwrap();
        for keep in ["", " --keep-host-tier-file"] {
            let (code, err) = go(&d, &format!("{cmd} --host-tier-file t.bin{keep}"));
            assert_eq!(code, Some(2), "{cmd}{keep}: {err}");
            assert!(err.contains("--host-tier-file") && err.contains("--overwrite-host-tier-file"), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert_eq!(std::fs::read(&tier).unwrap(), b"the user's bytes");
        }
        // Overwrite: replaced, then removed at exit.
        let (code, err) = go(&d, &format!("{cmd} --host-tier-file t.bin --overwrite-host-tier-file"));
        assert_eq!(code, Some(0), "{cmd}: {err}");
        assert!(!tier.exists());
        // Overwrite and keep: replaced and kept.
        std::fs::write(&tier, b"the user's bytes").unwrap();
        let (code, err) =
            go(&d, &format!("{cmd} --host-tier-file t.bin --overwrite-host-tier-file --keep-host-tier-file"));
        assert_eq!(code, Some(0), "{cmd}: {err}");
        assert!(std::fs::metadata(&tier).unwrap().len() > 1 << 20);
        std::fs::remove_file(&tier).unwrap();
        // The flags that need a file, without one: refused naming it.
        for lone in ["--keep-host-tier-file", "--overwrite-host-tier-file"] {
            let (code, err) = go(&d, &format!("{cmd} {lone}"));
            assert_eq!(code, Some(2), "{lone}: {err}");
            assert!(err.contains("--host-tier-file"), "{err}");
        }
    }
    // Nothing else of the commands' own is left (their output folders aside).
    let mut left: Vec<String> =
        std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["o", "s"]);
    std::fs::remove_dir_all(d).unwrap();
}
