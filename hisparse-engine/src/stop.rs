//! A caller's request to stop ([`StopFlag`]): an engine observes it before each step, between
//! the admissions of a step and inside a long prompt's prefill (between layers and between
//! rows), and then fails with [`EngineError::Stopped`] holding nothing half-done — a request
//! whose prefill was stopped is rolled back whole, as any failed admission is.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{EngineError, Result};

/// A shared flag that asks an engine to stop; [`StopFlag::never`] (the default) never does.
#[derive(Clone, Debug, Default)]
pub struct StopFlag(Option<Arc<AtomicBool>>);

impl StopFlag {
    /// Observes `flag` (set it to ask for the stop).
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        Self(Some(flag))
    }

    /// A flag nobody can set.
    pub fn never() -> Self {
        Self(None)
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(EngineError::Stopped)` once a stop was asked for.
    pub fn check(&self) -> Result<()> {
        if self.requested() { Err(EngineError::Stopped) } else { Ok(()) }
    }
}

/// Stop flags do not change what a configuration means: any two are equal.
impl PartialEq for StopFlag {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for StopFlag {}
