//! Tests of the host tier: row and page-run writes, growth page by page, exhaustion, the
//! file-backed tier, the writer on another thread.

use std::path::PathBuf;

use super::*;

fn cfg(bytes: usize, file: Option<HostTierFile>) -> HostTierConfig {
    HostTierConfig { bytes, layers: 3, row_bytes: 656, page_tokens: 4, file }
}

fn row(seed: u8) -> Vec<u8> {
    (0..656).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn rows_round_trip_and_grow_page_by_page() {
    let mut t = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
    assert_eq!(t.total_pages(), 10);
    let r = RequestId(7);
    t.register(r).unwrap();
    t.grow(r, 5).unwrap();
    assert_eq!(t.capacity(r).unwrap(), 8);
    let base = t.as_ptr();
    for l in 0..3 {
        for p in 0..8 {
            t.write_row(r, l, p, &row((l * 10 + p) as u8)).unwrap();
        }
    }
    let e = t.write_row(r, 0, 8, &row(0)).unwrap_err();
    assert!(matches!(e, MemoryError::PositionOutOfRange { position: 8, capacity: 8, .. }), "{e}");
    t.grow(r, 9).unwrap();
    t.write_row(r, 2, 8, &row(99)).unwrap();
    let mut out = vec![0u8; 656];
    for l in 0..3 {
        for p in 0..8 {
            t.read_row(r, l, p, &mut out).unwrap();
            assert_eq!(out, row((l * 10 + p) as u8), "layer {l} position {p}");
        }
    }
    t.read_row(r, 2, 8, &mut out).unwrap();
    assert_eq!(out, row(99));
    assert_eq!(t.as_ptr(), base, "the mapping never moves");
    // Layer-major layout: layer 1 of page 0 starts one layer region in.
    assert_eq!(t.locate(r, 1, 0).unwrap(), HostRowLocation((10 * 4 * 656) as u64));
    assert_eq!(t.bytes_in_use(), 3 * 3 * 4 * 656);
    t.release(r).unwrap();
    assert_eq!(t.bytes_in_use(), 0);
    t.check().unwrap();
}

#[test]
fn bulk_writes_equal_row_writes_across_pages_and_check_first() {
    let mut a = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
    let mut b = HostTier::new(&cfg(656 * 4 * 3 * 10, None)).unwrap();
    let r = RequestId(2);
    for t in [&mut a, &mut b] {
        t.register(RequestId(9)).unwrap();
        t.grow(RequestId(9), 3).unwrap(); // so that r's pages are not the first ones
        t.register(r).unwrap();
        t.grow(r, 11).unwrap();
    }
    let rows: Vec<u8> = (3..10).flat_map(|p| row(p as u8)).collect();
    a.write_rows(r, 1, 3, &rows).unwrap();
    for p in 3..10 {
        b.write_row(r, 1, p, &row(p as u8)).unwrap();
    }
    let (mut x, mut y) = (vec![0u8; 656], vec![0u8; 656]);
    for p in 0..11 {
        a.read_row(r, 1, p, &mut x).unwrap();
        b.read_row(r, 1, p, &mut y).unwrap();
        assert_eq!(x, y, "position {p}");
    }
    // Past the capacity: refused whole, nothing written.
    let before = (0..12).map(|p| a.read_row(r, 2, p.min(11), &mut x).map(|()| x.clone())).collect::<Vec<_>>();
    assert!(a.write_rows(r, 2, 8, &rows[..5 * 656]).is_err());
    let after = (0..12).map(|p| a.read_row(r, 2, p.min(11), &mut x).map(|()| x.clone())).collect::<Vec<_>>();
    assert_eq!(before, after);
    assert!(a.write_rows(r, 1, 0, &rows[..100]).is_err(), "not whole rows");
}

#[test]
fn exhaustion_is_all_or_nothing_and_freed_pages_are_reused() {
    let mut t = HostTier::new(&cfg(656 * 4 * 3 * 4, None)).unwrap();
    let (a, b) = (RequestId(1), RequestId(2));
    t.register(a).unwrap();
    t.register(b).unwrap();
    t.grow(a, 12).unwrap();
    let e = t.grow(b, 8).unwrap_err();
    assert!(matches!(e, MemoryError::CapacityExhausted { needed: 2, free: 1, .. }), "{e}");
    assert_eq!(t.capacity(b).unwrap(), 0);
    t.release(a).unwrap();
    t.grow(b, 16).unwrap();
    assert_eq!(t.free_pages(), 0);
    t.check().unwrap();
}

fn tmp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hisparse-host-tier-{}-{name}.bin", std::process::id()))
}

#[test]
fn file_backed_tier_persists_rows_in_the_file_when_kept() {
    let path = tmp_path("kept");
    let _ = std::fs::remove_file(&path);
    let spec = HostTierFile { path: path.clone(), overwrite: false, keep: true };
    let mut t = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(spec))).unwrap();
    assert_eq!(t.path(), Some(path.as_path()));
    let r = RequestId(1);
    t.register(r).unwrap();
    t.grow(r, 1).unwrap();
    t.write_row(r, 1, 0, &row(5)).unwrap();
    let at = t.locate(r, 1, 0).unwrap().0 as usize;
    drop(t);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 656 * 4 * 3 * 2);
    assert_eq!(&bytes[at..at + 656], row(5).as_slice());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn an_existing_file_is_never_truncated_without_overwrite() {
    let path = tmp_path("existing");
    std::fs::write(&path, b"precious user data").unwrap();
    let e = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(HostTierFile::new(&path)))).unwrap_err();
    assert!(e.to_string().contains("exists; refusing to overwrite"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious user data", "untouched");
    // With the explicit flag it is replaced, and removed when the tier goes away.
    let spec = HostTierFile { path: path.clone(), overwrite: true, keep: false };
    let t = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(spec))).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 656 * 4 * 3 * 2);
    drop(t);
    assert!(!path.exists(), "removed on drop");
}

