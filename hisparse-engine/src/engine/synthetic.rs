//! `SyntheticModel`: the engine's default model — the synthetic workload's prompts and
//! per-layer inputs (`inputs.rs`) with, optionally, the emulated model's GEMMs after each
//! layer's attention (`crate::emulated`).

use hisparse_kernels::{Backend, KernelStage};
use hisparse_memory::{Admission, DeviceMemory, KvGeometry, RequestId};

use super::inputs::SyntheticInputs;
use super::model::{BatchEntry, DecodeModel};
use super::observe::LayerTensors;
use crate::cache::{DecodeStep, KvCache, LayerInputs};
use crate::emulated::{EmulatedModel, EmulatedWeights, RankExchange};
use crate::error::{EngineError, Result};
use crate::request::RequestSpec;
use crate::workload::Workload;

/// The synthetic workload, and the emulated model's GEMMs when it has a shape.
pub struct SyntheticModel<M: DeviceMemory> {
    inputs: SyntheticInputs<M>,
    weights: Option<EmulatedWeights<M>>,
    /// The batch of the step that runs (the GEMMs' batch).
    batch: usize,
}

impl<M: DeviceMemory> SyntheticModel<M> {
    /// The workload of `geometry` from `seed` on `backend`, with the emulated model `shape`'s
    /// weights (of `geometry`'s layers) when given; `stop` is observed inside a prompt's
    /// prefill.
    pub fn new<B: Backend<Memory = M>>(
        backend: &B,
        geometry: &KvGeometry,
        seed: u64,
        shape: Option<&EmulatedModel>,
        stop: crate::StopFlag,
    ) -> Result<Self> {
        let weights = match shape {
            Some(s) if s.layers != geometry.layers => {
                return Err(EngineError::Config {
                    field: "emulated_model.layers",
                    value: s.layers.to_string(),
                    reason: format!("the geometry has {} layers", geometry.layers),
                });
            }
            Some(s) => Some(EmulatedWeights::new(s.clone(), backend)?),
            None => None,
        };
        let inputs = SyntheticInputs::new(backend.memory(), geometry, seed, stop)?;
        Ok(Self { inputs, weights, batch: 0 })
    }

    /// The workload (to inspect or replace its locality before requests arrive).
    pub fn workload_mut(&mut self) -> &mut Workload {
        &mut self.inputs.workload
    }
}

impl<B: Backend> DecodeModel<B> for SyntheticModel<B::Memory>
where
    B::Memory: Clone,
{
    fn admit(&mut self, cache: &mut KvCache<B>, spec: &RequestSpec, total: usize) -> Result<Admission> {
        self.inputs.admit(cache, spec.id, spec.prompt_tokens, total)
    }

    fn finish(&mut self, id: RequestId) {
        self.inputs.finish(id);
    }

    fn prepare(&mut self, cache: &KvCache<B>, batch: &[BatchEntry]) -> Result<bool> {
        self.batch = batch.len();
        self.inputs.prepare(cache.backend().memory(), batch)
    }

    fn project(&mut self, cache: &KvCache<B>, l: usize) -> Result<LayerInputs<'_, B::Memory>> {
        self.inputs.project(cache.backend(), l)
    }

    fn after_attention(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        l: usize,
        _out: &<B::Memory as DeviceMemory>::Buffer<f32>,
        _lse: &<B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> Result<()> {
        let n = self.batch;
        match self.weights.as_mut() {
            Some(m) => step.time_stages(KernelStage::Model, |b, stage| m.launch_staged(l, n, b, stage)),
            None => Ok(()),
        }
    }

    fn ahead(&mut self, next: Option<&[BatchEntry]>) -> Result<()> {
        self.inputs.pregenerate(next)
    }

    fn generation(&self) -> u64 {
        self.inputs.generation
    }

    fn tensors<'a>(
        &'a self,
        l: usize,
        out: &'a <B::Memory as DeviceMemory>::Buffer<f32>,
        lse: &'a <B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> Option<LayerTensors<'a, B::Memory>> {
        self.inputs.tensors(l, out, lse)
    }

    fn idle_step(&mut self, backend: &B) -> Result<()> {
        // An idle rank of a deployment still meets the others' collectives: its model's layers
        // run at the batch they pad to (SGLang's idle batch).
        if let Some(m) = self.weights.as_mut().filter(|m| m.exchange().is_some()) {
            for l in 0..m.shape().layers {
                m.launch(l, 0, backend)?;
            }
        }
        Ok(())
    }

    fn set_exchange(&mut self, exchange: RankExchange<B::Memory>) -> Result<()> {
        match self.weights.as_mut() {
            Some(m) => {
                m.set_exchange(exchange);
                Ok(())
            }
            None => Err(super::model::no_collectives()),
        }
    }

    fn exchanged_bytes(&self) -> u64 {
        self.weights.as_ref().and_then(|m| m.exchange()).map_or(0, |x| x.bytes)
    }
}
