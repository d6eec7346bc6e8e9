//! The engine: serves many decode requests at once with continuous batching, in the resident
//! or the hisparse mode, on any [`Backend`] — our own client of the cache's per-layer API. It is
//! split along its jobs: the memory hierarchy ([`KvCache`]), scheduling (`scheduler.rs`: the
//! bounded waiting queue, admission, the running batch, latencies), the step runner
//! (`runner.rs`: the layer loop, launch graphs), the model it drives (`model.rs`: the
//! [`DecodeModel`] trait; `synthetic.rs`: the default, the synthetic workload of `inputs.rs` with
//! the emulated model's GEMMs) and the observers (`observe.rs`: traces, dumps, digests).
//! `step.rs` puts one step together; `dynamic.rs` is the engine as a trait object.

mod dynamic;
mod inputs;
mod model;
mod observe;
mod report;
mod runner;
mod scheduler;
mod step;
mod synthetic;

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use hisparse_kernels::Backend;
use hisparse_memory::{KvGeometry, Mode, RequestId, Resources};
use hisparse_policy::trace::{TraceHeader, TraceWriter};

use crate::cache::{CacheConfig, KvCache};
use crate::error::{EngineError, Result};
use crate::request::{Outcome, RequestSpec};
use crate::runtime::{Runtime, RuntimeConfig, RuntimeHandle};
use crate::workload::Workload;

pub use dynamic::DecodeEngine;
pub use model::{BatchEntry, DecodeModel};
pub use observe::LayerTensors;
pub use report::{LayerDump, StepReport};
pub use synthetic::SyntheticModel;

/// Everything an engine is built from: its KV hierarchy's config, and what the engine adds on
/// top (the synthetic workload, the emulated model, the queue, launch graphs).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The KV hierarchy: geometry, mode, the hierarchy's config, the sizing length, its test
    /// hooks and the indexer's query precision.
    pub cache: CacheConfig,
    /// Seed of the synthetic workload.
    pub workload_seed: u64,
    /// Record a digest of every request's attention output per layer (for lossless checks).
    pub capture_digests: bool,
    /// Replay each step's launches of layers 1..L as one captured graph where the backend can
    /// (CUDA), instead of launching them one by one.
    pub launch_graphs: bool,
    /// Emulate the model's non-attention layers with GEMMs on random weights (held on the
    /// device beside, not inside, `cache.hisparse.device_kv_bytes`).
    pub emulated_model: Option<crate::emulated::EmulatedModel>,
    /// Most requests waiting for admission at once; `submit` refuses more
    /// ([`EngineError::QueueFull`]).
    pub max_queued: usize,
    /// A caller's request to stop, observed before each step, between admissions and inside a
    /// prompt's prefill.
    pub stop: crate::StopFlag,
}

/// The default bound of the waiting queue.
pub const DEFAULT_MAX_QUEUED: usize = 65_536;

impl EngineConfig {
    /// A config for `geometry` in `mode` with `device_kv_bytes` of device memory for the KV
    /// cache; defaults elsewhere (LRU, buffer of twice top-k, host = 8 x device).
    pub fn new(geometry: KvGeometry, mode: Mode, device_kv_bytes: u64) -> Self {
        Self::with_cache(CacheConfig::new(geometry, mode, device_kv_bytes))
    }

    /// A config of an engine over a cache of `cache`; the engine's own defaults elsewhere.
    pub fn with_cache(cache: CacheConfig) -> Self {
        Self {
            cache,
            workload_seed: 1,
            capture_digests: false,
            launch_graphs: true,
            emulated_model: None,
            max_queued: DEFAULT_MAX_QUEUED,
            stop: crate::StopFlag::never(),
        }
    }
}

