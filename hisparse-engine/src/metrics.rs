//! Metrics of every decode step and of a whole run: throughput, time per stage, hits and misses,
//! bytes moved per tier, bytes in use, and the request counts.

use hisparse_policy::SwapCounts;
use serde::{Deserialize, Serialize};

/// Seconds spent per stage of a decode step (summed over layers). Kernel stages time the
/// backend call alone; `bookkeeping` is everything else the engine does (batch assembly,
/// uploads of per-step metadata, scheduling, retiring, metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTimes {
    /// Generating the synthetic model's new rows, keys and queries (the emulated model).
    pub workload: f64,
    /// Writing the new token's KV row and index key into the device tier.
    pub append: f64,
    /// Lightning indexer kernel.
    pub indexer: f64,
    /// Top-k kernel.
    pub top_k: f64,
    /// Swap-in: decisions and host → device copies (hisparse), row lookups (resident).
    pub swap_in: f64,
    /// Sparse attention kernel.
    pub attention: f64,
    /// The emulated model's non-attention GEMMs (when emulated).
    pub model: f64,
    /// The collectives of a data-parallel deployment around those GEMMs (`--gpus`).
    #[serde(default)]
    pub exchange: f64,
    /// Layers replayed as one captured launch graph (every kernel stage of them; the stages
    /// above then count the layers launched one by one).
    pub graph: f64,
    /// Backup: queueing copies, and waiting for earlier ones before a slot is reused.
    pub backup: f64,
    /// Scheduling and bookkeeping outside kernels, copies and the workload.
    pub bookkeeping: f64,
    /// Admission and prompt KV written into the tiers (not part of decode throughput).
    pub admission: f64,
}

impl StageTimes {
    /// Adds `secs` to the kernel stage `stage`.
    pub fn add_kernel(&mut self, stage: hisparse_kernels::KernelStage, secs: f64) {
        use hisparse_kernels::KernelStage as K;
        match stage {
            K::Indexer => self.indexer += secs,
            K::TopK => self.top_k += secs,
            K::SwapIn => self.swap_in += secs,
            K::Attention => self.attention += secs,
            K::Graph => self.graph += secs,
            K::Model => self.model += secs,
            K::Exchange => self.exchange += secs,
        }
    }

    /// Adds `o` stage by stage.
    pub fn add(&mut self, o: &StageTimes) {
        self.workload += o.workload;
        self.bookkeeping += o.bookkeeping;
        self.append += o.append;
        self.indexer += o.indexer;
        self.top_k += o.top_k;
        self.swap_in += o.swap_in;
        self.attention += o.attention;
        self.graph += o.graph;
        self.model += o.model;
        self.exchange += o.exchange;
        self.backup += o.backup;
        self.admission += o.admission;
    }

    /// Decode time: every stage but admission.
    pub fn decode(&self) -> f64 {
        self.workload
            + self.append
            + self.indexer
            + self.top_k
            + self.swap_in
            + self.attention
            + self.graph
            + self.model
            + self.exchange
            + self.backup
            + self.bookkeeping
    }
}

/// One decode step.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Engine step number (from 1).
    pub step: u64,
    /// Wall seconds of the decode (admission excluded).
    pub seconds: f64,
    /// Tokens generated (one per running request).
    pub tokens: usize,
    /// Time per stage.
    pub stages: StageTimes,
    /// What the swap-in counted (fields at the top level of the JSON).
    #[serde(flatten)]
    pub swap: SwapCounts,
    /// Bytes copied device → host by backup.
    pub bytes_d2h: u64,
    /// Launch graphs captured this step.
    pub graph_captures: u64,
    /// Launch graphs replayed this step (layers 1..L as one graph).
    pub graph_replays: u64,
    /// This step's inputs were generated while the previous step's kernels ran.
    pub inputs_ahead: bool,
    /// Prompt bytes written into the host tier at admission.
    pub bytes_prompt_host: u64,
    /// Prompt bytes written into the device tier at admission (KV, keys, preloaded slots).
    pub bytes_prompt_device: u64,
    /// Device bytes held by live requests after the step.
    pub device_bytes_in_use: u64,
    /// Host bytes held by live requests after the step.
    pub host_bytes_in_use: u64,
    /// Requests decoded this step.
    pub running: usize,
    /// Requests waiting for capacity.
    pub queued: usize,
    /// Requests admitted this step.
    pub admitted: usize,
    /// Requests rejected so far.
    pub rejected: usize,
    /// Requests finished so far.
    pub finished: usize,
    /// Hybrid placement's demotions, promotions and moved pages in this step (admission
    /// included); left out of the JSON where nothing moved.
    #[serde(skip_serializing_if = "PlacementCounters::is_zero")]
    pub placement: PlacementCounters,
}

