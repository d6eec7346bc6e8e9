//! Every flag of `run` and `sweep`, given with a real model: read (the command runs to the end
//! with it) or refused on one line naming it (exit 2). The flags are taken from each command's
//! own help, so a new flag fails this test until it is placed in one list or the other.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::{Command, Stdio};

use common::split;

/// `run`'s flags a model's run reads, each with a value it runs with (appended to the base
/// command, which already gives `--gguf`, `--text`, `--context`, `--prompts`, `--top-k`,
/// `--concurrency`, `--output` and `--out`).
const RUN_READ: &[(&str, &str)] = &[
    ("backend", "cpu"),
    ("device-buffer-size", "16"),
    ("eviction-policy", "clock"),
    ("prefetcher", "adjacent-layer"),
    ("prefetch-budget", "4 --prefetcher adjacent-layer"),
    ("kv-format", "bf16"),
    ("index-format", "int4"),
    ("device-memory", "1MiB"),
    ("seed", "3 --arrival-rate 500"),
    ("max-queued", "8"),
    ("mode", "hisparse"),
    ("arrival-rate", "500"),
    ("record-trace", "t.hstrace"),
    ("overwrite", ""),
    ("score-margin", "2 --record-trace s.hstrace"),
];

/// `sweep`'s flags a model's sweep reads (the base gives `--gguf`, `--text`, `--context`,
/// `--prompts`, `--top-k`, `--concurrency`, `--warmup`, `--window`, `--windows`, `--out`).
const SWEEP_READ: &[(&str, &str)] = &[
    ("backend", "cpu"),
    ("device-buffer-size", "16"),
    ("eviction-policy", "fifo"),
    ("prefetcher", "adjacent-layer"),
    ("prefetch-budget", "4 --prefetcher adjacent-layer"),
    ("kv-format", "bf16"),
    ("index-format", "int4"),
    ("device-memory", "1MiB"),
    ("max-queued", "8"),
    ("mode", "resident"),
];

/// The engine's flags a model's run and sweep refuse, each with a value it would take.
const REFUSED: &[(&str, &str)] = &[
    ("preset", "glm-5.1"),
    ("no-graphs", ""),
    ("top-k-blocks", "4"),
    ("attention-kernel", "mma-sync"),
    ("indexer-kernel", "mma-sync"),
    ("emulate-model", "off"),
    ("config", "c.json"),
    ("host-to-device-ratio", "3"),
    ("swap-in-block-size", "256"),
    ("serial-prefetch", ""),
    ("index-queries", "fp8"),
    ("demotion", "largest"),
    ("miss-fill", "attention"),
    ("miss-fill-max-batch", "4"),
    ("copy-engine-share", "0.5"),
    ("host-gather-threads", "2"),
    ("host-tier-file", "tier.bin"),
    // These two need the file's flag (clap), which is refused first, by its name.
    ("overwrite-host-tier-file", "--host-tier-file tier.bin"),
    ("keep-host-tier-file", "--host-tier-file tier.bin"),
    ("gpus", "2"),
];

/// `sweep`'s own refusals with a model.
const SWEEP_REFUSED: &[(&str, &str)] = &[("seed", "3"), ("bound", ""), ("score-margin", "2")];

/// Flags every case holds (in the base command) or that stand for it: `--model` names the model
/// `--gguf` gives here (it fetches SmolLM2), `--help` prints the help.
const GIVEN: &[&str] = &[
    "gguf",
    "model",
    "text",
    "context",
    "prompts",
    "top-k",
    "concurrency",
    "output",
    "out",
    "warmup",
    "window",
    "windows",
    "help",
];

/// The long flags `hisparse <command> --help` lists.
fn flags_of(command: &str) -> Vec<String> {
    let o = Command::new(common::program()).args([command, "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = if l.starts_with('-') && !l.starts_with("--") { l.split_once(", ")?.1 } else { l };
            let name = l.strip_prefix("--")?;
            Some(name.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).next()?.to_owned())
        })
        .collect()
}

/// Runs `args` in `d`: its exit code and standard error.
fn hisparse(d: &std::path::Path, args: &str) -> (Option<i32>, String) {
    let o = Command::new(common::program())
        .args(split(args))
        .current_dir(d)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn every_flag_of_run_and_sweep_is_read_or_refused_with_a_model() {
    let d = std::env::temp_dir().join(format!("hisparse-cli-flag-walk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    hisparse_model::tiny::write_tiny_gguf(&d.join("tiny.gguf"), 5).unwrap();
    std::fs::write(d.join("c.json"), "{}").unwrap();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    let model = format!("--gguf tiny.gguf --text {text} --context 64 --prompts 1 --top-k 8 --concurrency 2");
    let bases = [
        ("run", format!("run {model} --output 2"), RUN_READ, &[][..]),
        ("sweep", format!("sweep {model} --warmup 1 --window 1 --windows 3"), SWEEP_READ, SWEEP_REFUSED),
    ];
    for (command, base, read, own_refused) in bases {
        let refused: Vec<_> = REFUSED.iter().chain(own_refused).collect();
        for flag in flags_of(command) {
            let placed = GIVEN.contains(&flag.as_str())
                || read.iter().any(|(f, _)| *f == flag)
                || refused.iter().any(|(f, _)| *f == flag);
            assert!(placed, "{command} --{flag}: neither read nor refused with a model in this test's lists");
        }
        for (i, (flag, value)) in read.iter().enumerate() {
            let (code, err) = hisparse(&d, &format!("{base} --{flag} {value} --out read-{command}-{i}"));
            assert_eq!(code, Some(0), "{command} --{flag} {value}: {err}");
            assert!(d.join(format!("read-{command}-{i}")).is_dir(), "{command} --{flag}: no output");
        }
        for (flag, value) in refused {
            let (code, err) = hisparse(&d, &format!("{base} --{flag} {value} --out refused"));
            assert_eq!(code, Some(2), "{command} --{flag} {value}: {err}");
            assert_eq!(err.trim().lines().count(), 1, "{command} --{flag}: {err}");
            let named = if flag.ends_with("-host-tier-file") { "host-tier-file" } else { flag };
            assert!(err.contains(&format!("--{named}")), "{command} --{flag}: {err}");
            assert!(!d.join("refused").exists(), "{command} --{flag}: refused after writing");
        }
    }
    // A value the model cannot take is refused naming the flag, not the field behind it.
    let (code, err) = hisparse(&d, &format!("run {model} --output 2 --kv-format fp8 --out refused"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--kv-format") && !err.contains("kv_format"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}
