//! Limits on what input may ask of this machine, checked before any work starts: counts that
//! must be at least one, sizes computed with checked arithmetic, and memory a command would
//! allocate against what the machine has available. Every refusal names the flag the user gave.

use std::fmt::Display;

use crate::error::{BenchError, Result};

/// Share of the available memory one command may plan to use (the rest: the program, the page
/// cache, the machine's other work).
pub const MEMORY_SHARE: f64 = 0.9;

pub use hisparse_memory::available_memory;

/// `v`, refused unless it is at least 1.
pub fn at_least_one(flag: &'static str, v: usize) -> Result<usize> {
    if v == 0 { Err(BenchError::flag(flag, v, "must be at least 1")) } else { Ok(v) }
}

/// `v`, refused unless it is in `lo..=hi`.
pub fn within(flag: &'static str, v: usize, lo: usize, hi: usize) -> Result<usize> {
    if (lo..=hi).contains(&v) { Ok(v) } else { Err(BenchError::flag(flag, v, format!("must be in {lo}..={hi}"))) }
}

/// A list flag's values, refused (naming the flag and the value) where one is given twice.
pub fn once_each<T: PartialEq + Display>(flag: &'static str, values: &[T]) -> Result<()> {
    match values.iter().enumerate().find_map(|(i, v)| values[..i].contains(v).then_some(v)) {
        Some(v) => Err(BenchError::flag(flag, v, "is given twice")),
        None => Ok(()),
    }
}

/// The product of `factors`, `None` if it overflows a u64.
pub fn product(factors: &[usize]) -> Option<u64> {
    factors.iter().try_fold(1u64, |acc, &f| acc.checked_mul(u64::try_from(f).ok()?))
}

/// `a + b` of flags `(flag_a, a)` and `(flag_b, b)`, refused naming the larger when it
/// overflows.
pub fn sum(a: (&'static str, usize), b: (&'static str, usize)) -> Result<usize> {
    a.1.checked_add(b.1).ok_or_else(|| {
        let (flag, v) = if a.1 >= b.1 { a } else { b };
        BenchError::flag(flag, v, "too large: the counts it adds up to overflow")
    })
}

/// Of several `(flag, value, default)`, the flag whose value is furthest above its default
/// (the one the user most likely raised), for naming a limit that several of them reach.
pub fn largest(flags: &[(&'static str, usize, usize)]) -> (&'static str, usize) {
    flags
        .iter()
        .max_by(|a, b| (a.1 as f64 / a.2.max(1) as f64).total_cmp(&(b.1 as f64 / b.2.max(1) as f64)))
        .map_or(("", 0), |&(f, v, _)| (f, v))
}

/// Refuses `flag = value` when `what` would need `bytes` of memory (`None`: the size overflows)
/// beyond what this machine has available (where it says).
pub fn memory(flag: &'static str, value: impl Display, what: &str, bytes: Option<u64>) -> Result<()> {
    memory_within(flag, value, what, bytes, available_memory())
}

/// [`memory`] against a given amount of available memory (`None`: unknown, only overflow is
/// refused).
pub fn memory_within(
    flag: &'static str,
    value: impl Display,
    what: &str,
    bytes: Option<u64>,
    available: Option<u64>,
) -> Result<()> {
    let Some(bytes) = bytes else {
        return Err(BenchError::flag(flag, value, format!("{what} would need more bytes than a 64-bit count holds")));
    };
    match available {
        Some(avail) if bytes as f64 > MEMORY_SHARE * avail as f64 => Err(BenchError::flag(
            flag,
            value,
            format!(
                "{what} would need {} of memory; this machine has {} available",
                human_bytes(bytes),
                human_bytes(avail)
            ),
        )),
        _ => Ok(()),
    }
}

/// A byte count for people: `1.5 GiB`, `48.0 MiB`, `656 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[i]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_giving_a_value_twice_is_refused_naming_it() {
        once_each("arrival-rate", &[2.0, 4.0, 8.0]).unwrap();
        let e = once_each("arrival-rate", &[2.0, 4.0, 2.0]).unwrap_err().to_string();
        assert!(e.contains("--arrival-rate = 2") && e.contains("twice"), "{e}");
    }

    #[test]
    fn memory_beyond_the_machine_or_overflowing_is_refused_by_flag() {
        let e = memory_within("context", 7, "the keys", Some(10 << 30), Some(8 << 30)).unwrap_err().to_string();
        assert!(e.starts_with("invalid --context = 7: the keys would need 10.0 GiB"), "{e}");
        assert!(e.contains("8.0 GiB available"), "{e}");
        memory_within("context", 7, "the keys", Some(1 << 30), Some(8 << 30)).unwrap();
        memory_within("context", 7, "the keys", Some(1 << 50), None).unwrap();
        let e = memory_within("batch", 9, "rows", None, None).unwrap_err().to_string();
        assert!(e.contains("--batch = 9") && e.contains("64-bit"), "{e}");
        assert_eq!(product(&[1 << 40, 1 << 30]), None);
        assert_eq!(product(&[3, 5, 7]), Some(105));
        assert!(sum(("window", usize::MAX), ("warmup", 1)).unwrap_err().to_string().contains("--window"));
        assert!(sum(("window", 1), ("warmup", usize::MAX)).unwrap_err().to_string().contains("--warmup"));
        assert_eq!(largest(&[("batch", 8, 4), ("context", 1 << 30, 32768)]), ("context", 1 << 30));
        assert!(at_least_one("runs", 0).is_err() && within("reps", 0, 1, 10).is_err());
        assert_eq!(human_bytes(656), "656 B");
        assert_eq!(human_bytes(48 << 20), "48.0 MiB");
    }
}
