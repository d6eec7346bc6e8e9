//! Where results go, all or nothing. A file output ([`AtomicFile`]) is written under a
//! temporary name beside its destination and placed by a no-replace rename, so a file the user
//! names is never replaced — not even one that appears while the command runs — unless they
//! pass `--overwrite`. A folder output ([`OutputDir`]) is written whole into a private
//! temporary folder and then placed, or swapped in one step with an earlier output of this
//! program: two writers never mix, and a folder holding files this program did not write is
//! never replaced. Temporary names are short (a long legal name stays legal), and every
//! temporary is registered for a second Ctrl-C to remove (`crate::cleanup`).

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::place::{Placed, exchange, place_new};
use crate::cleanup::{Leftover, Registered, register};
use crate::error::{BenchError, Result};

/// The file in an output folder that lists what this program wrote there.
pub const MANIFEST: &str = ".hisparse-output";

/// The error of writing `path`, an output given as `--flag` (a full disk names the flag).
fn io<'a>(flag: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BenchError + 'a {
    move |e| BenchError::flag(flag, path.display(), format!("cannot be written ({e})"))
}

/// A fresh temporary name in `dir`, unique to this process and call.
fn temp_in(dir: &Path, kind: &str) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(".hisparse-{}-{n}.{kind}", std::process::id()))
}

/// The folder `p` is in (`.` for a bare name).
fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Whether the path as typed ends in a slash (names a folder).
fn ends_in_slash(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    p.as_os_str().as_bytes().last() == Some(&b'/')
}

/// Best effort: the folder's entry for a just-placed file reaches the disk.
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Folders that `make_parents` created for an output, removed again (only while empty) unless
/// the output was placed.
#[derive(Debug, Default)]
struct MadeFolders {
    /// Innermost first.
    dirs: Vec<PathBuf>,
    _regs: Vec<Registered>,
    kept: bool,
}

impl MadeFolders {
    /// Makes `dir` and its missing parents (the value of `--flag`).
    fn make(flag: &'static str, dir: &Path) -> Result<Self> {
        let mut dirs = Vec::new();
        let mut p = Some(dir);
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err()) {
            dirs.push(d.to_owned());
            p = d.parent();
        }
        // Outermost registered first, so that a second Ctrl-C removes the innermost first.
        let regs = dirs.iter().rev().map(|d| register(Leftover::EmptyDir(d.clone()))).collect();
        let me = Self { dirs, _regs: regs, kept: false };
        std::fs::create_dir_all(dir)
            .map_err(|e| BenchError::flag(flag, dir.display(), format!("cannot be created ({e})")))?;
        Ok(me)
    }
}

