//! Data-parallel ranks: how a deployment of `ranks` GPUs, one engine each, shares the work — the
//! requests spread over the ranks, the host memory divided between them, and the collectives
//! the emulated model's FFN and MoE blocks need every step ([`collectives`]).
//!
//! The deployment followed is SGLang's DP attention (`--tp N --dp N --enable-dp-attention`,
//! `--moe-a2a-backend none`, its default): attention is data-parallel, so each rank decodes its
//! own requests with its own KV hierarchy; the FFN, experts and LM head are split `N` ways over
//! the tokens of every rank, so before each FFN or MoE block the ranks **all-gather** their
//! hidden states (padded to the largest rank's batch) and after it they **reduce-scatter** the
//! partial outputs back to the ranks that own the tokens; the LM head's vocabulary slices are
//! all-gathered once per step. (With `--moe-a2a-backend deepep` the MoE blocks would exchange
//! tokens all-to-all instead; that is not what the HiSparse blog's deployment ran.)
//!
//! Invariant: every request goes to exactly one rank, and the ranks' host slices are disjoint,
//! whole pages, and together no larger than the host memory given.

use hisparse_policy::HiSparseConfig;

use crate::emulated::EmulatedModel;
use crate::error::{EngineError, Result};

/// The ranks of a deployment and what each holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankPlan {
    /// GPUs, one engine each.
    pub ranks: usize,
    /// Host-tier bytes of each rank (whole pages).
    pub host_bytes_per_rank: u64,
}

fn bad(field: &'static str, value: impl ToString, reason: impl Into<String>) -> EngineError {
    EngineError::Config { field, value: value.to_string(), reason: reason.into() }
}

impl RankPlan {
    /// `ranks` engines sharing `host_bytes` of host memory, divided evenly in whole pages of
    /// `page_bytes`. Refused: no ranks, an empty page, or less than one page per rank.
    pub fn new(ranks: usize, host_bytes: u64, page_bytes: u64) -> Result<Self> {
        if ranks == 0 {
            return Err(bad("gpus", ranks, "give at least one GPU"));
        }
        if page_bytes == 0 {
            return Err(bad("page_bytes", page_bytes, "a host page holds at least one byte"));
        }
        let pages = host_bytes / page_bytes;
        let per = pages / ranks as u64;
        if per == 0 {
            return Err(bad(
                "gpus",
                ranks,
                format!("{host_bytes} bytes of host memory are fewer than one {page_bytes}-byte page per GPU"),
            ));
        }
        // per * page_bytes <= host_bytes / ranks: no overflow.
        Ok(Self { ranks, host_bytes_per_rank: per * page_bytes })
    }

    /// One rank's share of `whole` (the machine's hierarchy): its slice of the host tier, holding
    /// requests of at most `longest_tokens` (the requests it is given, not the longest one the
    /// whole machine's tier could hold).
    pub fn share(&self, whole: &HiSparseConfig, longest_tokens: usize) -> HiSparseConfig {
        HiSparseConfig {
            host_tier_bytes: self.host_bytes_per_rank,
            max_request_tokens: longest_tokens,
            ..whole.clone()
        }
    }

    /// The rank of each of `requests` requests in arrival order: round robin, so that ranks
    /// decode as many requests as they can (within one) and equal requests load them equally.
    pub fn assign(&self, requests: usize) -> Vec<usize> {
        (0..requests).map(|i| i % self.ranks).collect()
    }

    /// `items` (one per request, in arrival order) split by rank.
    pub fn split<T: Clone>(&self, items: &[T]) -> Vec<Vec<T>> {
        let mut out = vec![Vec::new(); self.ranks];
        for (item, r) in items.iter().zip(self.assign(items.len())) {
            out[r].push(item.clone());
        }
        out
    }

    /// Requests decoding on each rank when `concurrency` requests run over all of them.
    pub fn batches(&self, concurrency: usize) -> Vec<usize> {
        (0..self.ranks).map(|r| concurrency / self.ranks + usize::from(r < concurrency % self.ranks)).collect()
    }
}

