//! The engine: serves many decode requests at once with continuous batching, in the resident
//! or the hisparse mode, on any [`Backend`]. This module holds its state and set-up;
//! `admit.rs` admits requests and writes their prompts; `step.rs` runs one decode step.

mod admit;
mod dynamic;
mod layer;
mod layer_device;
mod layer_graph;
mod layer_inputs;
mod step;
mod step_inputs;

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hisparse_kernels::{Backend, DeviceSwapInConfig};
use hisparse_memory::{KvGeometry, Mode, RequestId, Resources};
use hisparse_policy::prefetch::make_prefetcher;
use hisparse_policy::trace::{TraceHeader, TraceWriter};
use hisparse_policy::{EvictionPolicy, HiSparseConfig};

use crate::cache::{CacheConfig, KvCache};
use crate::error::{EngineError, Result};
use crate::request::{Outcome, RequestSpec};
use crate::runtime::{Runtime, RuntimeConfig, RuntimeHandle};
use crate::workload::{RequestDrift, Workload};

pub use dynamic::DecodeEngine;
pub use step::{LayerDump, StepReport};

/// Everything an engine is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Model geometry.
    pub geometry: KvGeometry,
    /// Serving mode.
    pub mode: Mode,
    /// The hierarchy's configuration (buffer size, budgets, policy, page size, host file).
    pub hisparse: HiSparseConfig,
    /// Seed of the synthetic workload.
    pub workload_seed: u64,
    /// Request length the device split (hot buffers against index keys) is sized for
    /// (0: `hisparse.max_request_tokens`).
    pub typical_tokens: usize,
    /// Record a digest of every request's attention output per layer (for lossless checks).
    pub capture_digests: bool,
    /// Test hook: delay every backup copy by this much.
    pub backup_delay: Option<Duration>,
    /// Replay each step's launches of layers 1..L as one captured graph where the backend can
    /// (CUDA), instead of launching them one by one.
    pub launch_graphs: bool,
    /// Emulate the model's non-attention layers with GEMMs on random weights (held on the
    /// device beside, not inside, `hisparse.device_kv_bytes`).
    pub model: Option<crate::model::ModelShape>,
    /// Most requests waiting for admission at once; `submit` refuses more
    /// ([`EngineError::QueueFull`]).
    pub max_queued: usize,
}

/// The default bound of the waiting queue.
pub const DEFAULT_MAX_QUEUED: usize = 65_536;

impl EngineConfig {
    /// A config for `geometry` in `mode` with `device_kv_bytes` of device memory for the KV
    /// cache; defaults elsewhere (LRU, buffer of twice top-k, host = 8 x device).
    pub fn new(geometry: KvGeometry, mode: Mode, device_kv_bytes: u64) -> Self {
        let hisparse = HiSparseConfig { device_kv_bytes, ..HiSparseConfig::for_geometry(&geometry) };
        Self {
            geometry,
            mode,
            hisparse,
            workload_seed: 1,
            typical_tokens: 0,
            capture_digests: false,
            backup_delay: None,
            launch_graphs: true,
            model: None,
            max_queued: DEFAULT_MAX_QUEUED,
        }
    }
}

/// A request being decoded (its KV state is in the cache).
pub(crate) struct Running {
    pub spec: RequestSpec,
    /// Positions with KV so far (the next token is at `seq_len`): the prompt and the tokens
    /// generated.
    pub seq_len: usize,
    pub generated: usize,
    pub drift: RequestDrift,
    pub first_step: u64,
}

/// The engine. See the crate documentation.
pub struct Engine<B: Backend> {
    /// The memory hierarchy: tiers, admission, swap-in and prefetch state.
    cache: KvCache<B>,
    cfg: EngineConfig,
    runtime: Arc<ArcSwap<Runtime>>,
    last_policy: Arc<dyn EvictionPolicy>,
    workload: Workload,
    queue: VecDeque<RequestSpec>,
    running: Vec<Running>,
    outcomes: Vec<(RequestId, Outcome)>,
    seen: HashSet<RequestId>,
    step: u64,
    trace: Option<TraceWriter<Box<dyn Write + Send>>>,
    capture_next: bool,
    scratch: Option<step::StepBatch<B::Memory>>,
    /// The host path's per-layer input buffers.
    host_inputs: Option<layer::HostPathInputs<B::Memory>>,
    /// Selections stay on the device between kernels (`Backend::prefers_device_selection`).
    device_path: bool,
    /// A launch-graph capture failed: layers are launched one by one from now on.
    graphs_failed: bool,
    /// The backend's device swap-in (hisparse mode on the device path).
    dswap: Option<B::SwapIn>,
    /// The emulated model's non-attention layers.
    model: Option<crate::model::ModelEmulation<B::Memory>>,
}

