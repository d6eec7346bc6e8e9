//! `ModelEmulation`: the emulated model's weights on the device (random, one buffer per planned
//! GEMM of every layer, all experts held) and the launch of a layer's GEMMs for a batch, through
//! [`Backend::gemm_bf16`] on reused activation buffers.

use half::bf16;
use hisparse_kernels::{Backend, GemmShape};
use hisparse_memory::DeviceMemory;

use super::{ModelShape, PlannedGemm};
use crate::error::{EngineError, Result};

/// The emulated non-attention part of a model, on one backend's memory.
pub struct ModelEmulation<M: DeviceMemory> {
    shape: ModelShape,
    /// Per layer, one buffer per GEMM of `shape.plan(l, _)`, in plan order.
    weights: Vec<Vec<M::Buffer<bf16>>>,
    /// Activations (inputs, random) and outputs, grown to the largest GEMM.
    a: M::Buffer<bf16>,
    c: M::Buffer<bf16>,
    /// The plan of every layer for `batch` requests.
    plans: Vec<Vec<PlannedGemm>>,
    batch: usize,
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
        field: "model",
        value: len.to_string(),
        reason: "weight matrix too large to fill".into(),
    })
}

impl<M: DeviceMemory> ModelEmulation<M> {
    /// Allocates and fills every layer's weights on `backend`.
    pub fn new<B: Backend<Memory = M>>(shape: ModelShape, backend: &B) -> Result<Self> {
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
        })
    }

    /// The model's shape.
    pub fn shape(&self) -> &ModelShape {
        &self.shape
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
        if l >= self.shape.layers {
            return Err(EngineError::Config {
                field: "layer",
                value: l.to_string(),
                reason: format!("the emulated model has {} layers", self.shape.layers),
            });
        }
        self.prepare(batch, backend)?;
        for (g, w) in self.plans[l].iter().zip(&self.weights[l]) {
            let s = GemmShape { m: g.m, n: g.n, k: g.k, batch: g.batch };
            if !s.is_empty() {
                backend.gemm_bf16(&s, &self.a, w, &mut self.c)?;
            }
        }
        Ok(())
    }
}
