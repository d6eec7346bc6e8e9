//! The built `hisparse` program, as a newcomer runs it: a synthetic trace, the simulator on it
//! (table, JSON, CSV, SVG), and one-line errors with exit status 2 for bad input.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output};

fn hisparse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hisparse")).args(args).output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn synth_then_simulate_writes_every_output() {
    let dir = tmp("sim");
    let trace = dir.join("t.hstrace");
    let o = hisparse(&[
        "trace",
        "synth",
        "--out",
        trace.to_str().unwrap(),
        "--requests",
        "2",
        "--layers",
        "2",
        "--steps",
        "30",
        "--prompt",
        "3000",
        "--top-k",
        "256",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.join("out");
    let o = hisparse(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--buffers",
        "256,512,1024",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    for p in ["lru", "fifo", "random", "clock", "belady", "compulsory"] {
        assert!(table.contains(p), "{table}");
    }
    for f in ["simulate.json", "simulate.csv", "miss_ratio.svg", "misses_over_time.svg"] {
        let bytes = std::fs::read(out.join(f)).unwrap();
        assert!(bytes.len() > 200, "{f} is too small");
    }
    let csv = std::fs::read_to_string(out.join("simulate.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 5 * 3 + 1, "{csv}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("simulate.json")).unwrap()).unwrap();
    assert_eq!(json["records"], 2 * 2 * 30);
    let svg = std::fs::read_to_string(out.join("miss_ratio.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("belady"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_prints_one_line_and_exits_2() {
    let dir = tmp("bad");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["simulate".into(), "--trace".into(), dir.join("missing.hstrace").display().to_string()],
            "missing.hstrace",
        ),
        (vec!["selfcheck".into(), "--preset".into(), "llama".into()], "unknown preset"),
        (vec!["selfcheck".into(), "--batch".into(), "0".into()], "--batch = 0"),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = hisparse(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // A corrupt trace names the byte offset.
    let bad = dir.join("bad.hstrace");
    std::fs::write(&bad, b"HSPTRACE\x07\x00garbage, garbage, garbage, garbage").unwrap();
    let o = hisparse(&["simulate", "--trace", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("at byte 8") && err.contains("version"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
