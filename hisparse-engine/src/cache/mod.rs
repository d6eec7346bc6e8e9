//! The KV hierarchy as a library: [`KvCache`] owns the tiers (device pools and hot buffers, the
//! host tier), admission, the backend's swap-in (every request's slot tables, policy records
//! and prefetch state) and its backup of new rows; a caller's model loop admits requests with
//! their prompt's rows ([`KvCache::admit`]), runs decode steps layer by layer through a
//! [`DecodeStep`] handing over its own tensors in the backend's memory, and frees or aborts
//! requests between steps. The backend, the eviction policy and the prefetcher are the caller's
//! choice. There is one step path for every backend: selections, scores, row locations and new
//! rows stay in the backend's memory, and the host only plans. `admit.rs` admits and frees;
//! `step.rs` and `layer.rs` run a step; `graph.rs` replays a step's layers as one captured
//! launch sequence.
//!
//! Invariant: between steps, every registered request holds exactly its reservation in the
//! admission control and its pages in the tiers; [`KvCache::check`] verifies it.
//! Invariant: no reserved slot is rewritten and no host row read before the backup of the token
//! it held has landed ([`hisparse_kernels::RowBackup::fence`] before a layer's new rows, `join`
//! at a step's end); a request's pages are freed only after all its backups landed.

mod admit;
mod graph;
mod layer;
mod placement;
mod step;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hisparse_kernels::{Backend, DeviceSwapIn, DeviceSwapInConfig, RowBackup, RowBackupConfig};
use hisparse_memory::{
    Admission, AdmissionControl, CapacityPlan, DeviceTier, HostTier, HostTierConfig, IndexKeyLayout, KvGeometry,
    KvRowLayout, Mode, RequestId, Resources,
};
use hisparse_policy::prefetch::Prefetcher;
use hisparse_policy::{HiSparseConfig, OnlinePolicy};

use crate::error::{EngineError, Result};

pub use admit::{Prompt, Rows};
pub use graph::Captured;
pub use placement::DemotionOrder;
pub use step::{DecodeStep, LayerInputs, LayerView};

/// What a cache is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Model geometry.
    pub geometry: KvGeometry,
    /// Serving mode.
    pub mode: Mode,
    /// Buffer size, page size, byte budgets, host-tier file, the eviction policy and the
    /// prefetcher ([`KvCache::with_named_policies`] makes these two from it; [`KvCache::new`]
    /// takes them made, and a policy made from an [`hisparse_policy::Eviction`] replaces
    /// `hisparse.eviction`).
    pub hisparse: HiSparseConfig,
    /// Request length the device split (hot buffers against index keys) is sized for
    /// (0: `hisparse.max_request_tokens`).
    pub typical_tokens: usize,
    /// Test hook: delay every backup copy by this much (on the backup's own stream or thread).
    pub backup_delay: Option<Duration>,
    /// Run prefetches in order on the backend's main stream instead of a transfer stream of
    /// their own (CUDA; the results are the same, only the overlap is lost).
    pub serial_prefetch: bool,
    /// Test hook: delay every transfer of prefetched rows by this much (CUDA).
    pub transfer_delay: Option<Duration>,
    /// The indexer's query precision (exact by default; `Fp8` is DeepSeek-V3.2's recipe).
    pub index_queries: hisparse_kernels::IndexerQueries,
    /// How the indexer scores positions: the lightning indexer for MLA geometries, the oracle
    /// (sum of the heads' attention weights, no always-kept positions) for GQA ones.
    pub index_score: hisparse_kernels::IndexScore,
    /// Hybrid placement: which requests on the device are demoted first.
    pub demotion: DemotionOrder,
}

