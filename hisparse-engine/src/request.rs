//! Requests as the engine sees them: what arrives, and where each one is in its life.

use hisparse_memory::RequestId;
use serde::{Deserialize, Serialize};

/// A request as it arrives at the decode node: its prompt's KV already computed (by a prefill
/// node), and how many tokens to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Unique id.
    pub id: RequestId,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens to generate (at least 1).
    pub output_tokens: usize,
}

impl RequestSpec {
    /// Every position the request will ever hold: prompt + output (`None` if that overflows).
    pub fn total_tokens(&self) -> Option<usize> {
        self.prompt_tokens.checked_add(self.output_tokens)
    }
}

/// What became of a request that left the engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// It generated all its tokens.
    Finished {
        /// Decode steps of the engine it took part in.
        steps: u64,
    },
    /// It was aborted before its output was complete (everything it held was returned).
    Aborted,
    /// It could never fit and was rejected whole.
    Rejected {
        /// Why.
        reason: String,
    },
}
