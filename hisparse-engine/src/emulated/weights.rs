//! `EmulatedWeights`: the emulated model's weights on the device (random, one buffer per planned
//! GEMM of every layer, all experts held) and the launch of a layer's GEMMs for a batch, through
//! [`ModelKernels::gemm_bf16`] on reused activation buffers — with a [`RankExchange`], the ranks'
//! collectives around each layer's FFN and after the LM head.

use half::bf16;
use hisparse_kernels::{Backend, GemmShape, KernelStage};
use hisparse_memory::DeviceMemory;

use super::exchange::RankExchange;
use super::{EmulatedModel, PlannedGemm};
use crate::error::{EngineError, Result};

/// The emulated non-attention part of a model, on one backend's memory.
pub struct EmulatedWeights<M: DeviceMemory> {
    shape: EmulatedModel,
    /// Per layer, one buffer per GEMM of `shape.plan(l, _)`, in plan order.
    weights: Vec<Vec<M::Buffer<bf16>>>,
    /// Activations (inputs, random) and outputs, grown to the largest GEMM.
    a: M::Buffer<bf16>,
    c: M::Buffer<bf16>,
    /// The plan of every layer for `batch` requests.
    plans: Vec<Vec<PlannedGemm>>,
    batch: usize,
    /// The exchange with the other ranks (a multi-GPU deployment), if any.
    exchange: Option<RankExchange<M>>,
}

/// Whether a planned GEMM belongs to the FFN or MoE block (after the all-gather).
fn in_ffn(g: &PlannedGemm) -> bool {
    g.name.starts_with("ffn") || g.name.starts_with("shared") || g.name.starts_with("experts") || g.name == "router"
}

/// Fills `out` (`len` values) with the unit stream of `seed` on the backend.
fn fill<B: Backend>(
    backend: &B,
    seed: u64,
    len: usize,
    out: &mut <B::Memory as DeviceMemory>::Buffer<bf16>,
) -> Result<()> {
    // The fill kernel takes 32-bit segment lengths: fill in segments of at most 2^30 values.
    let seg = len.clamp(1, 1 << 30);
    if len.is_multiple_of(seg) {
        let seeds: Vec<u64> = (0..len / seg).map(|i| seed.wrapping_mul(0x9e37_79b9).wrapping_add(i as u64)).collect();
        backend.fill_unit_bf16(&seeds, seg, out)?;
        return Ok(());
    }
    Err(EngineError::Config {
        field: "emulated_model",
        value: len.to_string(),
        reason: "weight matrix too large to fill".into(),
    })
}

impl<M: DeviceMemory> EmulatedWeights<M> {
    /// Allocates and fills every layer's weights on `backend`.
    pub fn new<B: Backend<Memory = M>>(shape: EmulatedModel, backend: &B) -> Result<Self> {
        shape.validate()?;
        let mem = backend.memory();
        let mut weights = Vec::with_capacity(shape.layers);
        for l in 0..shape.layers {
            let mut layer = Vec::new();
            for (i, g) in shape.plan(l, 0).iter().enumerate() {
                let len = g.k * g.n * g.held;
                let mut w = mem.alloc_zeroed::<bf16>(len)?;
                fill(backend, 0x4d4f_4445_4c00 ^ ((l as u64) << 16) ^ i as u64, len, &mut w)?;
                layer.push(w);
            }
            weights.push(layer);
        }
        Ok(Self {
            shape,
            weights,
            a: mem.alloc_zeroed(0)?,
            c: mem.alloc_zeroed(0)?,
            plans: Vec::new(),
            batch: usize::MAX,
            exchange: None,
        })
    }

    /// The model's shape.
    pub fn shape(&self) -> &EmulatedModel {
        &self.shape
    }

    /// Runs the ranks' collectives through `exchange` from the next step on: every rank then
    /// plans its GEMMs for the batch all ranks pad to.
    pub fn set_exchange(&mut self, exchange: RankExchange<M>) {
        self.exchange = Some(exchange);
        self.batch = usize::MAX;
    }

