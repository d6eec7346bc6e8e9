//! Fuzz target: the binary and JSON-lines trace readers must return records or an error for
//! any input, and never panic.
#![no_main]

use hisparse_policy::trace::{TraceReader, jsonl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = TraceReader::new(data) {
        for record in reader {
            if record.is_err() {
                break;
            }
        }
    }
    let _ = jsonl::read(data);
});
