//! The bad-input corpus of the `hisparse` program, run in CI: for every command and its flags,
//! zero, negative, huge, overflowing, NaN and wrong-unit values; missing, folder, empty,
//! truncated, garbage and hostile-but-valid trace and config files; unwritable, existing and
//! missing output places. Every case must end within its time limit with its expected exit status
//! (2: one line on stderr naming the flag), never with a signal (abort, bus error), a panic or a
//! hang; no case may leave an output folder or a temporary file behind.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn program() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_hisparse"));
    if built.exists() {
        return built;
    }
    std::env::current_exe().unwrap().with_file_name("hisparse")
}

/// What a run ended with.
struct Ended {
    code: Option<i32>,
    stderr: String,
    secs: f64,
}

/// Runs the program in `dir` with a time limit; a hang is killed and reported as `code: None`.
fn run_in(dir: &Path, args: &[String], limit: Duration) -> Ended {
    let t = Instant::now();
    let mut child = Command::new(program())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            return Ended { code: status.code(), stderr, secs: t.elapsed().as_secs_f64() };
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ended {
                code: None,
                stderr: "HUNG: killed at the time limit".into(),
                secs: t.elapsed().as_secs_f64(),
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn varint(mut v: u32, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A binary trace with correct checksums over whatever the records say (hostile but well
/// formed): `(step, request, layer, seq_len, positions)` with positions delta-coded as written.
fn raw_trace(top_k: u32, layers: u32, records: &[(u32, u64, u32, u32, Vec<u32>)]) -> Vec<u8> {
    let mut b = b"HSPTRACE".to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    for v in [top_k, layers, 656, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let c = crc32fast::hash(&b);
    b.extend_from_slice(&c.to_le_bytes());
    for (step, req, layer, seq_len, pos) in records {
        let mut p = Vec::new();
        p.extend_from_slice(&step.to_le_bytes());
        p.extend_from_slice(&req.to_le_bytes());
        p.extend_from_slice(&layer.to_le_bytes());
        p.extend_from_slice(&seq_len.to_le_bytes());
        p.extend_from_slice(&(pos.len() as u32).to_le_bytes());
        let mut prev: Option<u32> = None;
        for &x in pos {
            // Deltas wrap for unsorted input: the decoder sees what a hostile writer sent.
            varint(prev.map_or(x, |q| x.wrapping_sub(q).wrapping_sub(1)), &mut p);
            prev = Some(x);
        }
        let c = crc32fast::hash(&p);
        p.extend_from_slice(&c.to_le_bytes());
        b.push(0x01);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(&p);
    }
    let n = (records.len() as u64).to_le_bytes();
    b.push(0xFF);
    b.extend_from_slice(&n);
    b.extend_from_slice(&crc32fast::hash(&n).to_le_bytes());
    b
}

/// A `.npy` file: `descr` and `shape` as numpy writes them, then `data`.
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(data);
    b
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
    w("clock0.json", br#"{"clock_bits": 0}"#);
    std::fs::create_dir_all(dir.join("a-folder")).unwrap();
}

/// `(args, expected exit status, text stderr must contain)`.
type Case = (Vec<String>, i32, String);

fn split(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

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
    c.push((split(&format!("{sweep} --preset nope")), 2, "unknown preset \"nope\"".into()));
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
    c.push((split("selfcheck --batch 1 --context 300 --runs 1 --preset nope"), 2, "unknown preset \"nope\"".into()));
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
    assert_eq!(std::fs::read(dir.join("existing.bin")).unwrap(), b"precious", "a user file was changed");
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
            "host tier file",
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
