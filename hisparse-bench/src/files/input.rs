//! Reading what the user names as input — trace, config, policy config, tensors, a sweep's JSON —
//! one way: opened without blocking (a FIFO with no writer yet does not hang `open`), refused if
//! it is a folder, read into memory while Ctrl-C is observed (a pipe that never sends is left
//! on Ctrl-C), and never larger than the memory this machine has for it (a regular file's size
//! is checked before it is read, a pipe's as it comes). Nothing is memory-mapped: a file that
//! another process shrinks while it is read gives a short read, never a SIGBUS.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::{guard, interrupt};

/// Largest config file read (`--config`, `--policy-config`): a few keys.
pub const CONFIG_BYTES: u64 = 1 << 20;

/// An input file, opened.
#[derive(Debug)]
pub struct Input {
    file: File,
    path: PathBuf,
    flag: &'static str,
    /// A regular file's length; `None` for a pipe, FIFO, socket or device.
    len: Option<u64>,
}

/// The error of a read of `path` (the flag's value) that failed with `e`: an interruption if
/// a stop was asked for, else the system's message.
fn read_error(flag: &'static str, path: &Path, e: &std::io::Error) -> BenchError {
    if interrupt::requested() {
        BenchError::Interrupted(format!("reading {}", path.display()))
    } else {
        BenchError::flag(flag, path.display(), format!("cannot be read ({e})"))
    }
}

impl Input {
    /// Opens `path`, the value of `--flag` (or of an argument named `flag`).
    pub fn open(flag: &'static str, path: &Path) -> Result<Self> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| BenchError::flag(flag, path.display(), format!("cannot be read ({e})")))?;
        let meta = file.metadata().map_err(|e| read_error(flag, path, &e))?;
        if meta.is_dir() {
            return Err(BenchError::flag(flag, path.display(), "is a folder; give a file"));
        }
        let len = meta.is_file().then_some(meta.len());
        if len.is_some() {
            // A regular file never blocks: plain reads from here on.
            // SAFETY: fcntl on a descriptor this File owns; F_SETFL only changes its status flags.
            let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) };
            if r != 0 {
                return Err(read_error(flag, path, &std::io::Error::last_os_error()));
            }
        }
        Ok(Self { file, path: path.to_owned(), flag, len })
    }

    /// A regular file's length (`None`: a stream of unknown length).
    pub fn len(&self) -> Option<u64> {
        self.len
    }

    /// The error to report for a failed read (an interruption where one was asked for).
    pub fn error(&self, e: &std::io::Error) -> BenchError {
        read_error(self.flag, &self.path, e)
    }

    /// The whole input, refused (naming the flag) beyond `limit` bytes; `what` says what it
    /// is for the message.
    pub fn read_all(mut self, what: &str, limit: u64) -> Result<Vec<u8>> {
        let (flag, path) = (self.flag, self.path.clone());
        let too_big = |n: Option<u64>| {
            BenchError::flag(
                flag,
                path.display(),
                format!(
                    "{} is {}; at most {} is read here",
                    what,
                    n.map_or_else(|| "longer than that".into(), guard::human_bytes),
                    guard::human_bytes(limit)
                ),
            )
        };
        if let Some(n) = self.len.filter(|&n| n > limit) {
            return Err(too_big(Some(n)));
        }
        let mut buf = Vec::with_capacity(self.len.map_or(0, |n| n as usize));
        let got = (&mut self).take(limit.saturating_add(1)).read_to_end(&mut buf);
        got.map_err(|e| self.error(&e))?;
        if buf.len() as u64 > limit {
            return Err(too_big(None));
        }
        Ok(buf)
    }

    /// The whole input as text.
    pub fn read_text(self, what: &str, limit: u64) -> Result<String> {
        let (flag, path) = (self.flag, self.path.clone());
        let bytes = self.read_all(what, limit)?;
        String::from_utf8(bytes)
            .map_err(|_| BenchError::flag(flag, path.display(), format!("{what} is not UTF-8 text")))
    }
}

/// Most bytes of input this machine can hold `expansion` times over (the input and what is
/// decoded from it), within the share of available memory one command may plan to use.
pub fn memory_limit(expansion: u64) -> u64 {
    guard::available_memory().map_or(u64::MAX, |a| (a as f64 * guard::MEMORY_SHARE) as u64 / expansion.max(1))
}

/// Reads config text: `path` of `--flag`, at most [`CONFIG_BYTES`].
pub fn read_config(flag: &'static str, path: &Path) -> Result<String> {
    Input::open(flag, path)?.read_text("the file", CONFIG_BYTES)
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.len.is_some() {
            return self.file.read(buf);
        }
        // A stream: wait for data (or its end) in short polls that observe Ctrl-C.
        loop {
            if interrupt::requested() {
                return Err(std::io::Error::other("stopped by a signal"));
            }
            let mut p = libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let timeout = Duration::from_millis(100).as_millis() as libc::c_int;
            // SAFETY: one valid pollfd for the duration of the call; poll writes only its revents.
            let r = unsafe { libc::poll(&mut p, 1, timeout) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                // Nothing yet (a FIFO whose writer has not come, a pipe that has not sent).
                continue;
            }
            match self.file.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

/// A regular file seeks (a skipped part of a trace is never read); a stream cannot.
impl std::io::Seek for Input {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        if self.len.is_none() {
            return Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "a stream cannot seek"));
        }
        self.file.seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_pipes_and_fifos_are_read_and_limits_hold() {
        let d = std::env::temp_dir().join(format!("hisparse-input-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), b"hello").unwrap();
        let i = Input::open("config", &d.join("f")).unwrap();
        assert_eq!(i.len(), Some(5));
        assert_eq!(i.read_all("the file", 5).unwrap(), b"hello");
        let e = Input::open("config", &d.join("f")).unwrap().read_all("the file", 4).unwrap_err().to_string();
        assert!(e.starts_with("invalid --config") && e.contains("the file is 5 B"), "{e}");
        assert!(Input::open("config", &d).unwrap_err().to_string().contains("is a folder"));
        // A FIFO: open does not wait for a writer; the read waits for one, then reads to its end.
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let i = Input::open("trace", &fifo).unwrap();
        assert_eq!(i.len(), None);
        let writer = std::thread::spawn({
            let fifo = fifo.clone();
            move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(&fifo, b"from a writer that came late").unwrap();
            }
        });
        assert_eq!(i.read_text("the trace", 1 << 20).unwrap(), "from a writer that came late");
        writer.join().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
