//! `DecodeModel`: what the engine drives. The engine owns requests, scheduling, admission,
//! latencies, traces, dumps and metrics; a model owns what a request's tokens become — its
//! prompt's rows and keys at admission, each layer's inputs (attention queries, new KV rows,
//! index queries, weights and keys), what follows the attention (the emulated model's GEMMs, a
//! real model's output projection and MLP) and what ends a step (a real model's logits and next
//! tokens). Two models implement it: the synthetic workload with the emulated model's GEMMs
//! ([`super::SyntheticModel`], the default) and the real llama-architecture model
//! (`hisparse-model`'s `LlamaDecoder`).

use hisparse_kernels::Backend;
use hisparse_memory::{Admission, DeviceMemory, RequestId};

use super::observe::LayerTensors;
use crate::cache::{DecodeStep, KvCache, LayerInputs};
use crate::emulated::RankExchange;
use crate::error::{EngineError, Result};
use crate::request::RequestSpec;

/// One request of a step: its id and the position of its new token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// The request.
    pub id: RequestId,
    /// The position its new token takes (the request's length before the step).
    pub position: usize,
}

/// A model the engine decodes through its cache; see the module documentation. The engine
/// calls, per step: [`DecodeModel::prepare`], then per layer [`DecodeModel::project`], the
/// cache's layer and [`DecodeModel::after_attention`], then [`DecodeModel::ahead`] while the
/// kernels run, then [`DecodeModel::end_step`].
pub trait DecodeModel<B: Backend>
where
    B::Memory: Clone,
{
    /// Writes request `spec`'s prompt into `cache` (every layer's rows and keys), reserving
    /// `total` positions; the cache's answer (admitted, wait, rejected) is returned unchanged.
    fn admit(&mut self, cache: &mut KvCache<B>, spec: &RequestSpec, total: usize) -> Result<Admission>;

    /// Forgets request `id`, which left (finished or aborted).
    fn finish(&mut self, id: RequestId);

    /// Prepares a step of `batch` (in the cache's batch order). Returns whether its host work
    /// was done ahead, while the step before ran ([`DecodeModel::ahead`]).
    fn prepare(&mut self, cache: &KvCache<B>, batch: &[BatchEntry]) -> Result<bool>;

    /// Layer `l`'s inputs for `cache`, in its backend's memory.
    fn project(&mut self, cache: &KvCache<B>, l: usize) -> Result<LayerInputs<'_, B::Memory>>;

    /// What follows layer `l`'s attention, whose output (`[n, q_heads, d_v]`) and LSE
    /// (`[n, q_heads]`) the cache wrote into `out` and `lse`; its work is timed through `step`.
    fn after_attention(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        l: usize,
        out: &<B::Memory as DeviceMemory>::Buffer<f32>,
        lse: &<B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> Result<()>;

    /// Host work for the next step while this step's kernels run, for `next` as the batch
    /// will stand (`None`: the batch will change).
    fn ahead(&mut self, next: Option<&[BatchEntry]>) -> Result<()> {
        let _ = next;
        Ok(())
    }

    /// Ends the step of `batch` (every layer ran): a real model's logits and next tokens.
    fn end_step(&mut self, cache: &KvCache<B>, batch: &[BatchEntry]) -> Result<()> {
        let _ = (cache, batch);
        Ok(())
    }

    /// Changes whenever a buffer [`DecodeModel::project`] hands out is reallocated (a captured
    /// launch sequence reads its inputs where they were).
    fn generation(&self) -> u64;

    /// Layer `l`'s query tensors as last projected, with its outputs, for a dump.
    fn tensors<'a>(
        &'a self,
        l: usize,
        out: &'a <B::Memory as DeviceMemory>::Buffer<f32>,
        lse: &'a <B::Memory as DeviceMemory>::Buffer<f32>,
    ) -> Option<LayerTensors<'a, B::Memory>>;

    /// One step of layers over no request, for a rank of a deployment with nothing to decode
    /// that still meets the others' collectives.
    fn idle_step(&mut self, backend: &B) -> Result<()> {
        let _ = backend;
        Ok(())
    }

    /// Runs the model's collectives with the other ranks through `exchange`: refused by a
    /// model that has none.
    fn set_exchange(&mut self, exchange: RankExchange<B::Memory>) -> Result<()> {
        drop(exchange);
        Err(no_collectives())
    }

    /// Bytes sent and received in collectives so far.
    fn exchanged_bytes(&self) -> u64 {
        0
    }
}

/// The refusal of ranks' collectives by a model without the emulated model's FFN.
pub(crate) fn no_collectives() -> EngineError {
    EngineError::Config {
        field: "emulated_model",
        value: "none".into(),
        reason: "the ranks' collectives run around the emulated model's FFN: give an emulated model".into(),
    }
}
