//! `hisparse sweep --gpus N`: one engine per GPU (a thread each; on the CPU backend, N CPU
//! engines), each with its slice of the host memory and its share of the requests (round robin,
//! `RankPlan`), and with an emulated model the ranks' collectives around every FFN (NCCL on CUDA,
//! the CPU twin otherwise). Every rank runs the same steps; a step of the deployment is its
//! slowest rank's step, its tokens and transfers the sum over the ranks.
//!
//! A rank that fails while the others wait in a collective cannot be waited for: the first
//! error ends the command (the process, and with it the other ranks' threads).

use std::sync::mpsc;

use hisparse_engine::StepMetrics;
use hisparse_kernels::{CpuRank, RankMember};
use hisparse_memory::{Mode, RequestId};
use indicatif::ProgressBar;

use super::common::EngineArgs;
use super::sweep_data::{Point, SweepArgs, SweepMode, Window, point};
use crate::error::{BenchError, Result};

/// What the ranks measured at one (context, mode): per level, per step, the deployment's step.
pub(super) struct RankRun {
    pub(super) steps: Vec<Vec<StepMetrics>>,
    pub(super) backend: &'static str,
    pub(super) device_tier_bytes: u64,
    /// Collective bytes per rank and step (0 without an emulated model).
    pub(super) exchanged_per_step: f64,
}

impl RankRun {
    /// The points of every level (windows after `a.warmup`) and the misses per request and layer
    /// of every step.
    pub(super) fn points(
        &self,
        a: &SweepArgs,
        context: usize,
        mode: SweepMode,
        levels: &[usize],
        layers: usize,
    ) -> (Vec<Point>, Vec<f64>) {
        let (mut points, mut per_step) = (Vec::new(), Vec::new());
        for (&n, level) in levels.iter().zip(&self.steps) {
            let mut windows = vec![Window::default(); a.windows];
            for (s, m) in level.iter().enumerate() {
                per_step.push(m.swap.misses as f64 / (m.running * layers).max(1) as f64);
                if s >= a.warmup {
                    windows[(s - a.warmup) / a.window].add(m);
                }
            }
            let mut p = point(context, n, mode, &windows);
            p.exchange_mb_per_step = self.exchanged_per_step / 1e6;
            points.push(p);
        }
        (points, per_step)
    }
}

/// One deployment step from its ranks' steps: the slowest rank's time and stages, the sums of
/// tokens, requests and transfers (`hisparse run --gpus` too).
pub(super) fn across_ranks(ranks: &[StepMetrics]) -> StepMetrics {
    let slowest = ranks.iter().max_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut m = slowest.cloned().unwrap_or_default();
    m.tokens = ranks.iter().map(|r| r.tokens).sum();
    m.running = ranks.iter().map(|r| r.running).sum();
    m.swap.misses = ranks.iter().map(|r| r.swap.misses).sum();
    m.swap.hits = ranks.iter().map(|r| r.swap.hits).sum();
    m.swap.bytes_h2d = ranks.iter().map(|r| r.swap.bytes_h2d).sum();
    m.swap.bytes_h2d_prefetch = ranks.iter().map(|r| r.swap.bytes_h2d_prefetch).sum();
    m.swap.prefetched = ranks.iter().map(|r| r.swap.prefetched).sum();
    m.swap.prefetch_useful = ranks.iter().map(|r| r.swap.prefetch_useful).sum();
    m.swap.prefetch_wasted = ranks.iter().map(|r| r.swap.prefetch_wasted).sum();
    m
}

/// The group tickets: NCCL on CUDA, the CPU twin otherwise; none without a model (nothing to
/// exchange).
pub(super) fn members(engine: &EngineArgs, ranks: usize) -> Result<Vec<Option<RankMember>>> {
    if engine.emulated_model()?.is_none() {
        return Ok((0..ranks).map(|_| None).collect());
    }
    if engine.uses_cuda() {
        return cuda_members(ranks);
    }
    Ok(CpuRank::group(ranks)?.into_iter().map(|r| Some(RankMember::Cpu(r))).collect())
}

