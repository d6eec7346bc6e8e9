//! `hisparse run --gpus N`: one engine per GPU (a thread each; on the CPU backend, N CPU
//! engines), each with its slice of the host memory and its round-robin share of the requests
//! (arriving when they would have), decoded to the end. With an emulated model the ranks
//! exchange tokens around every FFN (NCCL on CUDA, the CPU twin otherwise), so they step
//! together: a [`StepVote`] before every step keeps a rank with nothing to decode stepping idly
//! while any other has work, and ends them all with the last. A step of the deployment is its
//! slowest rank's step, its tokens and transfers the sum over the ranks; latencies are every
//! rank's.
//!
//! A rank that fails while the others wait cannot be waited for: the first error ends the
//! command (the process, and with it the other ranks' threads).

use std::sync::mpsc;

use hisparse_engine::{LatencySummary, RequestSpec, RunSummary, StepMetrics, TokenLatency};
use hisparse_memory::Mode;

use super::rank_vote::StepVote;
use super::run_args::{ModeRun, RunArgs, rejected_of, request_lengths};
use super::sweep_ranks::{across_ranks, members, rank_results};
use crate::error::Result;
use crate::{interrupt, progress};

/// What one rank measured: its steps, latencies, rejected and refused requests, exchanged bytes.
type RankResult = (Vec<StepMetrics>, Vec<TokenLatency>, Vec<(u64, String)>, Vec<u64>, u64);