/// The engine, driving model `D` (by default the synthetic workload with the emulated model).
/// See the crate documentation.
pub struct Engine<B: Backend, D = SyntheticModel<<B as hisparse_kernels::Kernels>::Memory>> {
    /// The memory hierarchy: tiers, admission, swap-in and prefetch state, backups.
    cache: KvCache<B>,
    scheduler: scheduler::Scheduler,
    runner: runner::StepRunner<B::Memory, D>,
    runtime: Arc<ArcSwap<Runtime>>,
    /// The backend's miss-fill form, given to runtime handles (they check a new policy against
    /// it before the step takes it up).
    miss_fill: hisparse_kernels::MissFill,
    last_policy: hisparse_policy::OnlinePolicy,
    step: u64,
    cfg: EngineConfig,
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Builds an engine of the synthetic workload (with the emulated model when the config
    /// has one): validates the config, plans the tiers from the byte budgets, and allocates
    /// them.
    pub fn new(backend: B, cfg: EngineConfig) -> Result<Self> {
        let (g, shape) = (&cfg.cache.geometry, cfg.emulated_model.as_ref());
        let model = SyntheticModel::new(&backend, g, cfg.workload_seed, shape, cfg.stop.clone())?;
        Self::with_model(backend, cfg, model)
    }

    /// The workload (to inspect or replace its locality before requests arrive).
    pub fn workload_mut(&mut self) -> &mut Workload {
        self.runner.model.workload_mut()
    }
}

impl<B: Backend, D: DecodeModel<B>> Engine<B, D>
where
    B::Memory: Clone,
{
    /// Builds an engine driving `model`: validates the config, plans the tiers from the byte
    /// budgets, and allocates them.
    pub fn with_model(backend: B, cfg: EngineConfig, model: D) -> Result<Self> {
        // The policy is made once, by the cache, from the config's description of it.
        let cache = KvCache::with_named_policies(backend, cfg.cache.clone())?;
        let runtime = Runtime {
            config: RuntimeConfig { eviction: cfg.cache.hisparse.eviction.clone(), max_running: 0 },
            policy: cache.policy().clone(),
        };
        let runner = runner::StepRunner::new(model, cfg.capture_digests, cfg.launch_graphs);
        Ok(Self {
            last_policy: runtime.policy.clone(),
            runtime: Arc::new(ArcSwap::from_pointee(runtime)),
            miss_fill: cache.backend().miss_fill(),
            scheduler: scheduler::Scheduler::new(cfg.max_queued),
            runner,
            cache,
            step: 0,
            cfg,
        })
    }

    /// The config.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The model the engine drives.
    pub fn model(&self) -> &D {
        &self.runner.model
    }

    /// The model the engine drives, to change between steps.
    pub fn model_mut(&mut self) -> &mut D {
        &mut self.runner.model
    }

    /// A handle to swap the eviction policy and batch cap between steps, from any thread.
    pub fn runtime(&self) -> RuntimeHandle {
        RuntimeHandle { cell: Arc::clone(&self.runtime), miss_fill: self.miss_fill }
    }

    /// Capacities of the tiers (what a request may at most hold).
    pub fn capacity(&self) -> Resources {
        self.cache.capacity()
    }

    /// Records every selection of every later step into a trace written to `out`, with the
    /// selected positions' scores and the `score_margin` best unselected ones' when it is not 0
    /// (a scored trace, what `next-step` prefetch reads; at most
    /// [`hisparse_policy::trace::MAX_TOP_K`]).
    pub fn record_trace(&mut self, out: Box<dyn Write + Send>, score_margin: usize) -> Result<()> {
        let most = hisparse_policy::trace::MAX_TOP_K as usize;
        if score_margin > most {
            return Err(EngineError::Input {
                field: "score_margin".into(),
                value: score_margin.to_string(),
                reason: format!("a trace keeps at most {most} candidates"),
            });
        }
        let g = &self.cfg.cache.geometry;
        let header = TraceHeader {
            has_scores: score_margin > 0,
            score_margin: score_margin as u32,
            top_k: g.top_k as u32,
            layers: g.layers as u32,
            row_bytes: self.cache.layouts().0.row_bytes() as u32,
            index_source: if (0..g.layers).all(|l| g.index_source(l) == l) {
                Vec::new()
            } else {
                (0..g.layers).map(|l| g.index_source(l) as u32).collect()
            },
        };
        self.runner.trace = Some((TraceWriter::new(out, header)?, score_margin));
        Ok(())
    }

    /// Ends the trace (writes its end marker).
    pub fn finish_trace(&mut self) -> Result<()> {
        if let Some((t, _)) = self.runner.trace.take() {
            t.finish()?;
        }
        Ok(())
    }

    /// Captures every input and output of the next step that decodes anything
    /// ([`StepReport::dump`]).
    pub fn capture_next_step(&mut self) {
        self.runner.capture_next = true;
    }

    /// Queues a request arriving now; it is admitted at the start of a later step, in arrival
    /// order. A full queue ([`EngineConfig::max_queued`]) refuses it, holding nothing.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<()> {
        self.scheduler.submit(spec, Instant::now())
    }