impl CacheConfig {
    /// A config for `geometry` in `mode` with `device_kv_bytes` of device memory for the KV
    /// cache; defaults elsewhere (buffer of twice top-k, host = 8 x device).
    pub fn new(geometry: KvGeometry, mode: Mode, device_kv_bytes: u64) -> Self {
        let hisparse = HiSparseConfig { device_kv_bytes, ..HiSparseConfig::for_geometry(&geometry) };
        let index_score = match geometry.kv_heads() {
            None => hisparse_kernels::IndexScore::Lightning,
            Some(_) => hisparse_kernels::IndexScore::Oracle(hisparse_kernels::OracleScore::default()),
        };
        Self {
            index_score,
            geometry,
            mode,
            hisparse,
            typical_tokens: 0,
            backup_delay: None,
            serial_prefetch: false,
            transfer_delay: None,
            index_queries: hisparse_kernels::IndexerQueries::Exact,
            demotion: DemotionOrder::default(),
        }
    }

    /// Whether the device keeps index keys: not where every request attends to all its
    /// positions — resident mode with a top-k of at least `hisparse.max_request_tokens`, dense
    /// attention — where nothing is selected, so keys would only take room from KV rows. A
    /// cache without keys refuses any request longer than its top-k.
    pub fn keeps_index(&self) -> bool {
        !(self.mode == Mode::Resident && self.geometry.top_k >= self.hisparse.max_request_tokens)
    }

    /// This config sized for requests of `typical_tokens` and at most `longest_tokens`: the
    /// device split is planned for the typical length; a resident cache whose top-k holds the
    /// longest request takes requests up to that length and so attends densely, keeping no
    /// index keys ([`CacheConfig::keeps_index`]); any other keeps its `max_request_tokens`, at
    /// least the typical length.
    pub fn sized_for(mut self, typical_tokens: usize, longest_tokens: usize) -> Self {
        self.typical_tokens = typical_tokens;
        self.hisparse.max_request_tokens = if self.mode == Mode::Resident && self.geometry.top_k >= longest_tokens {
            longest_tokens
        } else {
            self.hisparse.max_request_tokens.max(typical_tokens)
        };
        self
    }

    /// The byte budgets and shapes the tiers are planned from: what [`KvCache::new`] allocates,
    /// and what one request takes of it ([`CapacityPlan::request_bytes`]).
    pub fn capacity_plan(&self) -> Result<CapacityPlan> {
        let g = &self.geometry;
        Ok(CapacityPlan {
            mode: self.mode,
            layers: g.layers,
            index_layers: g.index_layers(),
            kv_row: g.kv_row()?,
            index_key: g.index_key()?,
            keeps_index: self.keeps_index(),
            page_tokens: self.hisparse.page_tokens,
            device_buffer_size: self.hisparse.device_buffer_size,
            device_bytes: usize::try_from(self.hisparse.device_kv_bytes).unwrap_or(usize::MAX),
            host_bytes: usize::try_from(self.hisparse.host_bytes()).unwrap_or(usize::MAX),
            typical_tokens: if self.typical_tokens > 0 {
                self.typical_tokens
            } else {
                self.hisparse.max_request_tokens
            },
        })
    }
}

/// One admitted request's state.
pub(crate) struct CachedRequest {
    /// Positions with KV (the next token is at `seq_len`).
    pub seq_len: usize,
    /// Positions reserved in the tiers (`seq_len` may grow up to it).
    pub reserved: usize,
    /// Its reservation in the admission control.
    pub need: Resources,
    /// Decode steps done.
    pub steps: u32,
    /// A step that included it did not end: its newest position is incomplete.
    pub broken: bool,
    /// Its admission's number (admissions counted from 0): the order of arrival in the cache.
    pub admitted: u64,
}

