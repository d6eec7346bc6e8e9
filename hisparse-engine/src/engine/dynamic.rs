//! `DecodeEngine`: the engine's driving interface as a trait object, so that a program picks
//! the backend at run time (`Box<dyn DecodeEngine>` over `Engine<CpuBackend>` or
//! `Engine<CudaBackend>`) and drives either with the same code.

use std::io::Write;

use hisparse_kernels::Backend;
use hisparse_memory::RequestId;

use super::{DecodeModel, Engine, EngineConfig, StepReport};
use crate::error::Result;
use crate::request::{Outcome, RequestSpec};

/// What a program needs of an engine, whatever its backend.
pub trait DecodeEngine {
    /// The backend's name.
    fn backend_name(&self) -> &'static str;
    /// See [`Engine::config`].
    fn config(&self) -> &EngineConfig;
    /// See [`Engine::submit`].
    fn submit(&mut self, spec: RequestSpec) -> Result<()>;
    /// See [`Engine::submit_arrived`].
    fn submit_arrived(&mut self, spec: RequestSpec, arrived: std::time::Instant) -> Result<()>;
    /// See [`Engine::abort`].
    fn abort(&mut self, id: RequestId) -> Result<()>;
    /// See [`Engine::step`].
    fn step(&mut self) -> Result<StepReport>;
    /// See [`Engine::is_idle`].
    fn is_idle(&self) -> bool;
    /// See [`Engine::outcomes`].
    fn outcomes(&self) -> &[(RequestId, Outcome)];
    /// See [`Engine::check_pools`].
    fn check_pools(&self) -> Result<()>;
    /// See [`Engine::record_trace`].
    fn record_trace(&mut self, out: Box<dyn Write + Send>, score_margin: usize) -> Result<()>;
    /// See [`Engine::finish_trace`].
    fn finish_trace(&mut self) -> Result<()>;
    /// See [`Engine::capture_next_step`].
    fn capture_next_step(&mut self);
    /// See [`Engine::runtime`].
    fn runtime(&self) -> crate::runtime::RuntimeHandle;
    /// See [`Engine::device_tier_bytes`].
    fn device_tier_bytes(&self) -> usize;
    /// See [`Engine::counts`].
    fn counts(&self) -> (usize, usize, usize);

    /// Joins a group of ranks (one engine per device): the emulated model's collectives then
    /// run through the backend's side of it ([`Engine::set_exchange`]). Needs a model.
    fn join_ranks(&mut self, member: hisparse_kernels::RankMember) -> Result<()>;

    /// See [`Engine::exchanged_bytes`].
    fn exchanged_bytes(&self) -> u64;
}

impl<B: Backend, D: DecodeModel<B>> DecodeEngine for Engine<B, D>
where
    B::Memory: Clone,
{
    fn backend_name(&self) -> &'static str {
        self.cache().backend().name()
    }

    fn config(&self) -> &EngineConfig {
        Engine::config(self)
    }

    fn submit(&mut self, spec: RequestSpec) -> Result<()> {
        Engine::submit(self, spec)
    }

    fn submit_arrived(&mut self, spec: RequestSpec, arrived: std::time::Instant) -> Result<()> {
        Engine::submit_arrived(self, spec, arrived)
    }

    fn abort(&mut self, id: RequestId) -> Result<()> {
        Engine::abort(self, id)
    }

    fn step(&mut self) -> Result<StepReport> {
        Engine::step(self)
    }

    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }

    fn outcomes(&self) -> &[(RequestId, Outcome)] {
        Engine::outcomes(self)
    }

    fn check_pools(&self) -> Result<()> {
        Engine::check_pools(self)
    }

    fn record_trace(&mut self, out: Box<dyn Write + Send>, score_margin: usize) -> Result<()> {
        Engine::record_trace(self, out, score_margin)
    }

    fn finish_trace(&mut self) -> Result<()> {
        Engine::finish_trace(self)
    }

    fn capture_next_step(&mut self) {
        Engine::capture_next_step(self);
    }

    fn runtime(&self) -> crate::runtime::RuntimeHandle {
        Engine::runtime(self)
    }

    fn device_tier_bytes(&self) -> usize {
        Engine::device_tier_bytes(self)
    }

    fn join_ranks(&mut self, member: hisparse_kernels::RankMember) -> Result<()> {
        let Some(shape) = self.config().emulated_model.clone() else {
            return Err(super::model::no_collectives());
        };
        let backend = self.cache().backend();
        let group = backend.join_group(member)?;
        let ex = crate::emulated::RankExchange::new(&shape, group, backend.memory())?;
        self.set_exchange(ex)
    }

    fn exchanged_bytes(&self) -> u64 {
        Engine::exchanged_bytes(self)
    }

    fn counts(&self) -> (usize, usize, usize) {
        Engine::counts(self)
    }
}
