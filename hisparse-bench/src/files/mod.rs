//! Everything the program reads from or writes to the file system on the user's behalf, done
//! one way: outputs placed whole and never over a user's file (`output.rs`, by `place.rs`),
//! inputs read without blocking, mapping or outgrowing memory (`input.rs`); what is unfinished
//! is registered for a second Ctrl-C to remove (`crate::cleanup`).

pub mod input;
pub mod output;
mod place;

pub use input::Input;
pub use output::{AtomicFile, OutputDir};
