//! SIGINT and SIGTERM, on one path. A thread of its own receives them: the first sets the flag
//! that every long loop, every wait ([`sleep`]) and every read of a stream (`files::input`)
//! observes — the command stops there, writes nothing half-done and exits with 130, saying what
//! it was doing; the second removes what this process has on disk that is not finished
//! (`cleanup`: temporary outputs, folders made for them, its host-tier file) and ends
//! the program at once with 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::error::{BenchError, Result};

static FLAG: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// Exit status after an interruption (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Starts the signal thread (once). Where it cannot start, the signals keep their default
/// action (they end the program).
pub fn install() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let sigs = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];
        let Ok(mut signals) = signal_hook::iterator::Signals::new(sigs) else { return };
        let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || {
            // Test hook: the first signal is announced but not set, as in a command stuck where
            // nothing observes the flag (the second's path is then the only way out).
            let deaf = std::env::var_os("HISPARSE_TEST_DEAF_TO_FIRST_SIGNAL").is_some();
            for (n, _) in signals.forever().enumerate() {
                if n == 0 {
                    FLAG.store(!deaf, Ordering::SeqCst);
                    crate::console::note("hisparse: stopping at the next step (Ctrl-C again stops at once)");
                } else {
                    cleanup::remove_all();
                    crate::console::note("hisparse: stopped at once; its unfinished files were removed");
                    std::process::exit(i32::from(EXIT_INTERRUPTED));
                }
            }
        });
        if spawned.is_err() {
            crate::console::note("hisparse: cannot watch for Ctrl-C; it will end the program at once");
        }
    });
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    FLAG.load(Ordering::Relaxed)
}

/// `Err(Interrupted)` naming `what` was being done, if a stop was asked for.
pub fn check(what: impl FnOnce() -> String) -> Result<()> {
    if requested() { Err(BenchError::Interrupted(what())) } else { Ok(()) }
}

/// Sleeps for `d`, or until a stop is asked for (then `Err(Interrupted)` naming `what`).
pub fn sleep(d: Duration, what: impl Fn() -> String) -> Result<()> {
    let end = Instant::now().checked_add(d);
    loop {
        check(&what)?;
        let left = match end {
            Some(e) => e.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        };
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// The engine's view of the flag: an engine built with it stops between rows of a prefill.
pub fn engine_stop() -> hisparse_engine::StopFlag {
    hisparse_engine::StopFlag::new(Arc::clone(&FLAG))
}