    /// [`Engine::submit`] for a request that arrived at `arrived` (its time to first decode
    /// counts from then).
    pub fn submit_arrived(&mut self, spec: RequestSpec, arrived: Instant) -> Result<()> {
        self.scheduler.submit(spec, arrived)
    }

    /// Ends request `id` between steps, waiting or running: everything it holds is returned
    /// and its outcome is [`Outcome::Aborted`]. Fails naming the id when it is neither.
    pub fn abort(&mut self, id: RequestId) -> Result<()> {
        let Self { scheduler, cache, runner, .. } = self;
        let found = scheduler.abort(id, |id| {
            runner.model.finish(id);
            cache.abort(id).map(|_| ())
        })?;
        if found {
            Ok(())
        } else {
            Err(EngineError::Request { id: id.0, reason: "neither waiting nor running".into() })
        }
    }

    /// Requests waiting, decoding, and done (finished, rejected or aborted).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.scheduler.queued(), self.scheduler.running.len(), self.scheduler.outcomes.len())
    }

    /// Whether nothing is queued or running.
    pub fn is_idle(&self) -> bool {
        self.scheduler.queued() == 0 && self.scheduler.running.is_empty()
    }

    /// What became of every request that left.
    pub fn outcomes(&self) -> &[(RequestId, Outcome)] {
        &self.scheduler.outcomes
    }

    /// Device bytes the tier's pools hold in all (what the budget bought, in whole pages and
    /// hot buffers).
    pub fn device_tier_bytes(&self) -> usize {
        self.cache.device_tier_bytes()
    }

    /// Device bytes held by live requests.
    pub fn device_bytes_in_use(&self) -> usize {
        self.cache.device_bytes_in_use()
    }

    /// Host bytes held by live requests.
    pub fn host_bytes_in_use(&self) -> usize {
        self.cache.host_bytes_in_use()
    }

    /// The memory hierarchy the engine runs on.
    pub fn cache(&self) -> &KvCache<B> {
        &self.cache
    }

    /// Reads the host tier's copy of request `id`'s row at (`layer`, `position`): see
    /// [`KvCache::read_host_row`].
    pub fn read_host_row(&mut self, id: RequestId, layer: usize, position: usize, out: &mut [u8]) -> Result<()> {
        self.cache.read_host_row(id, layer, position, out)
    }

    /// Runs the emulated model's collectives with the other ranks of a data-parallel
    /// deployment (one engine per GPU, `crate::ranks`) through `exchange`, from the next step
    /// on. Refused without an emulated model (`emulated_model` in the config).
    pub fn set_exchange(&mut self, exchange: crate::emulated::RankExchange<B::Memory>) -> Result<()> {
        self.runner.model.set_exchange(exchange)
    }

    /// Bytes this engine's rank sent and received in collectives so far (0 without an exchange).
    pub fn exchanged_bytes(&self) -> u64 {
        self.runner.model.exchanged_bytes()
    }

    /// Checks that every pool holds exactly what live requests hold (no leak).
    pub fn check_pools(&self) -> Result<()> {
        self.cache.check()?;
        let admitted = self.cache.request_ids().count();
        if admitted != self.scheduler.running.len() {
            return Err(EngineError::Config {
                field: "pools",
                value: format!("{admitted} requests"),
                reason: format!("held in the cache while {} run", self.scheduler.running.len()),
            });
        }
        Ok(())
    }
}