/// The KV hierarchy of one device: see the module documentation.
pub struct KvCache<B: Backend> {
    pub(crate) backend: B,
    pub(crate) cfg: CacheConfig,
    pub(crate) kv_row: KvRowLayout,
    pub(crate) key: IndexKeyLayout,
    pub(crate) device: DeviceTier<B::Memory>,
    pub(crate) host: Option<HostTier>,
    /// The backend's swap-in (hisparse mode).
    pub(crate) swap: Option<B::SwapIn>,
    /// The backend's backup of new rows (hisparse mode).
    pub(crate) backup: Option<B::Backup>,
    pub(crate) admission: AdmissionControl,
    pub(crate) policy: OnlinePolicy,
    pub(crate) prefetcher: Arc<dyn Prefetcher>,
    pub(crate) requests: BTreeMap<RequestId, CachedRequest>,
    /// Buffers a step reuses from the last one.
    pub(crate) scratch: step::StepScratch<B::Memory>,
    /// Admissions so far (the next request's `admitted`).
    pub(crate) admissions: u64,
    /// Hybrid placement's copies so far.
    pub(crate) placement: crate::metrics::PlacementCounters,
}

impl<B: Backend> KvCache<B> {
    /// The config: `hisparse.eviction` describes the policy in use wherever it was made from a
    /// description (a policy object the caller made itself is [`KvCache::policy`] alone).
    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The prefetcher.
    pub fn prefetcher(&self) -> &Arc<dyn Prefetcher> {
        &self.prefetcher
    }

    /// The row layouts: KV rows and index keys.
    pub fn layouts(&self) -> (KvRowLayout, IndexKeyLayout) {
        (self.kv_row, self.key)
    }
}