/// One mode on `ranks` engines: see the module documentation.
pub(super) fn run_mode(
    a: &RunArgs,
    mode: Mode,
    ranks: usize,
    specs: &[RequestSpec],
    times: Option<&[f64]>,
) -> Result<ModeRun> {
    let g = a.engine.geometry()?;
    let hs = a.engine.hisparse(&g)?;
    let plan = a.engine.rank_plan(&g, &hs, ranks, request_lengths(a).1)?;
    let members = members(&a.engine, ranks)?;
    let lockstep = members.iter().any(Option::is_some);
    let mut votes = StepVote::group(ranks).into_iter();
    let all: u64 = specs.iter().map(|s| s.output_tokens as u64).sum();
    let bar = progress::bar(all, &format!("{mode} tokens over {ranks} GPUs"));
    let (tx, rx) = mpsc::channel::<(usize, Result<RankResult>)>();
    for (rank, member) in members.into_iter().enumerate() {
        // One handle per rank (the group has `ranks` of them).
        let vote = votes.next().filter(|_| lockstep);
        let mine: Vec<usize> = (0..specs.len()).filter(|i| i % ranks == rank).collect();
        let my_specs: Vec<RequestSpec> = mine.iter().map(|&i| specs[i]).collect();
        let my_times: Option<Vec<f64>> = times.map(|t| mine.iter().map(|&i| t[i]).collect());
        let (a, plan, bar, tx) = (a.clone(), plan.clone(), bar.clone(), tx.clone());
        std::thread::spawn(move || {
            let run = || -> Result<RankResult> {
                let mut e = a.engine.rank_engine(mode, request_lengths(&a), "context", rank, &plan)?;
                if let Some(m) = member {
                    e.join_ranks(m)?;
                }
                let (mut steps, mut lat) = (Vec::new(), Vec::new());
                let refused = super::arrivals::drive(e.as_mut(), &my_specs, my_times.as_deref(), vote.as_ref(), |r| {
                    interrupt::check(|| format!("decoding the {mode} run on rank {rank}"))?;
                    bar.inc(r.metrics.tokens as u64);
                    steps.push(r.metrics);
                    lat.extend(r.latencies);
                    Ok(())
                })?;
                e.check_pools()?;
                Ok((steps, lat, rejected_of(e.as_ref()), refused, e.exchanged_bytes()))
            };
            // The receiver is gone only when the command already ended.
            let _ = tx.send((rank, run()));
        });
    }
    drop(tx);
    let per_rank = rank_results(&rx, ranks)?;
    bar.finish_and_clear();
    // Deployment steps: step i of every rank that ran one (all of them, in lockstep).
    let longest = per_rank.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let steps: Vec<StepMetrics> = (0..longest)
        .map(|i| across_ranks(&per_rank.iter().filter_map(|r| r.0.get(i).cloned()).collect::<Vec<_>>()))
        .collect();
    let mut summary = RunSummary::default();
    for s in &steps {
        summary.add(s);
    }
    let latencies: Vec<TokenLatency> = per_rank.iter().flat_map(|r| r.1.iter().cloned()).collect();
    let exchanged = per_rank.first().map_or(0, |r| r.4);
    Ok(ModeRun {
        mode,
        summary,
        rejected: per_rank.iter().flat_map(|r| r.2.iter().cloned()).collect(),
        refused: per_rank.iter().flat_map(|r| r.3.iter().copied()).collect(),
        latency: LatencySummary::of(&latencies),
        gpus: ranks,
        exchange_mb_per_step: exchanged as f64 / 1e6 / steps.len().max(1) as f64,
        steps,
        timing_only: None,
        arrival_rate: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
    use super::*;
    use hisparse_engine::emulated::RankExchange;
    use hisparse_engine::emulated::{AttentionShape, EmulatedModel, MlaShape, WeightFormat};
    use hisparse_engine::{Engine, EngineConfig};
    use hisparse_kernels::{CpuBackend, CpuRank, Kernels};
    use hisparse_memory::{KvGeometry, RequestId};

    #[test]
    fn every_rank_sees_the_same_vote_every_round() {
        let ranks = 4;
        let votes = StepVote::group(ranks);
        let seen: Vec<Vec<(bool, bool)>> = std::thread::scope(|s| {
            let h: Vec<_> = votes
                .into_iter()
                .enumerate()
                .map(|(rank, v)| {
                    s.spawn(move || {
                        // Rank r has work for 10 * (r + 1) rounds and decodes on odd rounds.
                        (0..50)
                            .map(|round| v.any(round < 10 * (rank + 1), round < 10 * (rank + 1) && round % 2 == 1))
                            .collect()
                    })
                })
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (round, want) in (0..50).map(|r| (r, (r < 40, r < 40 && r % 2 == 1))) {
            for (rank, s) in seen.iter().enumerate() {
                assert_eq!(s[round], want, "rank {rank} round {round}");
            }
        }
    }

    fn tiny() -> EmulatedModel {
        EmulatedModel {
            name: "tiny".into(),
            layers: 4,
            hidden: 64,
            heads: 4,
            attention: AttentionShape::Mla(MlaShape {
                q_lora: 32,
                kv_lora: 512,
                rope: 64,
                qk_nope: 16,
                v_head: 16,
                index_heads: 8,
                index_dim: 128,
            }),
            weights: WeightFormat::Fp8,
            dense_inter: 128,
            dense_layers: 1,
            experts: 16,
            experts_per_token: 2,
            shared_experts: 1,
            moe_inter: 32,
            vocab: 256,
            ranks: 8,
        }
    }

    /// Two engines exchanging around the FFN, one with far less to decode: driven with the vote
    /// both step until the busier is done (the other idly), as many steps each, and they move the
    /// same bytes; every request finishes.
    #[test]
    fn ranks_driven_with_the_vote_step_together_until_the_last_is_done() {
        let share = |rank: usize| -> Vec<RequestSpec> {
            let (n, out) = if rank == 0 { (3, 12) } else { (1, 3) };
            (0..n)
                .map(|i| RequestSpec { id: RequestId(10 * rank as u64 + i), prompt_tokens: 700, output_tokens: out })
                .collect()
        };
        let group = CpuRank::group(2).unwrap();
        let votes = StepVote::group(2);
        let out: Vec<(usize, u64, usize)> = std::thread::scope(|s| {
            let h: Vec<_> = group
                .into_iter()
                .zip(votes)
                .enumerate()
                .map(|(rank, (g, v))| {
                    s.spawn(move || {
                        let mut cfg =
                            EngineConfig::new(KvGeometry::preset("cpu-small").unwrap(), Mode::HiSparse, 64 << 20);
                        cfg.cache.hisparse.max_request_tokens = 4096;
                        cfg.emulated_model = Some(tiny());
                        let mut e = Engine::new(CpuBackend::new(), cfg).unwrap();
                        let ex = RankExchange::new(&tiny(), Box::new(g), e.cache().backend().memory()).unwrap();
                        e.set_exchange(ex).unwrap();
                        let specs = share(rank);
                        let (mut steps, mut exchange, mut model) = (0, 0.0, 0.0);
                        super::super::arrivals::drive(&mut e, &specs, None, Some(&v), |r| {
                            steps += 1;
                            exchange += r.metrics.stages.exchange;
                            model += r.metrics.stages.model;
                            Ok(())
                        })
                        .unwrap();
                        // The collectives are timed apart from the GEMMs around them.
                        assert!(exchange > 0.0 && model > 0.0, "rank {rank}: exchange {exchange} s, model {model} s");
                        let finished = e.outcomes().len();
                        (steps, e.exchanged_bytes(), finished)
                    })
                })
                .collect();
            h.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(out[0].0, out[1].0, "both ranks ran the same steps");
        assert!(out[0].0 >= 12, "{} steps", out[0].0);
        assert!(out[0].1 > 0 && out[0].1 == out[1].1, "bytes {} and {}", out[0].1, out[1].1);
        assert_eq!((out[0].2, out[1].2), (3, 1), "every request finished");
    }
}
