//! Putting a finished temporary file or folder at its destination in one step of the file
//! system, so that nothing another process puts at the destination meanwhile is ever replaced:
//! [`place_new`] refuses an existing destination at the moment of placement (Linux's
//! `renameat2(RENAME_NOREPLACE)`, or `link` then `unlink` where a file system lacks it), and
//! [`exchange`] swaps two folders whole (`RENAME_EXCHANGE`), which is how a folder output
//! replaces an earlier one without a moment in which the two are mixed.

use std::io;
use std::path::Path;

/// What a placement found at the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// The temporary is now at the destination.
    Done,
    /// Something exists at the destination; nothing moved.
    Exists,
}

#[cfg(target_os = "linux")]
fn c_path(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("a path holding a NUL byte"))
}

#[cfg(target_os = "linux")]
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (f, t) = (c_path(from)?, c_path(to)?);
    // SAFETY: two NUL-terminated paths that live across the call; renameat2 reads only them.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) };
    if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Whether an error says the file system (or kernel) cannot do the asked rename.
fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP))
}

/// Moves `temp` (a file or a folder) to `dest` unless something exists there, atomically.
pub(crate) fn place_new(temp: &Path, dest: &Path) -> io::Result<Placed> {
    #[cfg(target_os = "linux")]
    match renameat2(temp, dest, libc::RENAME_NOREPLACE) {
        Ok(()) => return Ok(Placed::Done),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Placed::Exists),
        Err(e) if !unsupported(&e) => return Err(e),
        Err(_) => {}
    }
    if temp.is_dir() {
        // A folder cannot be linked; rename() refuses a non-empty destination folder and a
        // file, and replaces only an empty folder (which holds nothing to lose).
        return match std::fs::rename(temp, dest) {
            Ok(()) => Ok(Placed::Done),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST | libc::ENOTDIR)) => {
                Ok(Placed::Exists)
            }
            Err(e) => Err(e),
        };
    }
    // link() fails when the destination exists, atomically; then the temporary name goes.
    match std::fs::hard_link(temp, dest) {
        Ok(()) => {
            std::fs::remove_file(temp)?;
            Ok(Placed::Done)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Placed::Exists),
        Err(e) => Err(e),
    }
}

/// Swaps `a` and `b` (both exist) in one step. `Unsupported` where the file system cannot.
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        match renameat2(a, b, libc::RENAME_EXCHANGE) {
            Err(e) if unsupported(&e) => Err(io::Error::new(io::ErrorKind::Unsupported, e)),
            r => r,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        Err(io::Error::new(io::ErrorKind::Unsupported, "no atomic exchange on this system"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_never_replaces_and_exchange_swaps_whole_folders() {
        let d = std::env::temp_dir().join(format!("hisparse-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (t, dest) = (d.join("t"), d.join("dest"));
        std::fs::write(&t, b"new").unwrap();
        std::fs::write(&dest, b"precious").unwrap();
        assert_eq!(place_new(&t, &dest).unwrap(), Placed::Exists);
        assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
        std::fs::remove_file(&dest).unwrap();
        assert_eq!(place_new(&t, &dest).unwrap(), Placed::Done);
        assert!(!t.exists());
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        // Folders: a non-empty destination stays; exchange swaps the two whole.
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("x"), b"1").unwrap();
        std::fs::write(b.join("y"), b"2").unwrap();
        assert_eq!(place_new(&a, &b).unwrap(), Placed::Exists);
        exchange(&a, &b).unwrap();
        assert!(b.join("x").exists() && a.join("y").exists() && !b.join("y").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
