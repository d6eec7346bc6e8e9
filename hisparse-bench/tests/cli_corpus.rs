//! The bad-input corpus of the `hisparse` program, run in CI: for every command and its flags,
//! zero, negative, huge, overflowing, NaN and wrong-unit values; missing, folder, empty,
//! truncated, garbage and hostile-but-valid trace and config files; unwritable, existing and
//! missing output places. Every case must end within its time limit with its expected exit status
//! (2: one line on stderr naming the flag), never with a signal (abort, bus error), a panic or a
//! hang; no case may leave an output folder or a temporary file behind.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{npy, program, raw_trace, run_in, split};

/// An int32 tensor view for a safetensors file.
fn view(shape: Vec<usize>, b: &[u8]) -> safetensors::tensor::TensorView<'_> {
    safetensors::tensor::TensorView::new(safetensors::Dtype::I32, shape, b).unwrap()
}

/// Writes the corpus's input files into `dir`.
fn inputs(dir: &Path) {
    let w = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    let ok: Vec<_> = (1..=4).flat_map(|s| (0..2).map(move |l| (s, 0u64, l, 50 + s, vec![1, 2, 3, 49 + s]))).collect();
    let ok = raw_trace(4, 2, &ok);
    w("ok.hstrace", &ok);
    w("truncated.hstrace", &ok[..ok.len() - 30]);
    w("empty.hstrace", b"");
    w("garbage.hstrace", b"HSPTRACE garbage garbage garbage garbage garbage");
    w("huge-seq.hstrace", &raw_trace(4, 1, &[(1, 0, 0, u32::MAX, vec![0, 1, 2, u32::MAX - 1])]));
    w("huge-topk.hstrace", &raw_trace(u32::MAX, 1, &[(1, 0, 0, 100, vec![1, 2, 3])]));
    w("zero-layers.hstrace", &raw_trace(4, 0, &[]));
    w("no-records.hstrace", &raw_trace(4, 1, &[]));
    w("dup-step.hstrace", &raw_trace(4, 1, &[(1, 0, 0, 50, vec![1, 2]), (1, 0, 0, 50, vec![1, 3])]));
    w("unsorted.hstrace", &raw_trace(4, 1, &[(1, 0, 0, 50, vec![9, 3])]));
    w("duplicate-pos.hstrace", &raw_trace(4, 1, &[(1, 0, 0, 50, vec![3, 3])]));
    w("beyond-seq.hstrace", &raw_trace(4, 1, &[(1, 0, 0, 50, vec![3, 60])]));
    w(
        "duplicate-pos.jsonl",
        b"{\"hisparse_trace\": 1, \"top_k\": 4, \"layers\": 1, \"row_bytes\": 656, \"has_scores\": false}\n\
          {\"step\": 1, \"request\": 0, \"layer\": 0, \"seq_len\": 50, \"selected\": [3, 3]}\n",
    );
    w(
        "bad-header.jsonl",
        b"{\"hisparse_trace\": 1, \"top_k\": 4, \"layers\": 0, \"row_bytes\": 656, \"has_scores\": false}\n",
    );
    w("bad-layer.hstrace", &raw_trace(4, 1, &[(1, 0, 7, 50, vec![3])]));
    w("too-many.hstrace", &raw_trace(2, 1, &[(1, 0, 0, 50, vec![1, 2, 3])]));
    w("empty.json", b"");
    w("garbage.json", b"garbage");
    w("array.json", b"[1, 2]");
    w("bogus.json", br#"{"bogus": 1}"#);
    w("conflict.json", br#"{"top_k": 2048}"#);
    w("small-buffer.json", br#"{"device_buffer_size": 100}"#);
    w("existing.bin", b"precious");
    // Selections to import: [steps 2, layers 1, top_k 2] as int32.
    let sel: Vec<u8> = [1i32, 5, 2, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
    w("ok.npy", &npy("<i4", "(2, 1, 2)", &sel));
    w("float.npy", &npy("<f8", "(2, 1, 2)", &[0u8; 32]));
    w("rank1.npy", &npy("<i4", "(4,)", &sel));
    w("short.npy", &npy("<i4", "(2, 1, 2)", &sel[..10]));
    w("huge-shape.npy", &npy("<i4", "(4294967296, 1, 2)", &sel));
    let neg: Vec<u8> = [1i32, -2, 2, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
    w("negative.npy", &npy("<i4", "(2, 1, 2)", &neg));
    w("garbage.npy", b"garbage");
    let mut st = (u64::MAX / 2).to_le_bytes().to_vec();
    st.extend_from_slice(b"{}");
    w("huge-header.safetensors", &st);
    w("mq99.json", br#"{"mq_queues": 99}"#);
    // Config keys that set sizes (each error names the key and the file).
    w("c-device.json", br#"{"device_kv_bytes": 1000000000000}"#);
    w("c-host.json", br#"{"host_tier_bytes": 1}"#);
    w("c-page.json", br#"{"page_tokens": 100000000}"#);
    // A trace whose top_k no hot buffer holds.
    w(
        "huge-topk.jsonl",
        b"{\"hisparse_trace\": 1, \"top_k\": 70000, \"layers\": 1}\n\
          {\"step\": 1, \"request\": 0, \"layer\": 0, \"seq_len\": 50, \"selected\": [3, 4]}\n",
    );
    // Sparse files: one that only begins like a trace, one with a good header and 32 GB.
    let big = |name: &str, head: &[u8], len: u64| {
        std::fs::write(dir.join(name), head).unwrap();
        std::fs::OpenOptions::new().write(true).open(dir.join(name)).unwrap().set_len(len).unwrap();
    };
    big("sparse-4g.hstrace", b"HSPTRACE", 4 << 30);
    big("sparse-32g.hstrace", &ok[..32], 32 << 30);
    // Captures that would merge requests or shrink a sequence.
    let sel: Vec<u8> = [1i32, 5, 2, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
    let st = |tensors: Vec<(&str, safetensors::tensor::TensorView<'_>)>| safetensors::serialize(tensors, None).unwrap();
    w("dup-names.safetensors", &st(vec![("1", view(vec![2, 1, 2], &sel)), ("01", view(vec![2, 1, 2], &sel))]));
    let lens: Vec<u8> = [50i32, 40].iter().flat_map(|x| x.to_le_bytes()).collect();
    w("shrinking.safetensors", &st(vec![("0", view(vec![2, 1, 2], &sel)), ("0.seq_len", view(vec![2], &lens))]));
    // A link to a user's file, a FIFO, and a folder holding a user's file.
    std::os::unix::fs::symlink(dir.join("existing.bin"), dir.join("link.bin")).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir_all(dir.join("users")).unwrap();
    std::fs::write(dir.join("users/notes.txt"), b"precious").unwrap();
    w("clock0.json", br#"{"clock_bits": 0}"#);
    std::fs::create_dir_all(dir.join("a-folder")).unwrap();
}

/// `(args, expected exit status, text stderr must contain)`.
type Case = (Vec<String>, i32, String);

/// One case per (base command, flag, bad value): exit 2 naming the flag.
fn flag_cases(base: &str, flag: &str, values: &[&str]) -> Vec<Case> {
    values
        .iter()
        .map(|v| {
            let mut a = split(base);
            a.push(format!("--{flag}"));
            a.push((*v).to_owned());
            (a, 2, format!("--{flag}"))
        })
        .collect()
}

const U64_MAX: &str = "18446744073709551615";
const OVER: &str = "18446744073709551616";

fn corpus() -> Vec<Case> {
    let sweep = "sweep --backend cpu --concurrency 1 --context 300 --warmup 0 --window 1 --out out-sweep";
    let run = "run --backend cpu --concurrency 1 --context 300 --output 1 --out out-run";
    let dump = "dump-step --backend cpu --concurrency 1 --context 300 --step 1 --out out-dump/s.safetensors";
    let calib = "calibrate --preset cpu-small --context 256 --steps 4 --requests 1";
    let selfc = "selfcheck --preset cpu-small --batch 1 --context 300 --runs 1";
    let sim = "simulate --trace ok.hstrace --out out-sim";
    let synth = "trace synth --out out.hstrace --requests 1 --layers 1 --steps 2 --prompt 100 --top-k 8";
    let mut c: Vec<Case> = Vec::new();
    let counts = ["0", "-1", U64_MAX, OVER, "NaN", "3x"];
    let sizes = ["0", "-1", U64_MAX, OVER, "NaN", "1e999"];
    // sweep (and with it, every engine option)
    c.extend(flag_cases(sweep, "concurrency", &["0", "-1", "65537", U64_MAX, OVER, "NaN"]));
    c.extend(flag_cases(sweep, "context", &sizes));
    c.extend(flag_cases(sweep, "context", &["1000000000000", "10000000"]));
    c.extend(flag_cases(sweep, "warmup", &["-1", U64_MAX, OVER, "NaN"]));
    c.extend(flag_cases(sweep, "window", &counts));
    c.extend(flag_cases(sweep, "windows", &["0", "2", U64_MAX, "NaN"]));
    c.extend(flag_cases(
        sweep,
        "device-memory",
        &["0", "-1", "1e30", "NaN", "inf", "12parsecs", "0.1", "1000TiB", "1B"],
    ));
    c.extend(flag_cases(sweep, "host-to-device-ratio", &["0", "-1", "NaN", "inf", "1e300"]));
    c.extend(flag_cases(sweep, "device-buffer-size", &["0", "-1", "100", "70000", "NaN"]));
    c.extend(flag_cases(sweep, "swap-in-block-size", &["0", "-1", "1025", "NaN"]));
    c.extend(flag_cases(sweep, "eviction-policy", &["belady", "nope"]));
    c.extend(flag_cases(sweep, "prefetcher", &["nope", ""]));
    c.extend(flag_cases(sweep, "prefetch-budget", &["-1", "99999", OVER, "NaN"]));
    c.extend(flag_cases(sweep, "kv-format", &["fp16"]));
    c.extend(flag_cases(sweep, "backend", &["gpu"]));
    c.extend(flag_cases(sweep, "emulate-model", &["on", "maybe"]));
    c.extend(flag_cases(sweep, "seed", &["-1", OVER]));
    c.extend(flag_cases(sweep, "max-queued", &["0", "-1", OVER, "NaN"]));
    c.extend(flag_cases(
        sweep,
        "config",
        &[
            "missing.json",
            "a-folder",
            "empty.json",
            "garbage.json",
            "array.json",
            "bogus.json",
            "conflict.json",
            "small-buffer.json",
        ],
    ));
    c.extend(flag_cases(sweep, "host-tier-file", &["existing.bin", "a-folder", "no-such-dir/tier.bin"]));
    c.extend(flag_cases(sweep, "out", &["existing.bin", "/proc/no/such"]));
    c.push((split(&format!("{sweep} --preset nope")), 2, "'nope' for '--preset <PRESET>': expected one of".into()));
    // run
    c.extend(flag_cases(run, "concurrency", &["0", "-1", "65537", OVER]));
    c.extend(flag_cases(run, "context", &["0", "-1", U64_MAX, "4294967295", "NaN"]));
    c.extend(flag_cases(run, "output", &["0", "-1", U64_MAX, "NaN", "4,0"]));
    c.extend(flag_cases(run, "arrival-rate", &["0", "-1", "NaN", "inf", "fast"]));
    c.extend(flag_cases(run, "record-trace", &["existing.bin", "a-folder", "/proc/no/such"]));
    c.extend(flag_cases(run, "mode", &["sideways"]));
    // dump-step
    c.extend(flag_cases(dump, "concurrency", &["0", "65537", OVER]));
    c.extend(flag_cases(dump, "step", &["0", "-1", U64_MAX]));
    c.extend(flag_cases(dump, "context", &["0", U64_MAX]));
    c.extend(flag_cases(dump, "mode", &["both"]));
    c.extend(flag_cases(dump, "out", &["existing.bin", "a-folder", "/proc/no/such.safetensors"]));
    // calibrate
    c.extend(flag_cases(calib, "steps", &["0", "3", "-1", U64_MAX]));
    c.extend(flag_cases(calib, "context", &["0", "100", U64_MAX, "1000000000", "NaN"]));
    c.extend(flag_cases(calib, "requests", &["0", "-1"]));
    c.extend(flag_cases(calib, "layers", &["99", "-1"]));
    // selfcheck
    c.extend(flag_cases(selfc, "batch", &["0", "-1", "100000000", U64_MAX]));
    c.extend(flag_cases(selfc, "context", &["0", "10", "100000000000", U64_MAX]));
    c.extend(flag_cases(selfc, "runs", &["0", "1001", U64_MAX, "-1"]));
    c.extend(flag_cases(selfc, "json", &["existing.bin", "a-folder"]));
    c.push((
        split("selfcheck --batch 1 --context 300 --runs 1 --preset nope"),
        2,
        "'nope' for '--preset <PRESET>'".into(),
    ));
    // simulate: hostile traces by file, then flags
    for (file, needle) in [
        ("missing.hstrace", "missing.hstrace"),
        ("a-folder", "a-folder"),
        ("empty.hstrace", "truncated at byte 0"),
        ("truncated.hstrace", "truncated at byte"),
        ("garbage.hstrace", "at byte"),
        ("huge-seq.hstrace", "--trace"),
        ("huge-topk.hstrace", "top_k = 4294967295"),
        ("zero-layers.hstrace", "layers = 0"),
        ("no-records.hstrace", "holds no records"),
        ("dup-step.hstrace", "repeats a step"),
        ("unsorted.hstrace", "at byte"),
        ("duplicate-pos.hstrace", "at byte"),
        ("duplicate-pos.jsonl", "not strictly ascending"),
        ("bad-header.jsonl", "layers = 0"),
        ("beyond-seq.hstrace", "of a sequence of 50 tokens"),
        ("bad-layer.hstrace", "layer 7 of a 1-layer trace"),
        ("too-many.hstrace", "top_k is 2"),
    ] {
        c.push((split(&format!("simulate --out out-sim --trace {file}")), 2, needle.into()));
        c.push((
            split(&format!("trace info {file}")),
            if file == "huge-seq.hstrace" || file == "no-records.hstrace" || file == "dup-step.hstrace" {
                0
            } else {
                2
            },
            String::new(),
        ));
    }
    c.extend(flag_cases(sim, "buffers", &["0", "1", "70000", "-1", "NaN"]));
    c.extend(flag_cases(sim, "policies", &["nope"]));
    c.extend(flag_cases(sim, "row-bytes", &["-1", OVER, U64_MAX, "2000000"]));
    c.extend(flag_cases(sim, "out", &["existing.bin", "/proc/no/such"]));
    c.extend(flag_cases(sim, "prefetchers", &["nope", "next-step"]));
    c.extend(flag_cases(sim, "policies", &["score", "belady,score-lru"]));
    c.extend(flag_cases(sim, "prefetch-budget", &["-1", "99999999999", OVER]));
    c.extend(flag_cases(sim, "warmup-steps", &["4", "-1", U64_MAX, OVER]));
    c.extend(flag_cases(
        sim,
        "policy-config",
        &["missing.json", "a-folder", "garbage.json", "mq99.json", "clock0.json"],
    ));
    // trace import: hostile tensors, then flags
    let import = "trace import --out out.hstrace";
    for (file, needle) in [
        ("missing.npy", "missing.npy"),
        ("a-folder", "a-folder"),
        ("garbage.npy", "magic"),
        ("float.npy", "<f8"),
        ("rank1.npy", "shape"),
        ("short.npy", "bytes of data"),
        ("huge-shape.npy", "shape"),
        ("negative.npy", "negative"),
        ("huge-header.safetensors", "huge-header.safetensors"),
        ("empty.json", "empty.json"),
    ] {
        c.push((split(&format!("{import} {file}")), 2, needle.into()));
    }
    c.extend(flag_cases("trace import ok.npy", "out", &["existing.bin", "a-folder", "/proc/no/such"]));
    c.extend(flag_cases(&format!("{import} ok.npy"), "row-bytes", &["0", "-1", "99999999999"]));
    c.extend(flag_cases(&format!("{import} ok.npy"), "prompt-len", &["-1", U64_MAX, OVER]));
    c.extend(flag_cases(&format!("{import} ok.npy"), "index-preset", &["nope"]));
    c.extend(flag_cases(&format!("{import} ok.npy"), "index-source", &["0,5", "1", "x"]));
    // calibrate's trace
    c.extend(flag_cases(calib, "trace-out", &["existing.bin", "a-folder", "/proc/no/such"]));
    c.extend(flag_cases(calib, "score-margin", &["-1", "99999999999"]));
    c.extend(flag_cases(synth, "score-margin", &["-1", "99999999999"]));
    // trace synth
    c.extend(flag_cases(synth, "requests", &["0", "-1", U64_MAX]));
    c.extend(flag_cases(synth, "layers", &["0", U64_MAX]));
    c.extend(flag_cases(synth, "steps", &["0", U64_MAX]));
    c.extend(flag_cases(synth, "prompt", &[U64_MAX, "100000000000", "-1"]));
    c.extend(flag_cases(synth, "top-k", &["0", "1000000"]));
    c.extend(flag_cases(synth, "rho", &["NaN", "2", "-1"]));
    c.extend(flag_cases(synth, "drift", &["-1", "NaN", "inf"]));
    c.extend(flag_cases(synth, "layer-share", &["2", "-0.5"]));
    c.extend(flag_cases(synth, "row-bytes", &["99999999999", "-1"]));
    c.extend(flag_cases(synth, "out", &["existing.bin", "a-folder", "/proc/no/such"]));
    // issue 37's classes: every case names what the user wrote
    c.push((vec![], 2, "needs a command: sweep".into()));
    c.push((split("trace"), 2, "hisparse trace needs a command".into()));
    c.push((split("sweep --overwrite-host-tier-file"), 2, "--host-tier-file".into()));
    c.extend(flag_cases(synth, "out", &["newdir/"]));
    c.extend(flag_cases(synth, "layers", &["5000"]));
    c.extend(flag_cases(run, "arrival-rate", &["1e-300", "0.0000001"]));
    c.extend(flag_cases(run, "gpus", &["1000"]));
    c.extend(flag_cases(run, "record-trace", &["r.jsonl"]));
    c.extend(flag_cases(dump, "step", &["100000000"]));
    c.extend(flag_cases(calib, "layers", &["0,0"]));
    c.push((split(&format!("{sweep} --config c-device.json --host-tier-file t.bin")), 2, "device_kv_bytes".into()));
    c.push((split(&format!("{sweep} --config c-device.json")), 2, "device_kv_bytes".into()));
    c.push((split(&format!("{sweep} --config c-host.json")), 2, "host_tier_bytes".into()));
    c.push((split(&format!("{sweep} --config c-page.json")), 2, "page_tokens".into()));
    c.push((split("simulate --out out-sim --trace huge-topk.jsonl"), 2, "--trace".into()));
    c.push((split("trace info sparse-4g.hstrace"), 2, "version 0".into()));
    c.push((split("simulate --out out-sim --trace sparse-32g.hstrace"), 2, "memory for".into()));
    c.push((split(&format!("{import} dup-names.safetensors")), 2, "both name request 1".into()));
    c.push((split(&format!("{import} shrinking.safetensors")), 2, "only grows".into()));
    c.push((
        split(&format!("{sweep} --host-tier-file link.bin --overwrite-host-tier-file")),
        2,
        "symbolic link".into(),
    ));
    c.push((
        split(&format!("{sweep} --host-tier-file fifo --overwrite-host-tier-file")),
        2,
        "not a regular file".into(),
    ));
    c.extend(flag_cases(sim, "out", &["users", "."]));
    c.extend(flag_cases(sweep, "out", &["users"]));
    c.extend(flag_cases(sweep, "index-format", &["int4:3", "int8", "int4"]));
    // the GPU commands check their flags before looking for a GPU
    #[cfg(feature = "cuda")]
    {
        let gb = "gpu-bench --out out-gpu --setup-gib 0 --tier-gib 1 --batches 1";
        c.extend(flag_cases(gb, "reps", &["0", U64_MAX, "-1"]));
        c.extend(flag_cases(gb, "batches", &["0", "5000"]));
        c.extend(flag_cases(gb, "tier-gib", &["0", U64_MAX]));
        c.extend(flag_cases(gb, "setup-gib", &[U64_MAX]));
        let kb = "kernel-bench --out out-kernel --batches 1 --contexts 32768";
        c.extend(flag_cases(kb, "reps", &["0", U64_MAX]));
        c.extend(flag_cases(kb, "batches", &["0"]));
        c.extend(flag_cases(kb, "contexts", &["100", U64_MAX]));
        c.extend(flag_cases(kb, "only", &["nope"]));
        c.extend(flag_cases(kb, "attention-splits", &["0"]));
        c.extend(flag_cases("sweep --preset llama-3.1-8b --backend cuda --out out-cuda", "index-format", &["int4"]));
    }
    c
}

#[test]
fn every_bad_input_exits_2_with_one_line_naming_the_flag() {
    let dir = std::env::temp_dir().join(format!("hisparse-corpus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    inputs(&dir);
    let before: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    let cases = corpus();
    assert!(cases.len() > 200, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut slowest = (0.0, String::new());
    for (args, want, needle) in &cases {
        let e = run_in(&dir, args, Duration::from_secs(60));
        let line = args.join(" ");
        if e.secs > slowest.0 {
            slowest = (e.secs, line.clone());
        }
        let one_line = e.stderr.trim().lines().count() <= 1;
        let named = needle.is_empty() || e.stderr.contains(needle.as_str());
        let panicked = e.stderr.contains("panicked");
        if e.code != Some(*want) || (*want == 2 && (!one_line || !named)) || panicked {
            failures.push(format!("{line}\n    -> exit {:?}, stderr: {}", e.code, e.stderr.trim()));
        }
        // No case leaves an output, a folder or a temporary file behind.
        let now: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        let extra: Vec<_> = now.iter().filter(|n| !before.contains(n)).collect();
        if *want == 2 && !extra.is_empty() {
            failures.push(format!("{line}\n    -> left {extra:?} behind"));
        }
        for n in extra {
            let p = dir.join(n);
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
    }
    for user in ["existing.bin", "users/notes.txt"] {
        let now = std::fs::read(dir.join(user)).unwrap();
        assert!(now == b"precious", "the user's {user} was changed: {} bytes now", now.len());
    }
    eprintln!("{} cases; slowest {:.2} s: {}", cases.len(), slowest.0, slowest.1);
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A full file system: a 256 KiB tmpfs where this machine lets us mount one (root in a
/// container usually can; where it cannot, the test says so loudly and checks nothing else).
#[test]
fn a_full_disk_is_an_error_at_start_or_a_clean_failure_never_a_partial_file() {
    let dir = std::env::temp_dir().join(format!("hisparse-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs", dir.to_str().unwrap()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("!!!!! SKIPPED the full-disk cases: this machine does not let the test mount a tmpfs !!!!!");
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let cases = [
        // The trace outgrows the file system while it is written.
        ("trace synth --out t.hstrace --requests 2 --layers 4 --steps 200 --prompt 4000 --top-k 256", "No space left"),
        // The host tier's space is reserved up front: refused at start, not a SIGBUS later.
        (
            "sweep --backend cpu --concurrency 1 --context 300 --warmup 0 --window 1 --host-tier-file tier.bin --out /tmp",
            "its file system has",
        ),
        // A single-file output larger than the file system.
        ("dump-step --backend cpu --concurrency 1 --context 300 --step 1 --out step.safetensors", "No space left"),
    ];
    for (args, needle) in cases {
        let e = run_in(&dir, &split(args), Duration::from_secs(60));
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        let ok = e.code == Some(2) && e.stderr.contains(needle) && left.is_empty();
        let _ = Command::new("umount").arg(&dir).status();
        assert!(ok, "{args}: exit {:?}, stderr {}, left {left:?}", e.code, e.stderr.trim());
        assert!(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs", dir.to_str().unwrap()])
                .status()
                .unwrap()
                .success()
        );
    }
    let _ = Command::new("umount").arg(&dir).status();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigint_stops_a_sweep_cleanly_with_no_partial_output() {
    let dir = std::env::temp_dir().join(format!("hisparse-sigint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(program())
        .args(split("sweep --backend cpu --concurrency 2 --context 600 --warmup 0 --window 2000 --out out"))
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let it get into its steps, then interrupt it as Ctrl-C would.
    std::thread::sleep(Duration::from_millis(2500));
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted while measuring context 600") && err.contains("no partial output"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "stopped between steps, not at the end");
    assert!(!dir.join("out").exists(), "the interrupted sweep's output folder is gone (it held nothing)");
    std::fs::remove_dir_all(&dir).unwrap();
}