    /// The exchange, if the model runs with one.
    pub fn exchange(&self) -> Option<&RankExchange<M>> {
        self.exchange.as_ref()
    }

    /// Weight bytes held on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.shape.weight_bytes()
    }

    /// Plans every layer for `batch` requests and grows the activation buffers to fit.
    fn prepare<B: Backend<Memory = M>>(&mut self, batch: usize, backend: &B) -> Result<()> {
        if batch == self.batch {
            return Ok(());
        }
        self.plans = (0..self.shape.layers).map(|l| self.shape.plan(l, batch)).collect();
        let shapes = self.plans.iter().flatten().map(|g| GemmShape { m: g.m, n: g.n, k: g.k, batch: g.batch });
        let (a, c) = shapes.fold((0, 0), |(a, c), s| (a.max(s.a_len()), c.max(s.c_len())));
        let mem = backend.memory();
        if mem.len(&self.a) < a {
            self.a = mem.alloc_zeroed(a)?;
            fill(backend, 0x4143_5400 ^ a as u64, a, &mut self.a)?;
        }
        if mem.len(&self.c) < c {
            self.c = mem.alloc_zeroed(c)?;
        }
        self.batch = batch;
        Ok(())
    }

    /// Launches layer `l`'s GEMMs for `batch` requests.
    pub fn launch<B: Backend<Memory = M>>(&mut self, l: usize, batch: usize, backend: &B) -> Result<()> {
        self.launch_staged(l, batch, backend, &mut |_| Ok(()))
    }

    /// [`EmulatedWeights::launch`], calling `stage` with [`KernelStage::Exchange`] before each
    /// collective of the ranks and [`KernelStage::Model`] before the GEMMs after it (for
    /// [`crate::cache::DecodeStep::time_stages`]).
    pub fn launch_staged<B: Backend<Memory = M>>(
        &mut self,
        l: usize,
        batch: usize,
        backend: &B,
        stage: &mut dyn FnMut(KernelStage) -> Result<()>,
    ) -> Result<()> {
        if l >= self.shape.layers {
            return Err(EngineError::Config {
                field: "layer",
                value: l.to_string(),
                reason: format!("the emulated model has {} layers", self.shape.layers),
            });
        }
        let mem = backend.memory();
        let batch = match self.exchange.as_mut() {
            // The step's first layer: the ranks agree on the batch they pad to.
            Some(ex) if l == 0 => {
                stage(KernelStage::Exchange)?;
                ex.begin_step(batch, mem)?
            }
            Some(ex) => ex.padded(),
            None => batch,
        };
        stage(KernelStage::Model)?;
        self.prepare(batch, backend)?;
        let plan = &self.plans[l];
        let ffn_at = plan.iter().position(in_ffn).unwrap_or(plan.len());
        for (i, (g, w)) in plan.iter().zip(&self.weights[l]).enumerate() {
            if let Some(ex) = self.exchange.as_mut() {
                if i == ffn_at {
                    stage(KernelStage::Exchange)?;
                    ex.before_ffn(mem)?;
                }
                if g.name == "lm_head" {
                    stage(KernelStage::Exchange)?;
                    ex.after_ffn(mem)?;
                }
            }
            stage(KernelStage::Model)?;
            let s = GemmShape { m: g.m, n: g.n, k: g.k, batch: g.batch };
            if !s.is_empty() {
                backend.gemm_bf16(&s, &self.a, w, &mut self.c)?;
            }
        }
        if let Some(ex) = self.exchange.as_mut() {
            if plan.iter().any(|g| g.name == "lm_head") {
                stage(KernelStage::Exchange)?;
                ex.after_lm_head(mem)?;
            } else if ffn_at < plan.len() {
                stage(KernelStage::Exchange)?;
                ex.after_ffn(mem)?;
            }
        }
        Ok(())
    }
}
