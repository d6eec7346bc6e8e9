//! Placement of file and folder outputs: never over a user's file, never mixed, nothing left.

use super::*;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hisparse-output-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn a_file_that_appears_while_writing_is_never_replaced() {
    let d = tmp("appears");
    let dest = d.join("t.bin");
    let mut f = AtomicFile::create("out", &dest, false).unwrap();
    f.writer().write_all(b"new").unwrap();
    // The user's file appears after the start-up check, before the output is placed.
    std::fs::write(&dest, b"precious").unwrap();
    let e = f.commit().unwrap_err().to_string();
    assert!(e.contains("--out") && e.contains("appeared while this command ran"), "{e}");
    assert_eq!(std::fs::read(&dest).unwrap(), b"precious");
    assert_eq!(names(&d), ["t.bin"], "no temporary file left");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_uncommitted_file_leaves_the_old_one_and_no_temp() {
    let d = tmp("atomic");
    let dest = d.join("t.bin");
    std::fs::write(&dest, b"old").unwrap();
    assert!(AtomicFile::create("out", &dest, false).unwrap_err().to_string().contains("refusing to overwrite"));
    {
        let mut f = AtomicFile::create("out", &dest, true).unwrap();
        f.writer().write_all(b"half of the new").unwrap();
    }
    assert_eq!(std::fs::read(&dest).unwrap(), b"old");
    assert_eq!(names(&d), ["t.bin"]);
    let mut f = AtomicFile::create("out", &dest, true).unwrap();
    f.writer().write_all(b"new").unwrap();
    f.commit().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"new");
    assert!(AtomicFile::create("out", &d, true).unwrap_err().to_string().contains("is a folder"));
    let e = AtomicFile::create("out", &d.join("no/such/dir/x"), false).unwrap_err().to_string();
    assert!(e.contains("--out") && e.contains("does not exist"), "{e}");
    let e = AtomicFile::create("out", &d.join("newdir/"), false).unwrap_err().to_string();
    assert!(e.contains("ends in '/'"), "{e}");
    // A name of 248 bytes (legal) is written: the temporary name is short.
    let long = d.join("x".repeat(248));
    let mut f = AtomicFile::create("out", &long, false).unwrap();
    f.writer().write_all(b"long").unwrap();
    f.commit().unwrap();
    assert_eq!(std::fs::read(&long).unwrap(), b"long");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn overwrite_replaces_a_link_never_its_target() {
    let d = tmp("link");
    std::fs::write(d.join("user"), b"precious").unwrap();
    std::os::unix::fs::symlink(d.join("user"), d.join("out.bin")).unwrap();
    let mut f = AtomicFile::create("out", &d.join("out.bin"), true).unwrap();
    f.writer().write_all(b"new").unwrap();
    f.commit().unwrap();
    assert_eq!(std::fs::read(d.join("user")).unwrap(), b"precious");
    assert!(!std::fs::symlink_metadata(d.join("out.bin")).unwrap().file_type().is_symlink());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_folder_output_is_placed_whole_or_not_at_all() {
    let d = tmp("dir");
    let out = d.join("a/b/out");
    {
        let o = OutputDir::prepare("out", &out).unwrap();
        o.write("x.json", b"{}").unwrap();
        // Dropped uncommitted: a failed or interrupted command.
    }
    assert!(names(&d).is_empty(), "nothing left, not even the folders made for it: {:?}", names(&d));
    let o = OutputDir::prepare("out", &out).unwrap();
    assert_eq!(o.write("x.json", b"1").unwrap(), out.join("x.json"));
    assert!(!out.exists(), "not placed before commit");
    assert_eq!(o.commit().unwrap(), out);
    assert_eq!(names(&out), [MANIFEST, "x.json"]);
    // A second run replaces it whole: its files only.
    let o = OutputDir::prepare("out", &out).unwrap();
    o.write("y.json", b"2").unwrap();
    o.commit().unwrap();
    assert_eq!(names(&out), [MANIFEST, "y.json"]);
    assert_eq!(names(&d.join("a/b")), ["out"], "no temporary folder left");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn two_writers_into_one_folder_never_mix() {
    let d = tmp("two");
    let out = d.join("out");
    let a = OutputDir::prepare("out", &out).unwrap();
    let b = OutputDir::prepare("out", &out).unwrap();
    a.write("run.json", b"a").unwrap();
    b.write("run.json", b"b").unwrap();
    a.write("steps.csv", b"a").unwrap();
    b.write("steps.csv", b"b").unwrap();
    a.commit().unwrap();
    b.commit().unwrap();
    assert_eq!(std::fs::read(out.join("run.json")).unwrap(), b"b");
    assert_eq!(std::fs::read(out.join("steps.csv")).unwrap(), b"b");
    assert_eq!(names(&d), ["out"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_folder_holding_a_users_files_is_never_replaced() {
    let d = tmp("users");
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("notes.txt"), b"precious").unwrap();
    let e = OutputDir::prepare("out", &out).unwrap_err().to_string();
    assert!(e.contains("--out") && e.contains("notes.txt"), "{e}");
    // A user's file added to an earlier output while the command runs: refused at placement.
    std::fs::remove_file(out.join("notes.txt")).unwrap();
    let o = OutputDir::prepare("out", &out).unwrap();
    o.write("x", b"1").unwrap();
    o.commit().unwrap();
    let o = OutputDir::prepare("out", &out).unwrap();
    o.write("x", b"2").unwrap();
    std::fs::write(out.join("notes.txt"), b"precious").unwrap();
    assert!(o.commit().unwrap_err().to_string().contains("notes.txt"));
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"precious");
    assert_eq!(std::fs::read(out.join("x")).unwrap(), b"1", "the earlier output untouched");
    assert_eq!(names(&d), ["out"]);
    // A link to a folder, a file, and `.` are refused.
    std::os::unix::fs::symlink(&out, d.join("link")).unwrap();
    assert!(OutputDir::prepare("out", &d.join("link")).unwrap_err().to_string().contains("symbolic link"));
    std::fs::write(d.join("file"), b"x").unwrap();
    assert!(OutputDir::prepare("out", &d.join("file")).unwrap_err().to_string().contains("not a folder"));
    std::fs::remove_dir_all(&d).unwrap();
}
