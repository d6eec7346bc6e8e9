//! Where results go, written so that nothing is ever half there: every file is written to a
//! temporary name beside its destination and renamed into place ([`AtomicFile`]); an output
//! folder is checked for writability before any work starts and removed again if the command
//! fails before writing into it ([`OutputDir`]); a file the user named is never replaced unless
//! they asked for it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{BenchError, Result};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io { path: path.display().to_string(), source }
}

/// The temporary name of `dest`: a hidden file beside it, unique to this process.
fn temp_name(dest: &Path) -> PathBuf {
    let name = dest.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// A file being written under a temporary name; [`AtomicFile::commit`] renames it into place,
/// dropping it uncommitted removes it. Either the whole new file is at the destination, or
/// whatever was there before.
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    temp: PathBuf,
    out: BufWriter<File>,
}

impl AtomicFile {
    /// Starts writing `dest` (given by the user as `--flag`). An existing `dest` is refused
    /// unless `overwrite`; the temporary file is created at once, so an unwritable place fails
    /// here, before any work. The parent folder must exist.
    pub fn create(flag: &'static str, dest: &Path, overwrite: bool) -> Result<Self> {
        if dest.is_dir() {
            return Err(BenchError::flag(flag, dest.display(), "is a folder; give a file name"));
        }
        if dest.exists() && !dest.is_file() {
            return Err(BenchError::flag(
                flag,
                dest.display(),
                "exists and is not a regular file; it is never replaced",
            ));
        }
        if dest.exists() && !overwrite {
            return Err(BenchError::flag(
                flag,
                dest.display(),
                "exists; refusing to overwrite it (pass --overwrite to replace it)",
            ));
        }
        Self::create_replacing(flag, dest)
    }

    /// Starts writing `dest`, replacing it on commit if it exists (for files of a command's own
    /// output folder).
    fn create_replacing(flag: &'static str, dest: &Path) -> Result<Self> {
        let temp = temp_name(dest);
        let file = File::create(&temp)
            .map_err(|e| BenchError::flag(flag, dest.display(), format!("cannot be written ({e})")))?;
        Ok(Self { dest: dest.to_owned(), temp, out: BufWriter::new(file) })
    }

    /// The writer of the temporary file.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        &mut self.out
    }

    /// Flushes, syncs and renames the file into place; returns the destination.
    pub fn commit(mut self) -> Result<PathBuf> {
        self.out.flush().map_err(io(&self.temp))?;
        self.out.get_ref().sync_all().map_err(io(&self.temp))?;
        std::fs::rename(&self.temp, &self.dest).map_err(io(&self.dest))?;
        Ok(self.dest.clone())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // After a commit the temporary name no longer exists; otherwise the half-written file goes.
        let _ = std::fs::remove_file(&self.temp);
    }
}

/// Writes `bytes` to `dest` atomically, replacing what was there (a command's own output).
pub fn write_replacing(flag: &'static str, dest: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let mut f = AtomicFile::create_replacing(flag, dest)?;
    f.writer().write_all(bytes).map_err(io(dest))?;
    f.commit()
}

/// A command's output folder: made (with its parents) and probed for writability before any
/// work; if the command ends without [`OutputDir::keep`], folders it created are removed again
/// (only while empty: nothing anyone wrote is ever deleted).
#[derive(Debug)]
pub struct OutputDir {
    dir: PathBuf,
    flag: &'static str,
    /// Folders this call created, innermost first.
    created: Vec<PathBuf>,
    kept: bool,
}

impl OutputDir {
    /// Prepares `dir` (the value of `--flag`).
    pub fn prepare(flag: &'static str, dir: &Path) -> Result<Self> {
        if dir.exists() && !dir.is_dir() {
            return Err(BenchError::flag(flag, dir.display(), "exists and is not a folder"));
        }
        let mut created = Vec::new();
        let mut p = Some(dir);
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
            created.push(d.to_owned());
            p = d.parent();
        }
        let me = Self { dir: dir.to_owned(), flag, created, kept: false };
        std::fs::create_dir_all(dir)
            .map_err(|e| BenchError::flag(flag, dir.display(), format!("cannot be created ({e})")))?;
        // Probe: a temporary file in the folder, removed at once.
        let probe = dir.join(format!(".hisparse-probe-{}", std::process::id()));
        File::create(&probe).map_err(|e| BenchError::flag(flag, dir.display(), format!("is not writable ({e})")))?;
        let _ = std::fs::remove_file(&probe);
        Ok(me)
    }

    /// Writes `name` in the folder atomically (replacing this command's previous output).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        write_replacing(self.flag, &self.dir.join(name), bytes)
    }

    /// Writes `value` as pretty JSON to `name`.
    pub fn write_json(&self, name: &str, value: &impl serde::Serialize) -> Result<PathBuf> {
        let text = serde_json::to_string_pretty(value).map_err(|e| BenchError::Check(format!("JSON: {e}")))?;
        self.write(name, text.as_bytes())
    }

    /// The command succeeded: the folder stays.
    pub fn keep(mut self) -> PathBuf {
        self.kept = true;
        self.dir.clone()
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if !self.kept {
            for d in &self.created {
                // Fails (and so keeps it) unless the folder is empty.
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hisparse-output-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn an_uncommitted_file_leaves_the_old_one_and_no_temp() {
        let d = tmp("atomic");
        std::fs::create_dir_all(&d).unwrap();
        let dest = d.join("t.bin");
        std::fs::write(&dest, b"old").unwrap();
        assert!(AtomicFile::create("out", &dest, false).unwrap_err().to_string().contains("refusing to overwrite"));
        {
            let mut f = AtomicFile::create("out", &dest, true).unwrap();
            f.writer().write_all(b"half of the new").unwrap();
            // Dropped without commit: an interrupted or failed command.
        }
        assert_eq!(std::fs::read(&dest).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "no temporary file left");
        let mut f = AtomicFile::create("out", &dest, true).unwrap();
        f.writer().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert!(AtomicFile::create("out", &d, true).unwrap_err().to_string().contains("is a folder"));
        let e = AtomicFile::create("out", &d.join("no/such/dir/x"), false).unwrap_err().to_string();
        assert!(e.contains("--out") && e.contains("cannot be written"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_command_leaves_no_empty_folders() {
        let d = tmp("dir");
        let nested = d.join("a/b");
        drop(OutputDir::prepare("out", &nested).unwrap());
        assert!(!d.exists(), "every folder it created is gone");
        let o = OutputDir::prepare("out", &nested).unwrap();
        o.write("x.json", b"{}").unwrap();
        drop(o);
        assert!(nested.join("x.json").exists(), "a folder with output stays");
        let kept = OutputDir::prepare("out", &d.join("c")).unwrap().keep();
        assert!(kept.is_dir());
        std::fs::write(d.join("file"), b"x").unwrap();
        assert!(OutputDir::prepare("out", &d.join("file")).unwrap_err().to_string().contains("not a folder"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
