//! `RankExchange`: the emulated model's token exchange between the ranks of a data-parallel
//! attention deployment (`crate::ranks`), run through a [`Collectives`] group: before each
//! layer's FFN or MoE block an all-gather of every rank's hidden states (bf16, padded to the
//! largest rank's batch), after it a reduce-scatter of the partial outputs, and after the last
//! layer an all-gather of the LM head's fp32 logits (moved as bf16 pairs). The batch the ranks
//! pad to is agreed at the step's first layer ([`Collectives::max`]), so a rank with fewer
//! requests still meets the others.
//!
//! Invariant: the exchange's sizes are those of `crate::ranks::collectives` for the agreed
//! batches (tested), and every rank makes the same calls in the same order.
//! Invariant: its buffers are remade only when the agreed batch changes, which changes layer
//! 0's GEMM shapes and so the key of a captured launch sequence: a replayed graph never names
//! freed buffers.

use half::bf16;
use hisparse_kernels::Collectives;
use hisparse_memory::DeviceMemory;

use super::EmulatedModel;
use crate::error::{EngineError, Result};

/// One rank's exchange, with its buffers (exactly the sizes of the agreed batch's collectives).
pub struct RankExchange<M: DeviceMemory> {
    group: Box<dyn Collectives<M>>,
    hidden: usize,
    /// bf16 elements of one token's logits slice (fp32, so two per value).
    logits: usize,
    /// The agreed (padded) batch of the current step; its buffers below.
    padded: usize,
    hidden_own: M::Buffer<bf16>,
    hidden_all: M::Buffer<bf16>,
    logits_own: M::Buffer<bf16>,
    logits_all: M::Buffer<bf16>,
    /// Bytes this rank sent and received since made.
    pub bytes: u64,
}

fn checked(what: &'static str, parts: &[usize]) -> Result<usize> {
    parts.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).ok_or_else(|| EngineError::Config {
        field: what,
        value: format!("{parts:?}"),
        reason: "the exchange's size overflows".into(),
    })
}

impl<M: DeviceMemory> RankExchange<M> {
    /// The exchange of `shape` through `group`, buffers on `mem`. The group may be smaller than
    /// the deployment the shape splits its FFN for (`shape.ranks`): the GEMMs keep the shape's
    /// sizes, the exchange moves what the group's ranks hold (one rank: the one-GPU run with its
    /// collectives).
    pub fn new(shape: &EmulatedModel, group: Box<dyn Collectives<M>>, mem: &M) -> Result<Self> {
        if group.ranks() == 0 || group.ranks() > shape.ranks {
            return Err(EngineError::Config {
                field: "gpus",
                value: group.ranks().to_string(),
                reason: format!("the {} model is split for at most {} GPUs", shape.name, shape.ranks),
            });
        }
        Ok(Self {
            group,
            hidden: shape.hidden,
            logits: 2 * (shape.vocab / shape.ranks),
            padded: 0,
            hidden_own: mem.alloc_zeroed(0)?,
            hidden_all: mem.alloc_zeroed(0)?,
            logits_own: mem.alloc_zeroed(0)?,
            logits_all: mem.alloc_zeroed(0)?,
            bytes: 0,
        })
    }

    /// Ranks of the group.
    pub fn ranks(&self) -> usize {
        self.group.ranks()
    }

    /// The batch every rank pads to this step (after [`RankExchange::begin_step`]).
    pub fn padded(&self) -> usize {
        self.padded
    }

    /// Agrees on the step's padded batch (`batch` is this rank's) and sizes the buffers (made
    /// anew only when it changes).
    pub fn begin_step(&mut self, batch: usize, mem: &M) -> Result<usize> {
        let b = u32::try_from(batch).map_err(|_| EngineError::Config {
            field: "batch",
            value: batch.to_string(),
            reason: "beyond 2^32".into(),
        })?;
        let padded = self.group.max(b)? as usize;
        if padded != self.padded {
            let r = self.ranks();
            let (h, l) = (checked("batch", &[padded, self.hidden])?, checked("batch", &[padded, self.logits])?);
            let (ha, la) = (checked("batch", &[h, r])?, checked("batch", &[l, r])?);
            self.hidden_own = mem.alloc_zeroed(h)?;
            self.hidden_all = mem.alloc_zeroed(ha)?;
            self.logits_own = mem.alloc_zeroed(l)?;
            self.logits_all = mem.alloc_zeroed(la)?;
            self.padded = padded;
        }
        Ok(padded)
    }