impl StepMetrics {
    /// Adds what a cache's decode step counted and timed ([`crate::DecodeStep::end`]) to this
    /// engine step's metrics.
    pub(crate) fn absorb(&mut self, o: &StepMetrics) {
        self.stages.add(&o.stages);
        self.swap += o.swap;
        self.bytes_d2h += o.bytes_d2h;
        self.graph_captures += o.graph_captures;
        self.graph_replays += o.graph_replays;
    }
}

/// A whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunSummary {
    /// Decode steps.
    pub steps: u64,
    /// Decode seconds (admission excluded).
    pub seconds: f64,
    /// Tokens generated.
    pub tokens: u64,
    /// `tokens / seconds`.
    pub tokens_per_s: f64,
    /// Time per stage.
    pub stages: StageTimes,
    /// What the swap-in counted (fields at the top level of the JSON).
    #[serde(flatten)]
    pub swap: SwapCounts,
    /// `misses / (hits + misses)`.
    pub miss_ratio: f64,
    /// Bytes device → host.
    pub bytes_d2h: u64,
    /// Most requests decoded in one step.
    pub max_running: usize,
    /// Peak device bytes in use.
    pub peak_device_bytes: u64,
    /// Peak host bytes in use.
    pub peak_host_bytes: u64,
    /// Requests rejected.
    pub rejected: usize,
    /// Requests finished.
    pub finished: usize,
    /// Hybrid placement's copies over the run (left out of the JSON where nothing moved).
    #[serde(skip_serializing_if = "PlacementCounters::is_zero")]
    pub placement: PlacementCounters,
}

impl RunSummary {
    /// Adds one step.
    pub fn add(&mut self, s: &StepMetrics) {
        self.steps += 1;
        self.seconds += s.seconds;
        self.tokens += s.tokens as u64;
        self.tokens_per_s = if self.seconds > 0.0 { self.tokens as f64 / self.seconds } else { 0.0 };
        self.stages.add(&s.stages);
        self.swap += s.swap;
        self.miss_ratio = self.swap.miss_ratio();
        self.bytes_d2h += s.bytes_d2h;
        self.max_running = self.max_running.max(s.running);
        self.peak_device_bytes = self.peak_device_bytes.max(s.device_bytes_in_use);
        self.peak_host_bytes = self.peak_host_bytes.max(s.host_bytes_in_use);
        self.rejected = s.rejected;
        self.finished = s.finished;
        self.placement += s.placement;
    }
}

/// What hybrid placement moved (so far, in a cache; in one step, in its metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementCounters {
    /// Requests moved from device pages to a hot buffer and the host tier.
    pub demotions: u64,
    /// Requests moved from the host tier back to device pages.
    pub promotions: u64,
    /// Pages moved within the device to free a seat's rows.
    pub moved_pages: u64,
    /// Bytes copied device → host by demotions.
    pub bytes_demoted: u64,
    /// Bytes copied host → device by promotions.
    pub bytes_promoted: u64,
    /// Bytes copied device → device by moved pages.
    pub bytes_moved: u64,
}

impl PlacementCounters {
    /// Whether nothing moved (every mode but hybrid, and hybrid while the device has room).
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// What moved since `earlier` (a snapshot of the same cache's counters).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            demotions: self.demotions - earlier.demotions,
            promotions: self.promotions - earlier.promotions,
            moved_pages: self.moved_pages - earlier.moved_pages,
            bytes_demoted: self.bytes_demoted - earlier.bytes_demoted,
            bytes_promoted: self.bytes_promoted - earlier.bytes_promoted,
            bytes_moved: self.bytes_moved - earlier.bytes_moved,
        }
    }
}

impl std::ops::AddAssign for PlacementCounters {
    fn add_assign(&mut self, o: Self) {
        self.demotions += o.demotions;
        self.promotions += o.promotions;
        self.moved_pages += o.moved_pages;
        self.bytes_demoted += o.bytes_demoted;
        self.bytes_promoted += o.bytes_promoted;
        self.bytes_moved += o.bytes_moved;
    }
}
