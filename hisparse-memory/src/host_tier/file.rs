//! The file behind a file-backed host tier (the NVMe tier): created new (an existing file is
//! refused unless the caller asked to overwrite it), its whole length reserved on the file system
//! up front (so a full disk is an error at start, never a SIGBUS mid-run), locked exclusively for
//! the tier's life (a second process is refused), and removed when the tier goes away unless the
//! caller asked to keep it — only if the path still names this tier's file.
//!
//! Invariant: a tier file is a regular file reached without following a link: a link, a FIFO,
//! a device or a socket at the path is refused by name, never truncated, filled or removed.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{MemoryError, Result};

/// How a file-backed host tier treats its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostTierFile {
    /// The file.
    pub path: PathBuf,
    /// Replace an existing file (otherwise an existing file is refused, never truncated).
    pub overwrite: bool,
    /// Leave the file in place when the tier is dropped (otherwise it is removed).
    pub keep: bool,
}

impl HostTierFile {
    /// A new file at `path`, refused if one exists, removed when the tier goes away.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), overwrite: false, keep: false }
    }
}

/// The open, locked, fully reserved file of a tier; removes it on drop unless kept.
#[derive(Debug)]
pub(super) struct TierFile {
    file: File,
    path: PathBuf,
    keep: bool,
    /// Device and inode of the file (removed on drop only while the path still names it).
    id: (u64, u64),
}

fn io(what: &Path, e: std::io::Error) -> MemoryError {
    MemoryError::Io { what: format!("host tier file {}", what.display()), message: e.to_string() }
}

impl TierFile {
    /// Creates (or, with `overwrite`, replaces) the file, locks it and reserves `len` bytes.
    /// On any failure nothing is left behind that this call created.
    pub(super) fn create(spec: &HostTierFile, len: usize) -> Result<Self> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = &spec.path;
        let mut opts = OpenOptions::new();
        // Never through a link; never waiting on a FIFO (refused below).
        opts.read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
        if spec.overwrite {
            // Truncated only after the lock is held (below): another process's tier is never touched.
            opts.create(true);
        } else {
            opts.create_new(true);
        }
        let file = opts.open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                MemoryError::invalid(
                    "host_tier_file",
                    path.display(),
                    "exists; refusing to overwrite it (ask for overwrite explicitly, or pick a new path)",
                )
            } else if e.raw_os_error() == Some(libc::ELOOP) {
                MemoryError::invalid(
                    "host_tier_file",
                    path.display(),
                    "is a symbolic link; a host tier file is never reached through one",
                )
            } else {
                io(path, e)
            }
        })?;
        let meta = file.metadata().map_err(|e| io(path, e))?;
        if !meta.is_file() {
            return Err(MemoryError::invalid(
                "host_tier_file",
                path.display(),
                "is not a regular file (a FIFO, socket or device): a host tier needs a file of its own",
            ));
        }
        let id = (meta.dev(), meta.ino());
        // From here on a failure removes the file only if this call created it.
        let created = !spec.overwrite;
        let fail = |e: MemoryError| {
            if created {
                let _ = std::fs::remove_file(path);
            }
            e
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(fail(MemoryError::invalid(
                    "host_tier_file",
                    path.display(),
                    "is locked by another process using it as its host tier",
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(fail(io(path, e))),
        }
        if spec.overwrite {
            file.set_len(0).map_err(|e| fail(io(path, e)))?;
        }
        reserve(&file, len).map_err(|e| fail(io(path, e)))?;
        Ok(Self { file, path: path.clone(), keep: spec.keep, id })
    }

    /// The open file (for the mapping).
    pub(super) fn file(&self) -> &File {
        &self.file
    }

    /// The path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TierFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        // Someone may have put another file at the path meanwhile: that one stays.
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if !self.keep && ours {
            let _ = std::fs::remove_file(&self.path);
        }
        // The lock goes with the descriptor.
    }
}

/// Reserves `len` bytes of blocks for `file` (so that writes through a mapping cannot fail for
/// lack of space later), then sets its length.
#[cfg(unix)]
fn reserve(file: &File, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let n = libc::off_t::try_from(len).map_err(|_| std::io::Error::other("length beyond the file offset range"))?;
    // SAFETY: a valid open descriptor; posix_fallocate touches only the file's blocks.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, n) };
    match r {
        0 => file.set_len(len as u64),
        // A file system that cannot reserve: refused now rather than a SIGBUS mid-run.
        libc::EOPNOTSUPP | libc::EINVAL if len > 0 => Err(std::io::Error::other(
            "this file system cannot reserve space up front (posix_fallocate unsupported); \
             a host tier file needs one that can",
        )),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(not(unix))]
fn reserve(file: &File, len: usize) -> std::io::Result<()> {
    file.set_len(len as u64)
}