    fn moved(&mut self, own: usize) {
        self.bytes += 2 * (own + own * self.ranks()) as u64;
    }

    /// The all-gather of the hidden states before a layer's FFN.
    pub fn before_ffn(&mut self, mem: &M) -> Result<()> {
        self.group.all_gather(&self.hidden_own, &mut self.hidden_all)?;
        self.moved(mem.len(&self.hidden_own));
        Ok(())
    }

    /// The reduce-scatter of the FFN's partial outputs after it.
    pub fn after_ffn(&mut self, mem: &M) -> Result<()> {
        self.group.reduce_scatter(&self.hidden_all, &mut self.hidden_own)?;
        self.moved(mem.len(&self.hidden_own));
        Ok(())
    }

    /// The all-gather of the LM head's logits after the last layer.
    pub fn after_lm_head(&mut self, mem: &M) -> Result<()> {
        self.group.all_gather(&self.logits_own, &mut self.logits_all)?;
        self.moved(mem.len(&self.logits_own));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use hisparse_kernels::{CpuBackend, CpuRank, Kernels};

    use super::*;
    use crate::emulated::{AttentionShape, EmulatedWeights, MlaShape, WeightFormat};

    /// A small model split three ways (dense first layer, then MoE).
    fn tiny() -> EmulatedModel {
        EmulatedModel {
            name: "tiny".into(),
            layers: 3,
            hidden: 64,
            heads: 2,
            attention: AttentionShape::Mla(MlaShape {
                q_lora: 32,
                kv_lora: 32,
                rope: 16,
                qk_nope: 16,
                v_head: 16,
                index_heads: 2,
                index_dim: 16,
            }),
            weights: WeightFormat::Fp8,
            dense_inter: 96,
            dense_layers: 1,
            experts: 6,
            experts_per_token: 2,
            shared_experts: 1,
            moe_inter: 96,
            vocab: 96,
            ranks: 3,
        }
    }

    #[test]
    fn ranks_with_different_batches_meet_and_move_the_plans_bytes() {
        let shape = tiny();
        let steps = 4;
        let bytes: Vec<(u64, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = CpuRank::group(3)
                .unwrap()
                .into_iter()
                .map(|rank| {
                    let shape = shape.clone();
                    s.spawn(move || {
                        let me = rank.rank();
                        let backend = CpuBackend::new();
                        let mut m = EmulatedWeights::new(shape.clone(), &backend).unwrap();
                        m.set_exchange(RankExchange::new(&shape, Box::new(rank), backend.memory()).unwrap());
                        for step in 0..steps {
                            // Rank r decodes r + 1 requests; rank 0 five at the last step.
                            let batch = if me == 0 && step == steps - 1 { 5 } else { me + 1 };
                            for l in 0..shape.layers {
                                m.launch(l, batch, &backend).unwrap();
                            }
                        }
                        let ex = m.exchange().unwrap();
                        (ex.bytes, ex.padded())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let per_step = |pad: usize| -> u64 {
            crate::ranks::collectives(&shape, &[pad; 3]).unwrap().iter().map(|c| c.step_bytes()).sum()
        };
        // Padded to the largest batch of each step: 3, then 5 at the last.
        let want = per_step(3) * (steps as u64 - 1) + per_step(5);
        for (r, (b, pad)) in bytes.iter().enumerate() {
            assert_eq!(*pad, 5, "rank {r}");
            assert_eq!(*b, want, "rank {r}: bytes moved");
        }
        assert!(want > 0);
        let one = CpuRank::group(4).unwrap().into_iter().next().unwrap();
        let e = RankExchange::new(&shape, Box::new(one), CpuBackend::new().memory()).err().unwrap();
        assert!(e.to_string().contains("gpus"), "{e}");
    }
}