impl<B: Backend> KvCache<B>
where
    B::Memory: Clone,
{
    /// Plans the tiers from the config's byte budgets and allocates them; `policy` evicts and
    /// `prefetcher` nominates (hisparse mode).
    pub fn new(
        backend: B,
        mut cfg: CacheConfig,
        policy: OnlinePolicy,
        prefetcher: Arc<dyn Prefetcher>,
    ) -> Result<Self> {
        if let Some(e) = policy.eviction() {
            cfg.hisparse.eviction = e.clone();
        }
        let g = &cfg.geometry;
        cfg.hisparse.validate_sizes(g)?;
        backend.miss_fill().check_policy(&policy)?;
        if cfg.hisparse.device_kv_bytes == 0 {
            return Err(EngineError::Config {
                field: "device_kv_bytes",
                value: "0".into(),
                reason: "the cache needs a device budget for the KV rows and index keys".into(),
            });
        }
        if let hisparse_kernels::IndexScore::Oracle(o) = cfg.index_score
            && o.sink.saturating_add(o.window).saturating_add(1) > g.top_k
        {
            return Err(EngineError::Config {
                field: "index_score",
                value: format!("sink {} + window {}", o.sink, o.window),
                reason: format!("always-kept positions and the newest token must fit in top_k {}", g.top_k),
            });
        }
        let plan = cfg.capacity_plan()?;
        let (kv_row, key) = (plan.kv_row, plan.index_key);
        let tier = plan.device_tier()?;
        // Invariant relied on by every `as u32`/`as i32` of a row index in a step: the device
        // pools' rows fit an i32 (the kernels' row locations).
        let rows = [
            tier.kv_pages.checked_mul(tier.page_tokens),
            tier.index_pages.checked_mul(tier.page_tokens),
            (tier.device_buffer_size < i32::MAX as usize)
                .then(|| hisparse_memory::device_tier::hot_buffer_rows_of(tier.device_buffer_size))
                .and_then(|rows| tier.seats.checked_mul(rows)),
            // Hybrid: rows of either kind over the shared pool's bytes.
            match tier.shared_pool {
                true => tier.shared_pool_shape()?.bytes().map(|b| b / key.row_bytes().min(kv_row.row_bytes()).max(1)),
                false => Some(0),
            },
        ];
        if rows.iter().any(|r| r.is_none_or(|r| r > i32::MAX as usize)) {
            return Err(EngineError::Config {
                field: "device_kv_bytes",
                value: cfg.hisparse.device_kv_bytes.to_string(),
                reason: "holds more than 2^31 - 1 rows in one pool (the kernels' row index)".into(),
            });
        }
        let device = DeviceTier::new(backend.memory().clone(), tier)?;
        let (host, swap, backup) = match cfg.mode {
            Mode::Resident => (None, None, None),
            Mode::HiSparse | Mode::Hybrid => {
                let mut host = HostTier::new(&HostTierConfig {
                    bytes: plan.host_bytes,
                    layers: g.layers,
                    row_bytes: kv_row.row_bytes(),
                    page_tokens: cfg.hisparse.page_tokens,
                    file: cfg.hisparse.host_tier_path.as_ref().map(|p| hisparse_memory::HostTierFile {
                        path: p.clone(),
                        overwrite: cfg.hisparse.host_tier_overwrite,
                        keep: cfg.hisparse.host_tier_keep,
                    }),
                })?;
                let dcfg = DeviceSwapInConfig {
                    geometry: g.clone(),
                    policy: policy.clone(),
                    prefetcher: Arc::clone(&prefetcher),
                    prefetch_budget: cfg.hisparse.prefetch.budget().unwrap_or(0),
                    seats: device.config().seats,
                    device_buffer_size: cfg.hisparse.device_buffer_size,
                    block_size: cfg.hisparse.swap_in_block_size,
                    max_tokens: cfg.hisparse.max_request_tokens,
                    serial_prefetch: cfg.serial_prefetch,
                    transfer_delay: cfg.transfer_delay,
                };
                // The attention's miss fill reads every request of a batch as the swap-in's:
                // hybrid batches also hold requests read by position.
                if cfg.mode == Mode::Hybrid && backend.miss_fill().fill_max_batch() > 0 {
                    return Err(EngineError::Config {
                        field: "miss_fill",
                        value: format!("{:?}", backend.miss_fill().mode()).to_lowercase(),
                        reason: "hybrid placement reads rows by position beside the hot buffers: choose the \
                                 swap-in's own miss fill (swap-in)"
                            .into(),
                    });
                }
                let swap = backend.device_swap_in(&dcfg, &mut host)?;
                let backup =
                    backend.row_backup(&RowBackupConfig { layers: g.layers, delay: cfg.backup_delay }, &mut host)?;
                (Some(host), Some(swap), Some(backup))
            }
        };
        let mut capacity = plan.resources()?;
        if let Some(h) = &host {
            capacity.host_pages = h.total_pages();
        }
        let scratch = step::StepScratch::new(backend.memory())?;
        Ok(Self {
            backend,
            kv_row,
            key,
            device,
            host,
            swap,
            backup,
            admission: AdmissionControl::new(capacity),
            policy,
            prefetcher,
            requests: BTreeMap::new(),
            scratch,
            cfg,
            admissions: 0,
            placement: crate::metrics::PlacementCounters::default(),
        })
    }

    /// [`KvCache::new`] with the policy and prefetcher `cfg.hisparse` describes (`eviction`,
    /// `prefetch`), each made once.
    pub fn with_named_policies(backend: B, cfg: CacheConfig) -> Result<Self> {
        let h = &cfg.hisparse;
        let (policy, prefetcher) = (h.online_policy()?, h.prefetch.make());
        Self::new(backend, cfg, policy, prefetcher)
    }

    /// The eviction policy.
    pub fn policy(&self) -> &OnlinePolicy {
        &self.policy
    }

    /// Replaces the eviction policy between steps: every buffer's records are rebuilt from its
    /// slots' current contents.
    /// Refused, keeping the policy in use, where the backend's miss-fill cannot run it.
    pub fn set_policy(&mut self, policy: OnlinePolicy) -> Result<()> {
        self.backend.miss_fill().check_policy(&policy)?;
        if let Some(s) = self.swap.as_mut() {
            s.set_policy(policy.clone())?;
        }
        if let Some(e) = policy.eviction() {
            self.cfg.hisparse.eviction = e.clone();
        }
        self.policy = policy;
        Ok(())
    }

    /// What a request of `tokens` positions in all reserves in this cache's tiers.
    pub(crate) fn need(&self, tokens: usize) -> Resources {
        Resources::need(self.cfg.mode, tokens, self.cfg.hisparse.page_tokens, self.cfg.keeps_index())
    }

    /// What the tiers hold in all.
    pub fn capacity(&self) -> Resources {
        self.admission.capacity()
    }

    /// What admitted requests hold now.
    pub fn reserved(&self) -> Resources {
        self.admission.reserved()
    }

    /// Whether a request of `tokens` positions in all (prompt and output) would be admitted
    /// now, would wait for others to leave, or can never fit; reserves nothing.
    pub fn decide(&self, tokens: usize) -> Admission {
        self.admission.decide(&self.need(tokens))
    }

    /// Admitted requests, in id order.
    pub fn request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.requests.keys().copied()
    }

    /// Positions with KV of request `id` (the next token is at this position).
    pub fn seq_len(&self, id: RequestId) -> Result<usize> {
        Ok(self.request(id)?.seq_len)
    }

    /// Reads the host tier's copy of request `id`'s row at (`layer`, `position`) into `out`
    /// (one row's bytes), after waiting for every backup in flight: between steps, the row the
    /// device wrote. Refused in resident mode (no host tier) and for a position the request
    /// does not hold.
    pub fn read_host_row(&mut self, id: RequestId, layer: usize, position: usize, out: &mut [u8]) -> Result<()> {
        let seq_len = self.request(id)?.seq_len;
        if position >= seq_len {
            return Err(EngineError::Input {
                field: "position".into(),
                value: position.to_string(),
                reason: format!("request {} holds {seq_len} positions", id.0),
            });
        }
        let (Some(host), Some(backup)) = (self.host.as_ref(), self.backup.as_mut()) else {
            return Err(EngineError::Config {
                field: "mode",
                value: self.cfg.mode.to_string(),
                reason: "resident mode keeps no host tier".into(),
            });
        };
        backup.wait_all()?;
        Ok(host.read_row(id, layer, position, out)?)
    }

    pub(crate) fn request(&self, id: RequestId) -> Result<&CachedRequest> {
        self.requests.get(&id).ok_or_else(|| EngineError::Request { id: id.0, reason: "not admitted".into() })
    }

    /// Device bytes of the tier's pools in all.
    pub fn device_tier_bytes(&self) -> usize {
        self.device.config().bytes()
    }

    /// Device bytes held by admitted requests.
    pub fn device_bytes_in_use(&self) -> usize {
        self.device.bytes_in_use()
    }

    /// Host bytes held by admitted requests.
    pub fn host_bytes_in_use(&self) -> usize {
        self.host.as_ref().map_or(0, HostTier::bytes_in_use)
    }

    /// Checks that every pool holds exactly what admitted requests hold (no leak), and in
    /// hybrid placement that each request holds pages or a seat, one of the two.
    pub fn check(&self) -> Result<()> {
        self.device.check()?;
        if self.cfg.mode == Mode::Hybrid {
            for &id in self.requests.keys() {
                if self.device.holds_pages(id)? == self.device.seat(id).is_ok() {
                    return Err(EngineError::Config {
                        field: "placement",
                        value: id.to_string(),
                        reason: "a hybrid request holds its KV pages or a seat, one of the two".into(),
                    });
                }
            }
        }
        if let Some(h) = &self.host {
            h.check()?;
        }
        let mut sum = Resources::default();
        for r in self.requests.values() {
            sum.kv_pages += r.need.kv_pages;
            sum.index_pages += r.need.index_pages;
            sum.seats += r.need.seats;
            sum.host_pages += r.need.host_pages;
        }
        let leaked = self.admission.reserved() != sum
            || (self.requests.is_empty() && (self.device.bytes_in_use() != 0 || self.host_bytes_in_use() != 0));
        if leaked || self.device.requests() != self.requests.len() {
            return Err(EngineError::Config {
                field: "pools",
                value: format!("{:?}", self.admission.reserved()),
                reason: format!("held beyond what {} admitted requests reserve ({sum:?})", self.requests.len()),
            });
        }
        Ok(())
    }
}
