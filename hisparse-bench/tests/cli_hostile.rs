//! The `hisparse` program against a hostile but careful user, where timing matters: a file
//! created at the output path while the command runs, two writers into one file or folder, a
//! second Ctrl-C, an input shrunk while it is read, a standard output that goes away or fills,
//! and a FIFO nobody writes. Each case must end with its documented status, leave the user's
//! files as they were and leave nothing of its own behind.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{program, split};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spawn(dir: &Path, args: &str) -> Child {
    Command::new(program())
        .args(split(args))
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `c` at most `limit`; kills it past that. Returns the exit code and stderr.
/// Runs the program in `dir` to its end; it must succeed.
fn run_ok(dir: &Path, args: &str) {
    let o = Command::new(program()).args(split(args)).current_dir(dir).output().unwrap();
    assert!(o.status.success(), "{args}: {}", String::from_utf8_lossy(&o.stderr));
}

fn finish(mut c: Child, limit: Duration) -> (Option<i32>, String) {
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return (None, "HUNG".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = c.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn sigint(c: &Child) {
    assert!(Command::new("kill").args(["-INT", &c.id().to_string()]).status().unwrap().success());
}

/// Names in `d`, sorted (hidden ones too: temporary files are hidden).
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

const SYNTH: &str = "trace synth --out t.hstrace --requests 4 --layers 4 --steps 400 --prompt 16384";

#[test]
fn a_file_made_at_the_output_path_while_the_command_runs_is_never_replaced() {
    let d = tmp("appears");
    let c = spawn(&d, SYNTH);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(d.join("t.hstrace"), b"precious").unwrap();
    let (code, err) = finish(c, Duration::from_secs(120));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--out") && err.contains("appeared while this command ran"), "{err}");
    assert_eq!(std::fs::read(d.join("t.hstrace")).unwrap(), b"precious");
    assert_eq!(names(&d), ["t.hstrace"], "no temporary file left");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn two_writers_of_one_file_one_wins_whole_and_the_other_is_refused() {
    let d = tmp("two-files");
    let (a, b) = (spawn(&d, SYNTH), spawn(&d, &format!("{SYNTH} --seed 2")));
    let (ra, rb) = (finish(a, Duration::from_secs(120)), finish(b, Duration::from_secs(120)));
    let mut codes = [ra.0, rb.0];
    codes.sort();
    assert_eq!(codes, [Some(0), Some(2)], "{} / {}", ra.1, rb.1);
    let info = Command::new(program()).args(["trace", "info", "t.hstrace"]).current_dir(&d).output().unwrap();
    assert!(info.status.success(), "the placed trace is whole: {}", String::from_utf8_lossy(&info.stderr));
    assert_eq!(names(&d), ["t.hstrace"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn two_writers_of_one_folder_never_mix() {
    let d = tmp("two-dirs");
    run_ok(&d, "trace synth --out t.hstrace --requests 2 --layers 2 --steps 300 --prompt 8192 --top-k 512");
    for _ in 0..6 {
        let a = spawn(&d, "simulate --trace t.hstrace --buffers 512 --out o");
        let b = spawn(&d, "simulate --trace t.hstrace --buffers 1024,2048 --out o");
        let (ra, rb) = (finish(a, Duration::from_secs(120)), finish(b, Duration::from_secs(120)));
        assert!(ra.0 == Some(0) && rb.0 == Some(0), "{} / {}", ra.1, rb.1);
        // The JSON and the CSV in the folder are of one run: the same buffer sizes.
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join("o/simulate.json")).unwrap()).unwrap();
        let mut from_json: Vec<u64> =
            json["results"].as_array().unwrap().iter().map(|r| r["device_buffer_size"].as_u64().unwrap()).collect();
        from_json.sort_unstable();
        from_json.dedup();
        let csv = std::fs::read_to_string(d.join("o/simulate.csv")).unwrap();
        let col = csv.lines().next().unwrap().split(',').position(|h| h == "device_buffer_size").unwrap();
        let mut from_csv: Vec<u64> =
            csv.lines().skip(1).map(|l| l.split(',').nth(col).unwrap().parse().unwrap()).collect();
        from_csv.sort_unstable();
        from_csv.dedup();
        assert_eq!(from_json, from_csv, "the folder mixes two runs");
        // And it is one placed output: its manifest lists exactly what it holds.
        let manifest = std::fs::read_to_string(d.join("o/.hisparse-output")).unwrap();
        let mut listed: Vec<&str> = manifest.lines().skip(1).collect();
        listed.push(".hisparse-output");
        listed.sort_unstable();
        assert_eq!(listed, names(&d.join("o")), "the folder holds exactly one run's files");
        assert_eq!(names(&d), ["o", "t.hstrace"], "no temporary folder left");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ctrl_c_once_or_twice_during_a_long_prefill_leaves_nothing_behind() {
    let d = tmp("sigint");
    let args = "run --backend cpu --mode hisparse --concurrency 4 --context 150000 --output 200 \
                --device-memory 512MiB --host-to-device-ratio 1 --host-tier-file tier.bin --out o";
    for twice in [false, true] {
        let c = spawn(&d, args);
        // Into the prefill of the first request (the tier file is made by then).
        let t = Instant::now();
        while !d.join("tier.bin").exists() && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        sigint(&c);
        if twice {
            std::thread::sleep(Duration::from_millis(30));
            let _ = Command::new("kill").args(["-INT", &c.id().to_string()]).stderr(Stdio::null()).status();
        }
        let (code, err) = finish(c, Duration::from_secs(60));
        assert_eq!(code, Some(130), "{err}");
        assert!(asked.elapsed() < Duration::from_secs(3), "stopped within a step, not after the prefill");
        assert!(names(&d).is_empty(), "left {:?}: {err}", names(&d));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_second_ctrl_c_stops_at_once_and_removes_the_unfinished_files() {
    let d = tmp("second");
    // Deaf to the first signal (a test hook), so only the second one's path can end it.
    let c = Command::new(program())
        .args(split(
            "run --backend cpu --mode hisparse --concurrency 4 --context 150000 --output 200 \
             --device-memory 512MiB --host-to-device-ratio 1 --host-tier-file tier.bin \
             --record-trace r.hstrace --out o",
        ))
        .env("HISPARSE_TEST_DEAF_TO_FIRST_SIGNAL", "1")
        .current_dir(&d)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !d.join("tier.bin").exists() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let during = names(&d);
    assert!(during.iter().any(|n| n.ends_with(".tmp")) && during.iter().any(|n| n.ends_with(".out")), "{during:?}");
    sigint(&c);
    std::thread::sleep(Duration::from_millis(500));
    sigint(&c);
    let (code, err) = finish(c, Duration::from_secs(10));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("stopped at once"), "{err}");
    assert!(names(&d).is_empty(), "left {:?}", names(&d));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ctrl_c_stops_the_commands_that_ran_to_the_end() {
    let d = tmp("selfcheck");
    for (args, ms) in [
        ("selfcheck --preset cpu-small --batch 16 --context 60000 --runs 50 --json s.json", 1500),
        ("calibrate --preset cpu-small --context 60000 --steps 400 --requests 4 --trace-out c.hstrace", 1500),
        ("run --backend cpu --concurrency 3 --arrival-rate 0.001 --context 300 --output 2 --out o", 800),
    ] {
        let c = spawn(&d, args);
        std::thread::sleep(Duration::from_millis(ms));
        let asked = Instant::now();
        sigint(&c);
        let (code, err) = finish(c, Duration::from_secs(60));
        assert_eq!(code, Some(130), "{args}: {err}");
        assert!(asked.elapsed() < Duration::from_secs(5), "{args}: took {:?}", asked.elapsed());
        assert!(names(&d).is_empty(), "{args}: left {:?}", names(&d));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_input_shrunk_while_it_is_imported_is_an_error_never_a_signal() {
    let d = tmp("shrink");
    // 48 MiB of selections: [steps 3072, layers 2, top_k 2048] int32.
    let (s, l, k) = (3072usize, 2usize, 2048usize);
    let data: Vec<u8> =
        (0..s * l).flat_map(|i| (0..k as i32).map(move |p| p + (i % 7) as i32)).flat_map(i32::to_le_bytes).collect();
    let file = common::npy("<i4", &format!("({s}, {l}, {k})"), &data);
    for delay in [0u64, 5, 20, 60] {
        std::fs::write(d.join("big.npy"), &file).unwrap();
        let c = spawn(&d, "trace import big.npy --out i.hstrace --overwrite");
        std::thread::sleep(Duration::from_millis(delay));
        std::fs::OpenOptions::new().write(true).open(d.join("big.npy")).unwrap().set_len(4096).unwrap();
        let (code, err) = finish(c, Duration::from_secs(120));
        assert!(matches!(code, Some(0 | 2)), "delay {delay} ms: exit {code:?} (a signal?): {err}");
        assert!(!err.contains("panicked"), "{err}");
        let _ = std::fs::remove_file(d.join("i.hstrace"));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_closed_or_full_stdout_ends_quietly_after_the_files_are_written() {
    let d = tmp("stdout");
    run_ok(&d, "trace synth --out t.hstrace --requests 1 --layers 1 --steps 4 --prompt 100 --top-k 8");
    for args in ["trace info t.hstrace", "simulate --trace t.hstrace --out s", "--help"] {
        // A reader that went away before anything was written: the pipe's read end is closed
        // before the program starts (closing it after the spawn raced a fast `--help`).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(program())
            .args(split(args))
            .current_dir(&d)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args}: {err}");
        assert!(err.trim().is_empty(), "{args}: quietly, got {err}");
        // A full one.
        let full = std::fs::File::options().write(true).open("/dev/full").unwrap();
        let out = Command::new(program()).args(split(args)).current_dir(&d).stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args}: {err}");
        assert!(
            err.contains("standard output") && err.trim().lines().count() == 1 && !err.contains("panicked"),
            "{err}"
        );
    }
    assert!(d.join("s/simulate.json").exists(), "the outputs were placed before stdout was written");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_fifo_nobody_writes_waits_for_ctrl_c_and_a_pipe_is_read() {
    let d = tmp("fifo");
    let fifo = std::ffi::CString::new(d.join("f").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    for args in [
        "trace info f",
        "simulate --trace f --out s",
        "trace import f --out i.hstrace",
        "replot f --out r",
        "sweep --backend cpu --config f --out o",
        "simulate --trace t --policy-config f --out s",
    ] {
        if args.contains("--trace t ") {
            run_ok(&d, "trace synth --out t --requests 1 --layers 1 --steps 4 --prompt 100 --top-k 8");
        }
        let c = spawn(&d, args);
        std::thread::sleep(Duration::from_millis(400));
        sigint(&c);
        let (code, err) = finish(c, Duration::from_secs(5));
        assert_eq!(code, Some(130), "{args}: {err}");
        let _ = std::fs::remove_file(d.join("t"));
        assert_eq!(names(&d), ["f"], "{args}");
    }
    // A binary trace through a pipe, and a config through one, are read.
    run_ok(&d, "trace synth --out t.hstrace --requests 1 --layers 1 --steps 4 --prompt 100 --top-k 8");
    let trace = std::fs::read(d.join("t.hstrace")).unwrap();
    let mut c = Command::new(program())
        .args(["trace", "info", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), &trace).unwrap();
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("4 records"));
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} run --backend cpu --concurrency 1 --context 300 --output 2 --mode both --config <(echo '{{}}') --out o",
            program().display()
        ))
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a config through a pipe, read once for both modes: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A full disk under `--out` is named by the flag, and leaves nothing there. It needs a small
/// file system of its own (a 64 KiB tmpfs, mounted where this user may; skipped, saying so,
/// where mounting is not permitted).
#[test]
fn a_full_disk_under_out_names_the_flag() {
    let d = tmp("full");
    let small = d.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&small)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("a_full_disk_under_out_names_the_flag: SKIPPED (no tmpfs can be mounted here)");
        std::fs::remove_dir_all(&d).unwrap();
        return;
    }
    let o = Command::new(program())
        .args(split("run --backend cpu --concurrency 2 --context 300 --output 200 --out"))
        .arg(small.join("o"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let left = names(&small);
    let _ = Command::new("umount").arg(&small).status();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--out") && err.contains("No space left"), "{err}");
    assert!(left.is_empty(), "left {left:?}");
    std::fs::remove_dir_all(&d).unwrap();
}
