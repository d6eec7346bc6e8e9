//! A GGUF file's header walked and checked before candle's reader sees it: the values candle
//! computes with and does not check itself are refused here with the key or tensor at fault.
//! `general.alignment` (candle divides by it: 0 would panic) must be 1 to 2^16, and every
//! tensor's element count must fit in 64 bits (a product of its dimensions). The walk reads the
//! header only, bounded by the file's size: every length is checked against the bytes left.

use std::io::{BufReader, Read};
use std::path::Path;

use crate::error::{ModelError, Result};

/// The largest alignment accepted (GGUF files use 32; llama.cpp writes powers of two).
const MAX_ALIGNMENT: u64 = 1 << 16;
/// Nesting of arrays (candle stops at 64).
const MAX_DEPTH: usize = 16;
/// Dimensions per tensor (candle's and ggml's limit).
const MAX_DIMS: u32 = 4;

struct Walker<R> {
    r: R,
    /// Bytes of the file not read yet.
    left: u64,
    /// GGUF version 1 stores lengths and dimensions as 32 bits.
    v1: bool,
}

fn bad(key: impl Into<String>, value: impl std::fmt::Display, reason: impl Into<String>) -> ModelError {
    ModelError::invalid(key, value, reason)
}

impl<R: Read> Walker<R> {
    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        if self.left < N as u64 {
            return Err(bad(what, "truncated", "the file ends inside its header"));
        }
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| bad(what, "unreadable", e.to_string()))?;
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes::<4>(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes::<8>(what)?))
    }

    fn len(&mut self, what: &str) -> Result<u64> {
        if self.v1 { self.u32(what).map(u64::from) } else { self.u64(what) }
    }

    /// Skips `n` bytes, which must lie inside the file.
    fn skip(&mut self, n: u64, what: &str) -> Result<()> {
        if n > self.left {
            return Err(bad(what, n, format!("runs past the end of the file ({} B left)", self.left)));
        }
        let got = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())
            .map_err(|e| bad(what, "unreadable", e.to_string()))?;
        if got != n {
            return Err(bad(what, "truncated", "the file ends inside its header"));
        }
        self.left -= n;
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.len(what)?;
        if n > self.left.min(1 << 20) {
            // Names and keys are short; a long string value is skipped, never read whole here.
            return Err(bad(what, n, "a name longer than 1 MiB or than the file"));
        }
        let mut v = vec![0u8; n as usize];
        self.r.read_exact(&mut v).map_err(|e| bad(what, "unreadable", e.to_string()))?;
        self.left -= n;
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// A value of type `t`; returns it when it is an integer (for `general.alignment`).
    fn value(&mut self, t: u32, key: &str, depth: usize) -> Result<Option<i128>> {
        let int = match t {
            0 => i128::from(self.bytes::<1>(key)?[0]),
            1 => i128::from(self.bytes::<1>(key)?[0] as i8),
            2 => i128::from(u16::from_le_bytes(self.bytes::<2>(key)?)),
            3 => i128::from(i16::from_le_bytes(self.bytes::<2>(key)?)),
            4 => i128::from(self.u32(key)?),
            5 => i128::from(self.u32(key)? as i32),
            10 => i128::from(self.u64(key)?),
            11 => i128::from(self.u64(key)? as i64),
            6 => return self.skip(4, key).map(|()| None),
            12 => return self.skip(8, key).map(|()| None),
            7 => return self.skip(1, key).map(|()| None),
            8 => {
                let n = self.len(key)?;
                return self.skip(n, key).map(|()| None);
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(bad(key, "arrays", format!("nested more than {MAX_DEPTH} deep")));
                }
                let et = self.u32(key)?;
                let n = self.len(key)?;
                if n > self.left {
                    return Err(bad(key, n, format!("an array longer than the file ({} B left)", self.left)));
                }
                for _ in 0..n {
                    self.value(et, key, depth + 1)?;
                }
                return Ok(None);
            }
            _ => return Err(bad(key, t, "is no GGUF value type")),
        };
        Ok(Some(int))
    }
}

/// Walks the header of the GGUF file at `path`, refusing what candle's reader would compute
/// with unchecked (see the module's header). Errors name the key or tensor.
pub(crate) fn check(path: &Path) -> Result<()> {
    let io = |source| ModelError::Io { path: path.to_owned(), source };
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut w = Walker { r: BufReader::new(f), left: len, v1: false };
    let magic = w.u32("magic")?;
    if magic != 0x4655_4747 {
        return Err(bad("magic", format!("{magic:#010x}"), "not a GGUF file (it starts with \"GGUF\")"));
    }
    let version = w.u32("version")?;
    if !(1..=3).contains(&version) {
        return Err(bad("version", version, "GGUF versions 1 to 3 are read"));
    }
    w.v1 = version == 1;
    let tensors = w.len("tensor_count")?;
    let kvs = w.len("metadata_kv_count")?;
    for (what, n) in [("tensor_count", tensors), ("metadata_kv_count", kvs)] {
        if n > w.left {
            return Err(bad(what, n, format!("more entries than the file has bytes ({len})")));
        }
    }
    for _ in 0..kvs {
        let key = w.string("a metadata key")?;
        let t = w.u32(&key)?;
        let v = w.value(t, &key, 0)?;
        if key == "general.alignment"
            && let Some(a) = v
            && !(1..=i128::from(MAX_ALIGNMENT)).contains(&a)
        {
            return Err(bad(key, a, format!("must be between 1 and {MAX_ALIGNMENT}")));
        }
    }
    for _ in 0..tensors {
        let name = w.string("a tensor name")?;
        let dims = w.u32(&name)?;
        if dims > MAX_DIMS {
            return Err(bad(name, format!("{dims} dimensions"), format!("at most {MAX_DIMS}")));
        }
        let mut elems = 1u64;
        for _ in 0..dims {
            let d = w.len(&name)?;
            elems = elems.checked_mul(d).ok_or_else(|| bad(&name, d, "its element count overflows 64 bits"))?;
        }
        w.u32(&name)?; // the element type (candle checks it)
        w.u64(&name)?; // the data's offset (checked against the file when the tensor is read)
    }
    Ok(())
}
