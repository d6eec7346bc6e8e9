//! Every refusal of the real-model commands is one line, exit 2, before any decoding, naming the
//! flag the user gave (or the file and key) and no internal field; flags a path does not read
//! are refused by name; numbers that would overflow are refused, never wrapped or panicking.
//! The model is the tiny GGUF the test writes (512 positions).
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::process::{Command, Stdio};

use common::split;

/// Internal names that no message may show.
const INTERNAL: [&str; 5] = ["top_k", "device_buffer_size", "d_latent", "max_tokens", "host_tier_bytes"];

struct Case {
    args: String,
    /// What the message must hold (the flag, the key).
    want: &'static [&'static str],
}

fn case(args: impl Into<String>, want: &'static [&'static str]) -> Case {
    Case { args: args.into(), want }
}

/// Runs `c` in `d`; it must exit 2 with one line holding `want` and no internal name.
fn refused(d: &std::path::Path, c: &Case, stdin: Option<&[u8]>) {
    let mut cmd = Command::new(common::program());
    cmd.args(split(&c.args)).current_dir(d).stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().unwrap();
    if let Some(bytes) = stdin {
        use std::io::Write;
        // The program may refuse before reading it all: a broken pipe is fine.
        let _ = child.stdin.take().unwrap().write_all(bytes);
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}: {err}", c.args);
    assert_eq!(err.trim().lines().count(), 1, "{}: {err}", c.args);
    for w in c.want {
        assert!(err.contains(w), "{}: {w} missing from {err}", c.args);
    }
    for bad in INTERNAL {
        assert!(!err.contains(bad), "{}: {bad} in {err}", c.args);
    }
}