#[cfg(feature = "cuda")]
fn cuda_members(ranks: usize) -> Result<Vec<Option<RankMember>>> {
    let id = hisparse_kernels::cuda::NcclId::new()?;
    Ok((0..ranks).map(|rank| Some(RankMember::Nccl { id, rank, ranks })).collect())
}

#[cfg(not(feature = "cuda"))]
fn cuda_members(ranks: usize) -> Result<Vec<Option<RankMember>>> {
    Err(BenchError::flag("gpus", ranks, "this build has no CUDA support (feature `cuda`)"))
}

/// Every rank's result from `rx`, in rank order; the first rank error (naming the rank) ends it.
pub(super) fn rank_results<R>(rx: &mpsc::Receiver<(usize, Result<R>)>, ranks: usize) -> Result<Vec<R>> {
    let mut per_rank: Vec<Option<R>> = (0..ranks).map(|_| None).collect();
    for _ in 0..ranks {
        let (rank, r) =
            rx.recv().map_err(|_| BenchError::flag("gpus", ranks, "a rank's thread ended without a result"))?;
        let slot = per_rank.get_mut(rank).ok_or_else(|| BenchError::flag("gpus", rank, "no such rank"))?;
        *slot = Some(r.map_err(|e| BenchError::Rank { rank, source: Box::new(e) })?);
    }
    Ok(per_rank.into_iter().flatten().collect())
}

/// What one rank measured: per level and step its metrics, its backend, its device tier bytes
/// and the bytes it exchanged.
type RankResult = (Vec<Vec<StepMetrics>>, &'static str, u64, u64);
type RankOut = (usize, Result<RankResult>);

/// Runs every rank through the levels at one (context, mode).
pub(super) fn measure(
    a: &SweepArgs,
    ranks: usize,
    mode: Mode,
    (context, life): (usize, usize),
    levels: &[usize],
    steps: usize,
    bar: &ProgressBar,
) -> Result<RankRun> {
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    let plan = a.engine.rank_plan(&g, &hs, ranks, context + life)?;
    let (tx, rx) = mpsc::channel::<RankOut>();
    for (rank, member) in members(&a.engine, ranks)?.into_iter().enumerate() {
        let (a, plan, levels, bar, tx) = (a.clone(), plan.clone(), levels.to_vec(), bar.clone(), tx.clone());
        std::thread::spawn(move || {
            let run = || -> Result<_> {
                let mut e = a.engine.rank_engine(mode, (context + life, context + life), "context", rank, &plan)?;
                if let Some(m) = member {
                    e.join_ranks(m)?;
                }
                let mut submitted = 0;
                let mut out = Vec::new();
                for &n in &levels {
                    // This rank's requests among the first n (round robin), submitted as the
                    // level grows: the rank runs exactly its share.
                    let mine: Vec<usize> = (submitted..n).filter(|i| i % plan.ranks == rank).collect();
                    for i in mine {
                        let spec = hisparse_engine::RequestSpec {
                            id: RequestId(i as u64),
                            prompt_tokens: context,
                            output_tokens: life,
                        };
                        e.submit(spec)?;
                    }
                    submitted = n;
                    let mut level = Vec::with_capacity(steps);
                    for _ in 0..steps {
                        let r = e.step()?;
                        bar.inc(r.metrics.running as u64);
                        level.push(r.metrics);
                    }
                    out.push(level);
                }
                Ok((out, e.backend_name(), e.device_tier_bytes() as u64, e.exchanged_bytes()))
            };
            // The receiver is gone only when the command already ended.
            let _ = tx.send((rank, run()));
        });
    }
    drop(tx);
    let per_rank = rank_results(&rx, ranks)?;
    let first = per_rank.first().ok_or_else(|| BenchError::flag("gpus", ranks, "no rank ran"))?;
    let steps_run = (levels.len() * steps).max(1) as f64;
    let run = RankRun {
        steps: (0..levels.len())
            .map(|l| {
                (0..steps)
                    .map(|s| across_ranks(&per_rank.iter().map(|r| r.0[l][s].clone()).collect::<Vec<_>>()))
                    .collect()
            })
            .collect(),
        backend: first.1,
        device_tier_bytes: first.2,
        exchanged_per_step: first.3 as f64 / steps_run,
    };
    Ok(run)
}
