//! The program's two streams. Results go to standard output through [`out`], which reports a
//! failed write as an error instead of panicking: a reader that went away (`| head`, `| true`)
//! ends the program quietly with 141 (128 + SIGPIPE, what a shell reports for a program the
//! pipe ended), a full or broken output with one line and status 1 — in both cases after every
//! output file was placed. Notes and errors go to standard error through [`note`], which never
//! fails the program.

use std::io::Write;

use crate::error::{BenchError, Result};

/// Exit status when standard output's reader went away.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// Writes `text` to standard output, flushed.
pub fn out(text: &str) -> Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(text.as_bytes()).and_then(|()| o.flush()).map_err(BenchError::Stdout)
}

/// Writes `text` and a newline to standard error; a failure is ignored (there is nowhere left
/// to report it).
pub fn note(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{text}");
}
