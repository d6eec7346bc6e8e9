//! The same trace bytes get the same verdict from a file and from a pipe: a scored trace
//! (version 3) whose score part is damaged is described by `trace info` and replayed by LRU
//! (neither reads scores) alike from both, and refused alike by a policy that reads scores.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{program, split};

/// Runs `args` with `input` as the trace: the file itself, or (`piped`) its bytes on standard
/// input, the trace named `/dev/stdin`. Standard output with the trace's name taken out.
fn run(d: &Path, args: &str, input: &Path, piped: bool) -> (Option<i32>, String, String) {
    let name = if piped { "/dev/stdin".to_string() } else { input.display().to_string() };
    let args = args.replace("TRACE", &name);
    let mut c = Command::new(program())
        .args(split(&args))
        .current_dir(d)
        .stdin(if piped { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if piped {
        let bytes = std::fs::read(input).unwrap();
        // The program may stop reading at a fault: a broken pipe is fine.
        let _ = c.stdin.take().unwrap().write_all(&bytes);
    }
    let Output { status, stdout, stderr } = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&stdout).replace(&name, "TRACE");
    (status.code(), out, String::from_utf8_lossy(&stderr).replace(&name, "TRACE"))
}

#[test]
fn a_damaged_score_part_gets_one_verdict_from_a_file_and_a_pipe() {
    let d = std::env::temp_dir().join(format!("hisparse-cli-trace-pipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let good = d.join("good.hstrace");
    let o = Command::new(program())
        .args(split(
            "trace synth --requests 2 --layers 2 --steps 6 --prompt 600 --top-k 64 --scores --score-margin 8 --out",
        ))
        .arg(&good)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let score = "simulate --trace TRACE --policies score --buffers 96 --out s";
    // A byte near the end whose damage only the score checksum sees (found by trying).
    let bytes = std::fs::read(&good).unwrap();
    let bad = d.join("bad.hstrace");
    let found = (bytes.len().saturating_sub(400)..bytes.len()).rev().any(|i| {
        let mut b = bytes.clone();
        b[i] ^= 0x20;
        std::fs::write(&bad, &b).unwrap();
        let (code, _, err) = run(&d, score, &bad, false);
        code == Some(2) && err.contains("score checksum")
    });
    assert!(found, "no byte of the last record's score part found");
    for args in ["trace info TRACE", "simulate --trace TRACE --policies lru --buffers 96 --out s"] {
        let _ = std::fs::remove_dir_all(d.join("s"));
        let (code, out, err) = run(&d, args, &bad, false);
        let _ = std::fs::remove_dir_all(d.join("s"));
        let (piped_code, piped_out, piped_err) = run(&d, args, &bad, true);
        assert_eq!(code, Some(0), "{args}: {err}");
        assert_eq!((code, &out), (piped_code, &piped_out), "{args}: {err} / {piped_err}");
    }
    for piped in [false, true] {
        let _ = std::fs::remove_dir_all(d.join("s"));
        let (code, _, err) = run(&d, score, &bad, piped);
        assert_eq!(code, Some(2), "piped {piped}: {err}");
        assert!(err.contains("score checksum"), "piped {piped}: {err}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