#[test]
fn a_tier_file_is_locked_reserved_and_removed() {
    let path = tmp_path("locked");
    let _ = std::fs::remove_file(&path);
    let a = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(HostTierFile::new(&path)))).unwrap();
    // The space is reserved up front: blocks are allocated, not a sparse hole.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&path).unwrap();
        assert!(m.blocks() * 512 >= m.len(), "{} blocks for {} bytes", m.blocks(), m.len());
    }
    // A second tier on the same file (overwrite asked) is refused while the first holds the lock.
    let spec = HostTierFile { path: path.clone(), overwrite: true, keep: false };
    let e = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(spec))).unwrap_err();
    assert!(e.to_string().contains("locked by another process"), "{e}");
    assert!(path.exists(), "the refused tier removed nothing");
    drop(a);
    assert!(!path.exists(), "removed when the tier goes away");
    // A directory that does not exist: an error, and nothing created.
    let bad = std::env::temp_dir().join("hisparse-no-such-dir").join("tier.bin");
    assert!(matches!(HostTier::new(&cfg(656 * 4 * 3 * 2, Some(HostTierFile::new(&bad)))), Err(MemoryError::Io { .. })));
}

#[test]
fn overflowing_sizes_are_refused_naming_the_field() {
    let big = HostTierConfig { bytes: usize::MAX, layers: 3, row_bytes: usize::MAX / 2, page_tokens: 4, file: None };
    let e = HostTier::new(&big).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidField { field: "page_tokens", .. }), "{e}");
    let big = HostTierConfig { bytes: usize::MAX, layers: usize::MAX / 2, row_bytes: 656, page_tokens: 4, file: None };
    assert!(matches!(HostTier::new(&big).unwrap_err(), MemoryError::InvalidField { field: "layers", .. }));
    let mut t = HostTier::new(&cfg(656 * 4 * 3 * 4, None)).unwrap();
    t.register(RequestId(1)).unwrap();
    t.grow(RequestId(1), 4).unwrap();
    assert!(t.write_rows(RequestId(1), 0, usize::MAX, &row(1)).is_err());
    assert!(t.locate(RequestId(1), 0, usize::MAX).is_err());
}

#[test]
fn a_writer_on_another_thread_fills_rows() {
    let mut t = HostTier::new(&cfg(656 * 4 * 3 * 4, None)).unwrap();
    let r = RequestId(3);
    t.register(r).unwrap();
    t.grow(r, 16).unwrap();
    let locs: Vec<_> = (0..16).map(|p| t.locate(r, 2, p).unwrap()).collect();
    let w = t.row_writer();
    std::thread::spawn(move || {
        for (p, at) in locs.into_iter().enumerate() {
            // SAFETY: the main thread touches none of these rows until the join below.
            unsafe { w.write(at, &row(p as u8)) }.unwrap();
        }
    })
    .join()
    .unwrap();
    let mut out = vec![0u8; 656];
    for p in 0..16 {
        t.read_row(r, 2, p, &mut out).unwrap();
        assert_eq!(out, row(p as u8));
    }
    // SAFETY: single-threaded here.
    let e = unsafe { t.row_writer().write(HostRowLocation(t.len() as u64 - 10), &row(0)) }.unwrap_err();
    assert!(matches!(e, MemoryError::OutOfBounds { .. }));
}

#[test]
fn a_tier_too_small_for_one_page_is_refused() {
    let e = HostTier::new(&cfg(1000, None)).unwrap_err();
    assert!(matches!(e, MemoryError::InvalidField { field: "host_bytes", .. }), "{e}");
}

#[test]
fn a_link_a_fifo_or_a_replaced_path_is_never_written_or_removed() {
    let spec = |path: &PathBuf| HostTierFile { path: path.clone(), overwrite: true, keep: false };
    // A link to a user's file, even with overwrite asked: refused, the target untouched.
    let (user, link) = (tmp_path("user"), tmp_path("link"));
    std::fs::write(&user, b"precious user data").unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&user, &link).unwrap();
    let e = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(spec(&link)))).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(std::fs::read(&user).unwrap(), b"precious user data");
    assert!(std::fs::symlink_metadata(&link).is_ok(), "the link stays");
    // A FIFO: refused by name, at once (no wait for a reader).
    let fifo = tmp_path("fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(spec(&fifo)))).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    // A tier whose path was given to another file meanwhile leaves that file alone.
    let path = tmp_path("moved");
    let _ = std::fs::remove_file(&path);
    let t = HostTier::new(&cfg(656 * 4 * 3 * 2, Some(HostTierFile::new(&path)))).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"the user's new file").unwrap();
    drop(t);
    assert_eq!(std::fs::read(&path).unwrap(), b"the user's new file");
    for p in [user, link, fifo, path] {
        std::fs::remove_file(p).unwrap();
    }
}
