//! What this process has put on disk that must not outlive it: temporary files and folders of
//! outputs not yet placed, output folders it made that are still empty, a host-tier file it
//! created. Each is registered while it exists (a [`Registered`] guard forgets it again); the
//! normal path removes them through the owners' `Drop`, and a second Ctrl-C, which ends the
//! program at once without running those, removes what is registered ([`remove_all`]).

use std::path::PathBuf;
use std::sync::Mutex;

/// A thing to remove if the program is stopped at once.
#[derive(Clone, Debug)]
pub(crate) enum Leftover {
    /// A temporary file of this process.
    File(PathBuf),
    /// A temporary folder of this process (private to it: removed with everything inside).
    Dir(PathBuf),
    /// A folder this process made for an output; removed only while empty.
    EmptyDir(PathBuf),
    /// A host-tier file this process is about to create or has created: removed if it is a
    /// regular file (not a link) that someone holds locked — the tier locks its file for its
    /// whole life, and a file another process held locked would have refused this one.
    LockedFile(PathBuf),
}

static REGISTRY: Mutex<Vec<(u64, Leftover)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn registry() -> std::sync::MutexGuard<'static, Vec<(u64, Leftover)>> {
    // A panic while the list was held leaves a consistent Vec: keep using it.
    REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps a [`Leftover`] registered while it lives.
#[derive(Debug)]
pub(crate) struct Registered(u64);

/// Registers `l` until the returned guard is dropped.
pub(crate) fn register(l: Leftover) -> Registered {
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    registry().push((id, l));
    Registered(id)
}

impl Drop for Registered {
    fn drop(&mut self) {
        registry().retain(|(id, _)| *id != self.0);
    }
}

/// Whether `p` is a regular file (not followed through a link) that someone holds locked.
fn locked_regular_file(p: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(meta) = std::fs::symlink_metadata(p) else { return false };
    if !meta.file_type().is_file() {
        return false;
    }
    let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(p) else {
        return false;
    };
    matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Removes everything registered, newest first (files before the folders that hold them).
pub(crate) fn remove_all() {
    remove_matching(|_| true);
}

/// Removes what is registered at a path `pick` accepts, newest first.
fn remove_matching(pick: impl Fn(&std::path::Path) -> bool) {
    let path = |l: &Leftover| match l {
        Leftover::File(p) | Leftover::Dir(p) | Leftover::EmptyDir(p) | Leftover::LockedFile(p) => p.clone(),
    };
    let items: Vec<Leftover> = registry().iter().rev().map(|(_, l)| l.clone()).filter(|l| pick(&path(l))).collect();
    for l in items {
        let _ = match &l {
            Leftover::File(p) => std::fs::remove_file(p),
            Leftover::Dir(p) => std::fs::remove_dir_all(p),
            Leftover::EmptyDir(p) => std::fs::remove_dir(p),
            Leftover::LockedFile(p) if locked_regular_file(p) => std::fs::remove_file(p),
            Leftover::LockedFile(_) => Ok(()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_things_go_and_forgotten_ones_stay() {
        let d = std::env::temp_dir().join(format!("hisparse-cleanup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        std::fs::write(d.join("tmp/a"), b"x").unwrap();
        std::fs::write(d.join("f"), b"x").unwrap();
        std::fs::write(d.join("kept"), b"x").unwrap();
        std::fs::write(d.join("unlocked"), b"x").unwrap();
        std::fs::write(d.join("locked"), b"x").unwrap();
        let held = std::fs::File::open(d.join("locked")).unwrap();
        held.lock().unwrap();
        let _a = register(Leftover::Dir(d.join("tmp")));
        let _b = register(Leftover::File(d.join("f")));
        let _c = register(Leftover::LockedFile(d.join("unlocked")));
        let _d = register(Leftover::LockedFile(d.join("locked")));
        drop(register(Leftover::File(d.join("kept"))));
        // Only this test's (the registry is the process's: other tests run beside this one).
        remove_matching(|p| p.starts_with(&d));
        assert!(!d.join("tmp").exists() && !d.join("f").exists() && !d.join("locked").exists());
        assert!(d.join("kept").exists(), "a forgotten leftover stays");
        assert!(d.join("unlocked").exists(), "a file nobody holds locked is not ours");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