impl<B: Backend> Engine<B>
where
    B::Memory: Clone,
{
    /// Builds an engine: validates the config, plans the tiers from the byte budgets, and
    /// allocates them.
    pub fn new(backend: B, cfg: EngineConfig) -> Result<Self> {
        let g = &cfg.geometry;
        let device_path = backend.prefers_device_selection();
        let runtime = Runtime::new(RuntimeConfig {
            eviction_policy: cfg.hisparse.eviction_policy.clone(),
            policy_seed: cfg.hisparse.policy_seed,
            policy_config: cfg.hisparse.policy_config.clone(),
            max_running: 0,
        })?;
        let prefetcher = make_prefetcher(&cfg.hisparse.prefetcher, &cfg.hisparse.prefetch())?;
        if device_path && cfg.mode == Mode::HiSparse && prefetcher.name() != "none" {
            return Err(EngineError::Config {
                field: "prefetcher",
                value: cfg.hisparse.prefetcher.clone(),
                reason: format!(
                    "the {} backend keeps selections on the device, where prefetch is not wired yet: use the CPU backend",
                    backend.name()
                ),
            });
        }
        let cache_cfg = CacheConfig {
            geometry: g.clone(),
            mode: cfg.mode,
            hisparse: cfg.hisparse.clone(),
            typical_tokens: cfg.typical_tokens,
            backup_delay: cfg.backup_delay,
        };
        let mut cache = KvCache::new(backend, cache_cfg, Arc::clone(&runtime.policy), prefetcher)?;
        let dswap = match (cfg.mode, device_path) {
            (Mode::HiSparse, true) => {
                let dcfg = DeviceSwapInConfig {
                    policy: Arc::clone(&runtime.policy),
                    seats: cache.device.config().seats,
                    layers: g.layers,
                    buffer_slots: cfg.hisparse.device_buffer_size,
                    block_size: cfg.hisparse.swap_in_block_size,
                    max_selected: g.top_k,
                    max_tokens: cfg.hisparse.max_request_tokens,
                };
                let KvCache { backend, host, .. } = &mut cache;
                let host = host.as_mut().ok_or_else(|| EngineError::Worker("no host tier".into()))?;
                let d = backend.device_swap_in(&dcfg, host)?;
                if d.is_none() {
                    return Err(EngineError::Config {
                        field: "backend",
                        value: backend.name().into(),
                        reason: "keeps selections on the device but has no device swap-in".into(),
                    });
                }
                d
            }
            _ => None,
        };
        let last_policy = Arc::clone(&runtime.policy);
        let workload = Workload::new(g, cfg.workload_seed);
        let model = match &cfg.model {
            Some(shape) if shape.layers != g.layers => {
                return Err(EngineError::Config {
                    field: "model.layers",
                    value: shape.layers.to_string(),
                    reason: format!("the geometry has {} layers", g.layers),
                });
            }
            Some(shape) => Some(crate::model::ModelEmulation::new(shape.clone(), &cache.backend)?),
            None => None,
        };
        Ok(Self {
            cache,
            runtime: Arc::new(ArcSwap::from_pointee(runtime)),
            last_policy,
            workload,
            queue: VecDeque::new(),
            running: Vec::new(),
            outcomes: Vec::new(),
            seen: HashSet::new(),
            step: 0,
            trace: None,
            capture_next: false,
            scratch: None,
            host_inputs: None,
            device_path,
            graphs_failed: false,
            dswap,
            model,
            cfg,
        })
    }

    /// The config.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The workload (to inspect or replace its locality before requests arrive).
    pub fn workload_mut(&mut self) -> &mut Workload {
        &mut self.workload
    }

    /// A handle to swap the eviction policy and batch cap between steps, from any thread.
    pub fn runtime(&self) -> RuntimeHandle {
        RuntimeHandle { cell: Arc::clone(&self.runtime) }
    }

    /// Capacities of the tiers (what a request may at most hold).
    pub fn capacity(&self) -> Resources {
        self.cache.capacity()
    }

    /// Records every selection of every later step into a trace written to `out`.
    pub fn record_trace(&mut self, out: Box<dyn Write + Send>) -> Result<()> {
        let g = &self.cfg.geometry;
        let header = TraceHeader {
            top_k: g.top_k as u32,
            layers: g.layers as u32,
            row_bytes: self.cache.kv_row.row_bytes() as u32,
            index_source: if (0..g.layers).all(|l| g.index_source(l) == l) {
                Vec::new()
            } else {
                (0..g.layers).map(|l| g.index_source(l) as u32).collect()
            },
            ..TraceHeader::default()
        };
        self.trace = Some(TraceWriter::new(out, header)?);
        Ok(())
    }

    /// Ends the trace (writes its end marker).
    pub fn finish_trace(&mut self) -> Result<()> {
        if let Some(t) = self.trace.take() {
            t.finish()?;
        }
        Ok(())
    }

    /// Captures every input and output of the next step that decodes anything
    /// ([`StepReport::dump`]).
    pub fn capture_next_step(&mut self) {
        self.capture_next = true;
    }

    /// Queues a request; it is admitted at the start of a later step, in arrival order. A full
    /// queue ([`EngineConfig::max_queued`]) refuses it, holding nothing.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<()> {
        if self.queue.len() >= self.cfg.max_queued {
            return Err(EngineError::QueueFull { capacity: self.cfg.max_queued });
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
        self.queue.push_back(spec);
        Ok(())
    }

    /// Requests waiting, decoding, and done (finished or rejected).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.queue.len(), self.running.len(), self.outcomes.len())
    }

    /// Whether nothing is queued or running.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    /// What became of every request that left.
    pub fn outcomes(&self) -> &[(RequestId, Outcome)] {
        &self.outcomes
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

    /// Checks that every pool holds exactly what live requests hold (no leak).
    pub fn check_pools(&self) -> Result<()> {
        self.cache.check()?;
        let admitted = self.cache.request_ids().count();
        if admitted != self.running.len() {
            return Err(EngineError::Config {
                field: "pools",
                value: format!("{admitted} requests"),
                reason: format!("held in the cache while {} run", self.running.len()),
            });
        }
        Ok(())
    }
}
