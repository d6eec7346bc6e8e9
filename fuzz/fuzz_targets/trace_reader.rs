//! Fuzz target: the binary and JSON-lines trace readers, and the binary reader that keeps
//! positions encoded, must return records or an error for any input, and never panic.
#![no_main]

use hisparse_policy::trace::{TraceData, TraceReader, jsonl, read_trace_file_encoded, read_trace_from_encoded};
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
    if let Ok(TraceData::Encoded(t)) = read_trace_file_encoded(std::io::Cursor::new(data), data.len() as u64, 1 << 24) {
        let _ = t.decode();
    }
    if let Ok(TraceData::Encoded(t)) = read_trace_from_encoded(data, None, 1 << 24) {
        let _ = t.decode();
    }
});
