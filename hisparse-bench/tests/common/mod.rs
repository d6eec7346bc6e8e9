//! What the CLI tests share: the program's path, a run with a time limit, and hostile but
//! well-formed inputs (traces with correct checksums, `.npy` files).
#![allow(dead_code, clippy::unwrap_used)] // each test binary uses a part; a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The built program: cargo's path, or (where tests were packed and carried elsewhere, as
/// gpu-pack does) the `hisparse` beside this test executable; `HISPARSE_TEST_PROGRAM` names
/// another.
pub fn program() -> PathBuf {
    // Another build to hold to the same cases (e.g. an older one, to see a case fail there).
    if let Some(p) = std::env::var_os("HISPARSE_TEST_PROGRAM") {
        return PathBuf::from(p);
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_hisparse"));
    if built.exists() {
        return built;
    }
    std::env::current_exe().unwrap().with_file_name("hisparse")
}

/// What a run ended with.
pub struct Ended {
    pub code: Option<i32>,
    pub stderr: String,
    pub secs: f64,
}

/// Runs the program in `dir` with a time limit; a hang is killed and reported as `code: None`.
pub fn run_in(dir: &Path, args: &[String], limit: Duration) -> Ended {
    let t = Instant::now();
    let mut child = Command::new(program())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            return Ended { code: status.code(), stderr, secs: t.elapsed().as_secs_f64() };
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ended {
                code: None,
                stderr: "HUNG: killed at the time limit".into(),
                secs: t.elapsed().as_secs_f64(),
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn varint(mut v: u32, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A binary trace with correct checksums over whatever the records say (hostile but well
/// formed): `(step, request, layer, seq_len, positions)` with positions delta-coded as written.
pub fn raw_trace(top_k: u32, layers: u32, records: &[(u32, u64, u32, u32, Vec<u32>)]) -> Vec<u8> {
    let mut b = b"HSPTRACE".to_vec();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    for v in [top_k, layers, 656, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    let c = crc32fast::hash(&b);
    b.extend_from_slice(&c.to_le_bytes());
    for (step, req, layer, seq_len, pos) in records {
        let mut p = Vec::new();
        p.extend_from_slice(&step.to_le_bytes());
        p.extend_from_slice(&req.to_le_bytes());
        p.extend_from_slice(&layer.to_le_bytes());
        p.extend_from_slice(&seq_len.to_le_bytes());
        p.extend_from_slice(&(pos.len() as u32).to_le_bytes());
        let mut prev: Option<u32> = None;
        for &x in pos {
            // Deltas wrap for unsorted input: the decoder sees what a hostile writer sent.
            varint(prev.map_or(x, |q| x.wrapping_sub(q).wrapping_sub(1)), &mut p);
            prev = Some(x);
        }
        let c = crc32fast::hash(&p);
        p.extend_from_slice(&c.to_le_bytes());
        b.push(0x01);
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(&p);
    }
    let n = (records.len() as u64).to_le_bytes();
    b.push(0xFF);
    b.extend_from_slice(&n);
    b.extend_from_slice(&crc32fast::hash(&n).to_le_bytes());
    b
}

/// A `.npy` file: `descr` and `shape` as numpy writes them, then `data`.
pub fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(data);
    b
}

pub fn split(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// A command line as `OsString`s: each string literal split at whitespace, each other argument
/// (a path, a `String`, a parenthesised literal that keeps its spaces) taken whole:
/// `argv!("simulate --trace", trace, "--buffers 64,128")`.
#[allow(unused_macros)] // each test binary uses a part
macro_rules! argv {
    (@push $v:ident;) => {};
    (@push $v:ident; $lit:literal $(, $($rest:tt)*)?) => {
        $v.extend($lit.split_whitespace().map(::std::ffi::OsString::from));
        argv!(@push $v; $($($rest)*)?);
    };
    (@push $v:ident; $e:expr $(, $($rest:tt)*)?) => {
        $v.push(::std::ffi::OsString::from(::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$e)));
        argv!(@push $v; $($($rest)*)?);
    };
    ($($t:tt)*) => {{
        let mut v: Vec<::std::ffi::OsString> = Vec::new();
        argv!(@push v; $($t)*);
        v
    }};
}
#[allow(unused_imports)]
pub(crate) use argv;
