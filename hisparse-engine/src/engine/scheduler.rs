//! Continuous batching: the bounded waiting queue (requests in arrival order), admission while
//! a request's whole-life resources fit (one that can never fit is rejected whole; the first
//! that cannot fit now holds back the rest), the running batch, retirement, and each token's
//! latency (from the request's arrival, or from its previous token).
//!
//! Invariant: a request is in exactly one of: the queue, the running batch, the outcomes.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use hisparse_memory::{Admission, RequestId};

use super::model::BatchEntry;
use crate::error::{EngineError, Result};
use crate::latency::TokenLatency;
use crate::metrics::StepMetrics;
use crate::request::{Outcome, RequestSpec};

/// What admission asks of the memory hierarchy and the input source.
pub(crate) trait Admit {
    /// Whether a request of `total` positions would fit now, must wait, or never fits.
    fn decide(&self, total: usize) -> Admission;
    /// Admits `spec` (its prompt into the cache), reserving `total` positions.
    fn start(&mut self, spec: &RequestSpec, total: usize, m: &mut StepMetrics) -> Result<Admission>;
}

/// A request waiting for capacity.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    spec: RequestSpec,
    arrived: Instant,
}

/// A request being decoded (its KV state is in the cache).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Running {
    pub spec: RequestSpec,
    /// Positions with KV so far (the next token is at `seq_len`): the prompt and the tokens
    /// generated.
    pub seq_len: usize,
    pub generated: usize,
    pub first_step: u64,
    arrived: Instant,
    last_token: Option<Instant>,
}

/// The scheduler: see the module documentation.
pub(crate) struct Scheduler {
    queue: VecDeque<Waiting>,
    pub running: Vec<Running>,
    pub outcomes: Vec<(RequestId, Outcome)>,
    seen: HashSet<RequestId>,
    max_queued: usize,
}

impl Scheduler {
    pub fn new(max_queued: usize) -> Self {
        Self { queue: VecDeque::new(), running: Vec::new(), outcomes: Vec::new(), seen: HashSet::new(), max_queued }
    }

    /// Queues a request that arrived at `arrived`; a full queue refuses it, holding nothing.
    pub fn submit(&mut self, spec: RequestSpec, arrived: Instant) -> Result<()> {
        if self.queue.len() >= self.max_queued {
            return Err(EngineError::QueueFull { capacity: self.max_queued });
        }
        let bad = |reason: &str| Err(EngineError::Request { id: spec.id.0, reason: reason.into() });
        if spec.output_tokens == 0 {
            return bad("output_tokens must be at least 1");
        }
        if spec.prompt_tokens == 0 {
            return bad("prompt_tokens must be at least 1");
        }
        // Keeps every position and step of the request within the kernels' 32-bit fields.
        if spec.total_tokens().is_none_or(|t| t > u32::MAX as usize / 2) {
            return bad("prompt_tokens + output_tokens must stay below 2^31");
        }
        if !self.seen.insert(spec.id) {
            return bad("duplicate request id");
        }
        self.queue.push_back(Waiting { spec, arrived });
        Ok(())
    }

    /// Requests waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Admits what fits, in arrival order, through `to`; records rejections. At most
    /// `max_running` run at once (0: no cap). `step` is the engine step the admitted requests
    /// first decode in.
    pub fn admit(&mut self, max_running: usize, step: u64, m: &mut StepMetrics, to: &mut dyn Admit) -> Result<()> {
        while let Some(w) = self.queue.front().copied() {
            if max_running > 0 && self.running.len() >= max_running {
                break;
            }
            // `submit` checked that the total does not overflow.
            let total = w.spec.total_tokens().unwrap_or(usize::MAX);
            match to.decide(total) {
                Admission::Admitted => {}
                Admission::Wait { .. } => break,
                Admission::Rejected { reason } => {
                    self.queue.pop_front();
                    tracing::info!(request = w.spec.id.0, %reason, "rejected");
                    self.outcomes.push((w.spec.id, Outcome::Rejected { reason }));
                    continue;
                }
            }
            match to.start(&w.spec, total, m)? {
                Admission::Admitted => {
                    self.queue.pop_front();
                    m.admitted += 1;
                    self.running.push(Running {
                        spec: w.spec,
                        seq_len: w.spec.prompt_tokens,
                        generated: 0,
                        first_step: step,
                        arrived: w.arrived,
                        last_token: None,
                    });
                }
                // `decide` said it fits: nothing changed in between.
                _ => break,
            }
        }
        Ok(())
    }

    /// The running batch as the cache and the input source see it.
    pub fn batch(&self) -> Vec<BatchEntry> {
        self.running.iter().map(|r| BatchEntry { id: r.spec.id, position: r.seq_len }).collect()
    }

    /// The batch of the next step if no request leaves or joins (each one position on); `None`
    /// when a request finishes with this step.
    pub fn foreseen(&self) -> Option<Vec<BatchEntry>> {
        if self.running.iter().any(|r| r.generated + 1 >= r.spec.output_tokens) {
            return None;
        }
        Some(self.running.iter().map(|r| BatchEntry { id: r.spec.id, position: r.seq_len + 1 }).collect())
    }

    /// After a decode step that ended at `now`: every running request holds one more token;
    /// returns their latencies.
    pub fn advance(&mut self, now: Instant) -> Vec<TokenLatency> {
        let mut out = Vec::with_capacity(self.running.len());
        for r in &mut self.running {
            let since = r.last_token.unwrap_or(r.arrived);
            out.push(TokenLatency {
                request: r.spec.id,
                token: r.generated as u32,
                seconds: now.saturating_duration_since(since).as_secs_f64(),
            });
            r.last_token = Some(now);
            r.seq_len += 1;
            r.generated += 1;
        }
        out
    }

    /// Retires finished requests through `free` (which returns what they held); `step` is the
    /// engine step that just ran.
    pub fn retire(&mut self, step: u64, mut free: impl FnMut(RequestId) -> Result<()>) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].generated < self.running[i].spec.output_tokens {
                i += 1;
                continue;
            }
            let r = self.running.swap_remove(i);
            free(r.spec.id)?;
            self.outcomes.push((r.spec.id, Outcome::Finished { steps: step + 1 - r.first_step }));
        }
        Ok(())
    }

    /// Ends request `id` now, wherever it is: a waiting one leaves the queue, a running one
    /// leaves the batch through `free`. Returns whether it was found.
    pub fn abort(&mut self, id: RequestId, free: impl FnOnce(RequestId) -> Result<()>) -> Result<bool> {
        if let Some(i) = self.queue.iter().position(|w| w.spec.id == id) {
            self.queue.remove(i);
        } else if let Some(i) = self.running.iter().position(|r| r.spec.id == id) {
            let r = self.running.swap_remove(i);
            free(r.spec.id)?;
        } else {
            return Ok(false);
        }
        self.outcomes.push((id, Outcome::Aborted));
        Ok(true)
    }
}