impl Drop for MadeFolders {
    fn drop(&mut self) {
        if !self.kept {
            for d in &self.dirs {
                // Fails (and so keeps it) unless the folder is empty.
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

/// A file being written under a temporary name; [`AtomicFile::commit`] places it, dropping it
/// uncommitted removes it. Either the whole new file is at the destination, or whatever was
/// there before.
#[derive(Debug)]
pub struct AtomicFile {
    flag: &'static str,
    dest: PathBuf,
    temp: PathBuf,
    overwrite: bool,
    out: BufWriter<File>,
    made: MadeFolders,
    _reg: Registered,
}

impl AtomicFile {
    /// Starts writing `dest` (given by the user as `--flag`). An existing `dest` is refused
    /// unless `overwrite`, and so is one that appears before the file is placed; the temporary
    /// file is created at once, so an unwritable place fails here, before any work. The folder
    /// must exist.
    pub fn create(flag: &'static str, dest: &Path, overwrite: bool) -> Result<Self> {
        Self::start(flag, dest, overwrite, false)
    }

    /// [`AtomicFile::create`], making `dest`'s missing folders (removed again if the file is
    /// never placed).
    pub fn create_with_folders(flag: &'static str, dest: &Path, overwrite: bool) -> Result<Self> {
        Self::start(flag, dest, overwrite, true)
    }

    fn start(flag: &'static str, dest: &Path, overwrite: bool, make_folders: bool) -> Result<Self> {
        let bad = |why: &str| Err(BenchError::flag(flag, dest.display(), why.to_string()));
        if ends_in_slash(dest) || dest.file_name().is_none() {
            return bad("names a folder (it ends in '/'); give a file name");
        }
        match std::fs::symlink_metadata(dest) {
            Ok(m) if m.is_dir() => return bad("is a folder; give a file name"),
            Ok(m) if !m.is_file() && !m.file_type().is_symlink() => {
                return bad("exists and is not a regular file; it is never replaced");
            }
            Ok(_) if !overwrite => return bad("exists; refusing to overwrite it (pass --overwrite to replace it)"),
            _ => {}
        }
        let dir = parent_of(dest);
        let made = if make_folders { MadeFolders::make(flag, &dir)? } else { MadeFolders::default() };
        if !dir.is_dir() {
            return bad(&format!("its folder {} does not exist", dir.display()));
        }
        let temp = temp_in(&dir, "tmp");
        let reg = register(Leftover::File(temp.clone()));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| BenchError::flag(flag, dest.display(), format!("cannot be written ({e})")))?;
        Ok(Self { flag, dest: dest.to_owned(), temp, overwrite, out: BufWriter::new(file), made, _reg: reg })
    }

    /// The writer of the temporary file.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        &mut self.out
    }

    /// A second buffered writer on the temporary file (another handle, sharing its offset), for
    /// a writer that must own what it writes to (an engine's trace); this file's own writer stays
    /// unused meanwhile. Errors name the flag.
    pub fn second_writer(&mut self) -> Result<Box<dyn Write + Send>> {
        let file = self.out.get_ref().try_clone().map_err(io(self.flag, &self.dest))?;
        Ok(Box::new(BufWriter::new(file)))
    }

    /// Flushes, syncs and places the file; returns the destination.
    pub fn commit(mut self) -> Result<PathBuf> {
        self.out.flush().map_err(io(self.flag, &self.dest))?;
        self.out.get_ref().sync_all().map_err(io(self.flag, &self.dest))?;
        if self.overwrite {
            std::fs::rename(&self.temp, &self.dest).map_err(io(self.flag, &self.dest))?;
        } else if place_new(&self.temp, &self.dest).map_err(io(self.flag, &self.dest))? == Placed::Exists {
            return Err(BenchError::flag(
                self.flag,
                self.dest.display(),
                "appeared while this command ran; it was left as it is and nothing was written \
                 (pass --overwrite to replace it)",
            ));
        }
        self.made.kept = true;
        sync_dir(&parent_of(&self.dest));
        Ok(self.dest.clone())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // After placement the temporary name no longer exists; otherwise the half-written file goes.
        let _ = std::fs::remove_file(&self.temp);
    }
}

/// The names an output folder's manifest lists (`None`: no manifest, or not one of ours).
fn manifest_names(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    let mut lines = text.lines();
    (lines.next() == Some("hisparse output")).then(|| lines.map(str::to_owned).collect())
}

/// Why `dir` may not be replaced by an output folder, if it may not: it is not a plain folder,
/// or it holds something this program's manifest there does not list.
fn not_replaceable(dir: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(dir).ok()?;
    if meta.file_type().is_symlink() {
        return Some("is a symbolic link; give the folder itself".into());
    }
    if !meta.is_dir() {
        return Some("exists and is not a folder".into());
    }
    let listed = manifest_names(dir).unwrap_or_default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => return Some(format!("cannot be read ({e})")),
    };
    let mut foreign: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != MANIFEST && !listed.contains(n))
        .collect();
    if foreign.is_empty() {
        return None;
    }
    foreign.sort();
    let shown = foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    let more = if foreign.len() > 3 { format!(" and {} more", foreign.len() - 3) } else { String::new() };
    Some(format!(
        "holds files this program did not write there ({shown}{more}); an output folder is replaced \
         whole, so it must be new, empty or an earlier output: pick another"
    ))
}

/// A command's output folder: written whole into a private temporary folder beside it, then
/// placed by [`OutputDir::commit`] (or swapped with an earlier output of this program, which
/// is then removed). Dropped uncommitted, nothing of it remains, not even the folders made
/// for it.
#[derive(Debug)]
pub struct OutputDir {
    flag: &'static str,
    dest: PathBuf,
    temp: PathBuf,
    names: RefCell<Vec<String>>,
    made: MadeFolders,
    placed: bool,
    _reg: Registered,
}

