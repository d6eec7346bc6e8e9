//! SIGINT and SIGTERM: the first one sets a flag that long commands check between steps (they
//! stop, write nothing half-done and exit non-zero, saying what they were doing); a second one
//! ends the program at once.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{BenchError, Result};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Exit status after an interruption (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Installs the handlers (once; later calls do nothing). A failure to install leaves the
/// default behaviour (the signal ends the program).
pub fn install() {
    let flag = FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The second signal, once the flag is set, exits at once; the first only sets it.
        let _ = signal_hook::flag::register_conditional_shutdown(sig, i32::from(EXIT_INTERRUPTED), Arc::clone(flag));
        let _ = signal_hook::flag::register(sig, Arc::clone(flag));
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// `Err(Interrupted)` naming `what` was being done, if a stop was asked for.
pub fn check(what: impl FnOnce() -> String) -> Result<()> {
    if requested() { Err(BenchError::Interrupted(what())) } else { Ok(()) }
}