/// What a collective does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveKind {
    /// Every rank contributes `send` bytes and receives everyone's (`ranks x send`).
    AllGather,
    /// Every rank contributes `ranks x recv` bytes of partial sums and receives its reduced share.
    ReduceScatter,
}

/// One kind of collective of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collective {
    /// Where in the model (`ffn gather`, `ffn scatter`, `lm head gather`).
    pub name: &'static str,
    /// Its kind.
    pub kind: CollectiveKind,
    /// Bytes each rank sends per call.
    pub send_bytes: u64,
    /// Bytes each rank receives per call.
    pub recv_bytes: u64,
    /// Calls per step.
    pub calls: usize,
}

impl Collective {
    /// Bytes each rank sends and receives over a step.
    pub fn step_bytes(&self) -> u64 {
        (self.send_bytes + self.recv_bytes) * self.calls as u64
    }
}

/// The collectives of one decode step of `shape`'s model when the ranks decode `batches`
/// requests each (`batches.len()` must be the shape's `ranks`): per layer an all-gather of bf16
/// hidden states padded to the largest batch and a reduce-scatter of the FFN's bf16 outputs, and
/// per step an all-gather of the LM head's fp32 logits over the vocabulary slices. Empty with one
/// rank (nothing to exchange) or when no rank decodes.
pub fn collectives(shape: &EmulatedModel, batches: &[usize]) -> Result<Vec<Collective>> {
    let ranks = shape.ranks;
    if batches.len() != ranks {
        return Err(bad("batches", batches.len(), format!("one batch per rank: the model has {ranks} ranks")));
    }
    let pad = batches.iter().copied().max().unwrap_or(0);
    if ranks <= 1 || pad == 0 {
        return Ok(Vec::new());
    }
    let big = |what: &str| bad("batches", pad, format!("{what} overflows"));
    let hidden = (pad as u64).checked_mul(shape.hidden as u64 * 2).ok_or_else(|| big("hidden bytes"))?;
    let all = hidden.checked_mul(ranks as u64).ok_or_else(|| big("gathered bytes"))?;
    let slice = shape.vocab.div_ceil(ranks) as u64;
    let logits = (pad as u64).checked_mul(slice * 4).ok_or_else(|| big("logit bytes"))?;
    let all_logits = logits.checked_mul(ranks as u64).ok_or_else(|| big("gathered logits"))?;
    Ok(vec![
        Collective {
            name: "ffn gather",
            kind: CollectiveKind::AllGather,
            send_bytes: hidden,
            recv_bytes: all,
            calls: shape.layers,
        },
        Collective {
            name: "ffn scatter",
            kind: CollectiveKind::ReduceScatter,
            send_bytes: all,
            recv_bytes: hidden,
            calls: shape.layers,
        },
        Collective {
            name: "lm head gather",
            kind: CollectiveKind::AllGather,
            send_bytes: logits,
            recv_bytes: all_logits,
            calls: 1,
        },
    ])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
    use super::*;

    #[test]
    fn requests_go_round_robin_each_to_one_rank() {
        let p = RankPlan::new(8, 94 << 30, 16 * 656).unwrap();
        let ids: Vec<u64> = (100..356).collect();
        let split = p.split(&ids);
        assert_eq!(split.len(), 8);
        assert!(split.iter().all(|s| s.len() == 32), "256 requests, 32 per GPU");
        let mut all: Vec<u64> = split.concat();
        all.sort_unstable();
        assert_eq!(all, ids, "every request on exactly one rank");
        assert_eq!(p.batches(256), vec![32; 8]);
        assert_eq!(p.batches(10), vec![2, 2, 1, 1, 1, 1, 1, 1]);
        assert_eq!(p.batches(10).iter().sum::<usize>(), 10);
        assert_eq!(RankPlan::new(3, 1 << 20, 4096).unwrap().assign(7), vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn host_memory_is_divided_in_whole_pages() {
        let page = 16 * 656u64;
        for (ranks, host) in [(1usize, 94u64 << 30), (8, 94 << 30), (3, 1_000_003), (7, 15 * page + 3)] {
            let p = RankPlan::new(ranks, host, page).unwrap();
            assert_eq!(p.host_bytes_per_rank % page, 0, "{ranks} ranks of {host}");
            assert!(p.host_bytes_per_rank * ranks as u64 <= host);
            // At most one page per rank left over, besides the partial page.
            assert!(host - p.host_bytes_per_rank * (ranks as u64) < (ranks as u64 + 1) * page);
        }
        for (ranks, host, page) in
            [(0usize, 1u64 << 20, 4096u64), (8, 7 * 4096, 4096), (7, 5 * 4096 + 3, 4096), (2, 1 << 20, 0)]
        {
            let e = RankPlan::new(ranks, host, page).unwrap_err().to_string();
            assert!(e.contains("gpus") || e.contains("page_bytes"), "{e}");
        }
    }

    #[test]
    fn a_share_is_the_ranks_slice_of_the_host_tier_for_its_longest_request() {
        let whole = HiSparseConfig { host_tier_bytes: 94 << 30, max_request_tokens: 131_072, ..Default::default() };
        let p = RankPlan::new(8, whole.host_tier_bytes, 16 * 656).unwrap();
        let s = p.share(&whole, 40_000);
        assert_eq!((s.host_tier_bytes, s.max_request_tokens), (p.host_bytes_per_rank, 40_000));
        assert!(s.host_tier_bytes < whole.host_tier_bytes);
        assert_eq!(
            (s.device_buffer_size, s.page_tokens, s.device_kv_bytes),
            (whole.device_buffer_size, whole.page_tokens, whole.device_kv_bytes)
        );
    }

    #[test]
    fn collectives_have_the_deployments_sizes() {
        let shape = EmulatedModel::preset(hisparse_memory::Preset::Glm51).unwrap();
        assert_eq!(shape.ranks, 8);
        let c = collectives(&shape, &[32; 8]).unwrap();
        let by = |n: &str| c.iter().find(|x| x.name == n).unwrap().clone();
        // 32 tokens x 6144 hidden x 2 bytes from each rank; 8 ranks' worth back.
        let g = by("ffn gather");
        assert_eq!((g.kind, g.send_bytes, g.recv_bytes, g.calls), (CollectiveKind::AllGather, 393_216, 3_145_728, 78));
        let s = by("ffn scatter");
        assert_eq!((s.kind, s.send_bytes, s.recv_bytes), (CollectiveKind::ReduceScatter, 3_145_728, 393_216));
        // Logits: 32 tokens x 19 360 of 154 880 words x 4 bytes.
        let h = by("lm head gather");
        assert_eq!((h.send_bytes, h.recv_bytes, h.calls), (32 * 19_360 * 4, 8 * 32 * 19_360 * 4, 1));
        // MODEL.md's estimate: about 2 x T x hidden x 2 bytes per layer gathered and scattered
        // back (T = 256): the layers' traffic per rank.
        let layer_bytes = (g.recv_bytes + s.send_bytes) * 78;
        assert_eq!(layer_bytes, 2 * 256 * 6144 * 2 * 78);
        // Uneven batches pad to the largest; one rank or nothing running: no exchange.
        let u = collectives(&shape, &[5, 3, 0, 0, 0, 0, 0, 1]).unwrap();
        assert_eq!(u[0].send_bytes, 5 * 6144 * 2);
        assert!(collectives(&shape, &[0; 8]).unwrap().is_empty());
        let one = EmulatedModel { ranks: 1, ..shape.clone() };
        assert!(collectives(&one, &[32]).unwrap().is_empty());
        assert!(collectives(&shape, &[32; 4]).unwrap_err().to_string().contains("batches"));
    }
}
