//! What the tiny-model tests share: the tiny GGUF file written into a folder of its own, and a
//! repeating text's tokens.
#![allow(clippy::unwrap_used, dead_code)] // tests: a failed unwrap is a failed test; each test uses some

use std::path::PathBuf;

use hisparse_model::Llama;
use hisparse_model::tiny::write_tiny_gguf;

/// The tiny model of `seed`, in a folder named by the process and `tag` (removed by the test).
pub fn tiny(tag: &str, seed: u64) -> (PathBuf, Llama) {
    let dir = std::env::temp_dir().join(format!("hisparse-tiny-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    write_tiny_gguf(&path, seed).unwrap();
    let m = Llama::load(&path).unwrap();
    (dir, m)
}

/// Tokens of a repeating text longer than every buffer the tests use.
pub fn text_tokens(m: &Llama, n: usize) -> Vec<u32> {
    let text = "the theory of the thing: 1234 then the other 56 thoughts; ".repeat(n / 20 + 1);
    let ids = m.tokenizer.encode(&text).unwrap();
    assert!(ids.len() >= n, "{}", ids.len());
    ids[..n].to_vec()
}

/// A `Write` the test keeps a handle to (an engine's trace, read back).
#[derive(Clone, Default)]

pub struct Sink(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