#[test]
fn model_flags_are_named_and_unread_ones_refused() {
    let d = std::env::temp_dir().join(format!("hisparse-cli-model-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    hisparse_model::tiny::write_tiny_gguf(&d.join("tiny.gguf"), 3).unwrap();
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../hisparse-model/tests/data/apache-2.0.txt");
    std::fs::write(d.join("c-empty.json"), r#"{"host_tier_path": ""}"#).unwrap();
    // A GGUF whose architecture is not llama: its content's error names --gguf and the file.
    let mut other = std::fs::read(d.join("tiny.gguf")).unwrap();
    let at = other.windows(5).position(|w| w == b"llama").unwrap();
    other[at..at + 5].copy_from_slice(b"qwen2");
    std::fs::write(d.join("other.gguf"), &other).unwrap();
    let long_prompt = "word ".repeat(600);
    let generate = "generate --gguf tiny.gguf --raw --max-tokens 2 --prompt hello";
    let max = u64::MAX;
    let cases = [
        case(format!("{generate} --top-k 0"), &["--top-k"]),
        case(format!("{generate} --top-k 1000"), &["--top-k", "512 positions"]),
        case(format!("{generate} --device-buffer-size 8 --top-k 16"), &["--device-buffer-size", "--top-k (16)"]),
        case(format!("{generate} --attention dense --top-k 8"), &["--top-k does nothing with --attention dense"]),
        case(
            format!("{generate} --attention sparse-resident --device-buffer-size 32"),
            &["--device-buffer-size does nothing"],
        ),
        case(format!("{generate} --kv-format fp8"), &["--kv-format", "use bf16"]),
        case(format!("{generate} --kv-format fp9"), &["--kv-format", "bf16 or fp8"]),
        case(format!("{generate} --sink {max}"), &["--sink"]),
        case(format!("{generate} --window {max} --sink 1"), &["--window"]),
        case("generate --gguf other.gguf --prompt hi", &["--gguf", "other.gguf", "general.architecture"]),
        case(format!("eval --gguf tiny.gguf --text {text} --contexts {max}"), &["--contexts"]),
        case(format!("eval --gguf tiny.gguf --text {text} --contexts 64 --decode {max}"), &["--decode"]),
        case(
            format!("eval --gguf tiny.gguf --text {text} --contexts 64 --score-margin 4"),
            &["--score-margin", "--record-trace"],
        ),
        case(
            format!(
                "eval --gguf tiny.gguf --text {text} --contexts 64 --top-k 8 --score-margin {max} --record-trace t.hstrace"
            ),
            &["--score-margin", "at most"],
        ),
        case(
            format!("eval --gguf tiny.gguf --text {text} --contexts 64 --top-k 8 --buffer-factor 1e300"),
            &["--buffer-factor"],
        ),
    ];
    for c in &cases {
        refused(&d, c, None);
    }
    refused(&d, &case(generate, &["--prompt", "positions"]).with_prompt(&long_prompt), None);
    // `run` and `sweep` with a model: the engine's flags it does not read, by name.
    let run =
        format!("run --gguf tiny.gguf --text {text} --context 64 --prompts 1 --top-k 8 --concurrency 2 --output 2");
    for (flag, value) in [
        ("host-tier-file", " t.bin"),
        ("preset", " glm-5.1"),
        ("preset", " cpu-small"),
        ("config", " c-empty.json"),
        ("miss-fill", " attention"),
        ("host-to-device-ratio", " 3"),
    ] {
        refused(&d, &case(format!("{run} --{flag}{value}"), &[]).expect_unread(flag), None);
    }
    for c in [
        case(format!("{run} --score-margin 4"), &["--score-margin", "--record-trace"]),
        case(format!("{run} --device-memory 1KiB"), &["--device-memory", "holds no request"]),
        case(format!("{run} --device-memory 1KiB --mode hisparse"), &["--device-memory", "holds no request"]),
        case(format!("{run} --device-buffer-size 4"), &["--device-buffer-size", "--top-k (8)"]),
        case(format!("{run} --top-k 0"), &["--top-k"]),
        case(format!("run --text {text} --concurrency 1"), &["--text does nothing without --model or --gguf"]),
        case("run --score-margin 3 --record-trace t.hstrace --concurrency 1", &["--score-margin does nothing without"]),
        case("run --top-k 0 --concurrency 1", &["--top-k", "1..=65534"]),
        case("run --top-k 100000 --concurrency 1", &["--top-k", "100000", "hot buffer"]),
        case(format!("run --top-k {max} --concurrency 1"), &["--top-k", "hot buffer"]),
        case("sweep --prompts 3", &["--prompts does nothing without"]),
        case(format!("sweep --gguf tiny.gguf --text {text} --context 64 --seed 3"), &["--seed does nothing with"]),
        case("run --config c-empty.json --concurrency 1 --output 2", &["--config", "c-empty.json", "host_tier_path"]),
    ] {
        refused(&d, &c, None);
    }
    // A GGUF from a pipe is refused (it is read in place), saying so.
    let bytes = std::fs::read(d.join("tiny.gguf")).unwrap();
    refused(&d, &case("generate --gguf /dev/stdin --prompt hi", &["--gguf", "regular file"]), Some(&bytes));
    assert!(!d.join("t.bin").exists() && !d.join("t.hstrace").exists(), "nothing was written");
    std::fs::remove_dir_all(&d).unwrap();
}

impl Case {
    /// The same case with `--prompt` set to `p` (a value with spaces).
    fn with_prompt(mut self, p: &str) -> Self {
        self.args = self.args.replace("--prompt hello", "");
        self.args.push_str(" --prompt ");
        self.args.push_str(&p.trim().replace(' ', "_"));
        self
    }

    /// The same case expecting `--flag does nothing with --model or --gguf`.
    fn expect_unread(mut self, flag: &'static str) -> Self {
        self.want = match flag {
            "host-tier-file" => &["--host-tier-file does nothing with --model or --gguf"],
            "preset" => &["--preset does nothing with --model or --gguf"],
            "seed" => &["--seed does nothing with --model or --gguf"],
            "config" => &["--config does nothing with --model or --gguf"],
            "miss-fill" => &["--miss-fill does nothing with --model or --gguf"],
            _ => &["--host-to-device-ratio does nothing with --model or --gguf"],
        };
        self
    }
}
