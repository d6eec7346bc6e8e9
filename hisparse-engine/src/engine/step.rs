//! One engine step: admission (the scheduler, in arrival order, each admitted request's
//! prompt into the cache by the input source), a policy swapped at run time taken up, one
//! decode step of the running batch (the runner, through the cache's per-layer API), the tokens'
//! latencies, then finished requests leave and free everything they held.

use std::time::Instant;

use hisparse_kernels::Backend;
use hisparse_memory::Admission;

use super::Engine;
use super::model::DecodeModel;
use super::report::StepReport;
use super::runner::StepRunner;
use super::scheduler::Admit;
use crate::cache::KvCache;
use crate::error::Result;
use crate::metrics::StepMetrics;
use crate::request::{Outcome, RequestSpec};

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

impl<B: Backend, D: DecodeModel<B>> Engine<B, D>
where
    B::Memory: Clone,
{
    /// Admits what fits, decodes one token for every running request, retires finished ones.
    pub fn step(&mut self) -> Result<StepReport> {
        self.cfg.stop.check()?;
        self.step += 1;
        let mut rep = StepReport::default();
        rep.metrics.step = self.step;
        let placed = self.cache.placement();
        let t = Instant::now();
        let max_running = self.runtime.load().config.max_running;
        let Self { scheduler, cache, runner, step, .. } = self;
        scheduler.admit(max_running, *step, &mut rep.metrics, &mut Admitter { cache, runner })?;
        rep.metrics.stages.admission += secs(t);
        self.take_up_policy()?;
        let t0 = Instant::now();
        if !self.scheduler.running.is_empty() {
            let _span =
                tracing::info_span!("decode_step", step = self.step, batch = self.scheduler.running.len()).entered();
            self.runner.run(&mut self.cache, &self.scheduler, self.step, &mut rep)?;
            rep.latencies = self.scheduler.advance(Instant::now());
        } else {
            self.runner.model.idle_step(self.cache.backend())?;
        }
        let m = &mut rep.metrics;
        m.tokens = self.scheduler.running.len();
        m.running = self.scheduler.running.len();
        m.seconds = secs(t0);
        let st = &m.stages;
        let counted = st.workload
            + st.append
            + st.indexer
            + st.top_k
            + st.swap_in
            + st.attention
            + st.graph
            + st.model
            + st.exchange
            + st.backup;
        m.stages.bookkeeping = (m.seconds - counted).max(0.0);
        let Self { scheduler, cache, runner, step, .. } = self;
        scheduler.retire(*step, |id| {
            runner.model.finish(id);
            cache.free(id).map(|_| ())
        })?;
        let m = &mut rep.metrics;
        m.queued = self.scheduler.queued();
        m.device_bytes_in_use = self.cache.device_bytes_in_use() as u64;
        m.host_bytes_in_use = self.cache.host_bytes_in_use() as u64;
        let outcomes = &self.scheduler.outcomes;
        m.rejected = outcomes.iter().filter(|o| matches!(o.1, Outcome::Rejected { .. })).count();
        m.finished = outcomes.iter().filter(|o| matches!(o.1, Outcome::Finished { .. })).count();
        m.placement = self.cache.placement().since(&placed);
        Ok(rep)
    }

    /// Runs steps until nothing is queued or running (at most `max_steps`); returns the reports.
    pub fn run(&mut self, max_steps: u64) -> Result<Vec<StepReport>> {
        let mut out = Vec::new();
        while !self.is_idle() && (out.len() as u64) < max_steps {
            out.push(self.step()?);
        }
        Ok(out)
    }

    /// A policy swapped through the runtime handle: the cache rebuilds its records.
    fn take_up_policy(&mut self) -> Result<()> {
        let rt = self.runtime.load_full();
        if !std::sync::Arc::ptr_eq(rt.policy.get(), self.last_policy.get()) {
            self.cache.set_policy(rt.policy.clone())?;
            self.last_policy = rt.policy.clone();
            // The engine's config describes the policy in use, as the cache's does.
            self.cfg.cache.hisparse.eviction = rt.config.eviction.clone();
        }
        Ok(())
    }
}

/// Admission into the cache with the prompt from the model.
struct Admitter<'a, B: Backend, D> {
    cache: &'a mut KvCache<B>,
    runner: &'a mut StepRunner<B::Memory, D>,
}

impl<B: Backend, D: DecodeModel<B>> Admit for Admitter<'_, B, D>
where
    B::Memory: Clone,
{
    fn decide(&self, total: usize) -> Admission {
        self.cache.decide(total)
    }

    fn start(&mut self, spec: &RequestSpec, total: usize, m: &mut StepMetrics) -> Result<Admission> {
        let (id, prompt) = (spec.id, spec.prompt_tokens);
        let _span = tracing::info_span!("admit", request = id.0, prompt).entered();
        let got = self.runner.model.admit(self.cache, spec, total)?;
        if got == Admission::Admitted {
            let c = self.cache.config();
            let (g, b) = (&c.geometry, c.hisparse.device_buffer_size);
            let (kv_row, key) = self.cache.layouts();
            let rows = (g.layers * prompt * kv_row.row_bytes()) as u64;
            let key_rows = prompt.div_ceil(key.positions_per_row());
            m.bytes_prompt_device += (g.index_layers() * key_rows * key.row_bytes()) as u64;
            // Where admission wrote the prompt's rows (hybrid placement: by room).
            if self.cache.on_device(spec.id)? {
                m.bytes_prompt_device += rows;
            } else {
                m.bytes_prompt_host += rows;
                if prompt < b {
                    m.bytes_prompt_device += rows;
                }
            }
        }
        Ok(got)
    }
}
