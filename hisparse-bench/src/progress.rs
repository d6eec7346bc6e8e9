//! Progress bars (indicatif) for work longer than a second; hidden when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` units with a message.
pub fn bar(len: u64, msg: &str) -> ProgressBar {
    let b = ProgressBar::new(len).with_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:32} {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b.set_message(msg.to_string());
    b.enable_steady_tick(std::time::Duration::from_millis(250));
    b
}