impl OutputDir {
    /// Prepares the output folder `dir` (the value of `--flag`): refused now if it could not be
    /// replaced; its missing parents made, the temporary folder made (so an unwritable place
    /// fails before any work).
    pub fn prepare(flag: &'static str, dir: &Path) -> Result<Self> {
        if let Some(why) = not_replaceable(dir) {
            return Err(BenchError::flag(flag, dir.display(), why));
        }
        let name_ok = dir.file_name().is_some_and(|n| n != "." && n != "..");
        if !name_ok {
            return Err(BenchError::flag(flag, dir.display(), "give the output folder a name of its own"));
        }
        let parent = parent_of(dir);
        let made = MadeFolders::make(flag, &parent)?;
        let temp = temp_in(&parent, "out");
        let reg = register(Leftover::Dir(temp.clone()));
        std::fs::create_dir(&temp)
            .map_err(|e| BenchError::flag(flag, dir.display(), format!("cannot be written ({e})")))?;
        Ok(Self { flag, dest: dir.to_owned(), temp, names: RefCell::new(Vec::new()), made, placed: false, _reg: reg })
    }

    /// Writes `name` into the folder (it reaches the disk before the folder is placed, in
    /// [`commit`](Self::commit)); returns the path it will have once placed.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let p = self.temp.join(name);
        let mut f = File::create(&p).map_err(io(self.flag, &self.dest.join(name)))?;
        f.write_all(bytes).map_err(io(self.flag, &self.dest.join(name)))?;
        let mut names = self.names.borrow_mut();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
        Ok(self.dest.join(name))
    }

    /// Writes `value` as pretty JSON to `name`.
    pub fn write_json(&self, name: &str, value: &impl serde::Serialize) -> Result<PathBuf> {
        let text = serde_json::to_string_pretty(value).map_err(|e| BenchError::Check(format!("JSON: {e}")))?;
        self.write(name, text.as_bytes())
    }

    /// Places the folder: at a new path, or in place of an earlier output of this program
    /// (swapped in one step, the earlier one then removed); refused if what is there now holds
    /// anything else. Returns the folder.
    pub fn commit(mut self) -> Result<PathBuf> {
        let mut manifest = String::from("hisparse output\n");
        for n in self.names.borrow().iter() {
            manifest += n;
            manifest.push('\n');
        }
        let m = self.temp.join(MANIFEST);
        std::fs::write(&m, manifest).map_err(io(self.flag, &self.dest.join(MANIFEST)))?;
        // Every file, the manifest too, reaches the disk before the folder is placed: synced
        // here, after the last write, rather than one by one as they are written.
        for n in self.names.borrow().iter().map(String::as_str).chain([MANIFEST]) {
            File::open(self.temp.join(n)).and_then(|f| f.sync_all()).map_err(io(self.flag, &self.dest.join(n)))?;
        }
        sync_dir(&self.temp);
        // A few rounds: another writer may place or remove the destination between our steps.
        for _ in 0..8 {
            if place_new(&self.temp, &self.dest).map_err(io(self.flag, &self.dest))? == Placed::Done {
                self.placed = true;
                break;
            }
            if let Some(why) = not_replaceable(&self.dest) {
                return Err(BenchError::flag(self.flag, self.dest.display(), why));
            }
            match exchange(&self.temp, &self.dest) {
                Ok(()) => {
                    self.placed = true;
                    self.remove_earlier(&self.temp);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                    // No exchange here: the earlier output is moved aside, then this one placed.
                    let aside = temp_in(&parent_of(&self.dest), "old");
                    match std::fs::rename(&self.dest, &aside) {
                        Ok(()) => self.remove_earlier(&aside),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io(self.flag, &self.dest)(e)),
                    }
                }
                Err(e) => return Err(io(self.flag, &self.dest)(e)),
            }
        }
        if !self.placed {
            return Err(BenchError::flag(self.flag, self.dest.display(), "kept changing while this command placed it"));
        }
        self.made.kept = true;
        sync_dir(&parent_of(&self.dest));
        Ok(self.dest.clone())
    }

    /// Removes an earlier output moved to `old`; if something not in its manifest appeared in
    /// it meanwhile, the folder is kept beside the new one instead, and said so.
    fn remove_earlier(&self, old: &Path) {
        if not_replaceable(old).is_none() {
            let _ = std::fs::remove_dir_all(old);
            return;
        }
        let keep = self.dest.with_file_name(format!(
            "{}.earlier-{}",
            self.dest.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned()),
            std::process::id()
        ));
        if std::fs::rename(old, &keep).is_ok() {
            crate::console::note(&format!(
                "hisparse: the earlier {} held files added while this command ran; kept as {}",
                self.dest.display(),
                keep.display()
            ));
        }
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if !self.placed {
            // Private to this process: everything in it is ours.
            let _ = std::fs::remove_dir_all(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests;
