//! The step runner: one decode step of the running batch through the cache's per-layer API.
//! For each layer the model's projections make the layer's tensors where the kernels run,
//! [`crate::DecodeStep::layer`] runs the layer, then what the model does after the attention,
//! then the observers (trace, dump) look at it. Layers 1..L replay as one captured launch sequence where
//! the backend can (keyed by layer 0's launch print and the generations of every buffer they
//! read), except while an observer reads the device between layers. The model's host work for the
//! next step runs while this step's kernels do.

use std::io::Write;
use std::time::Instant;

use hisparse_kernels::Backend;
use hisparse_memory::{DeviceMemory, RequestId};
use hisparse_policy::trace::TraceWriter;

use super::model::DecodeModel;
use super::observe::{dump_layer, push_digests, write_trace};
use super::report::StepReport;
use super::scheduler::Scheduler;
use crate::cache::{Captured, DecodeStep, KvCache};
use crate::error::{EngineError, Result};

/// The runner: see the module documentation.
pub(crate) struct StepRunner<M: DeviceMemory, D> {
    pub model: D,
    /// The selection trace and its score margin.
    pub trace: Option<(TraceWriter<Box<dyn Write + Send>>, usize)>,
    /// Dump every tensor of the next step that decodes anything.
    pub capture_next: bool,
    /// Record a digest of every attention output (each layer then writes its own buffers).
    pub digests: bool,
    /// Replay layers 1..L as one captured launch sequence where the backend can.
    pub graphs: bool,
    /// A capture failed (or the backend cannot capture): layers are launched one by one.
    graphs_off: bool,
    outs: Vec<M::Buffer<f32>>,
    lses: Vec<M::Buffer<f32>>,
    /// Bumped whenever an output buffer is reallocated.
    outs_generation: u64,
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// FNV-1a over words: the key of a captured launch sequence.
fn key_of(words: &[u64]) -> u64 {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

impl<M: DeviceMemory + Clone, D> StepRunner<M, D> {
    pub fn new(model: D, digests: bool, graphs: bool) -> Self {
        Self {
            model,
            trace: None,
            capture_next: false,
            digests,
            graphs,
            graphs_off: false,
            outs: Vec::new(),
            lses: Vec::new(),
            outs_generation: 0,
        }
    }

    /// Output buffers for a batch of `n`: one pair, or one per layer with digests.
    fn fit_outputs(&mut self, mem: &M, n: usize, per_out: usize, per_lse: usize, layers: usize) -> Result<()> {
        let want = if self.digests { layers } else { 1 };
        let mut moved = self.outs.len() != want;
        self.outs.truncate(want);
        self.lses.truncate(want);
        while self.outs.len() < want {
            self.outs.push(mem.alloc_zeroed(0)?);
            self.lses.push(mem.alloc_zeroed(0)?);
        }
        for (o, s) in self.outs.iter_mut().zip(&mut self.lses) {
            if mem.len(o) != n * per_out || mem.len(s) != n * per_lse {
                *o = mem.alloc_zeroed(n * per_out)?;
                *s = mem.alloc_zeroed(n * per_lse)?;
                moved = true;
            }
        }
        self.outs_generation += u64::from(moved);
        Ok(())
    }

    /// One decode step of the scheduler's running batch (engine step `step_no`).
    pub fn run<B: Backend<Memory = M>>(
        &mut self,
        cache: &mut KvCache<B>,
        sched: &Scheduler,
        step_no: u64,
        rep: &mut StepReport,
    ) -> Result<()>
    where
        D: DecodeModel<B>,
    {
        let batch = sched.batch();
        let ids: Vec<RequestId> = batch.iter().map(|e| e.id).collect();
        let g = cache.config().geometry.clone();
        let (n, layers) = (batch.len(), g.layers);
        let mem = cache.backend().memory().clone();
        let t = Instant::now();
        rep.metrics.inputs_ahead = self.model.prepare(cache, &batch)?;
        self.fit_outputs(&mem, n, g.q_heads * g.d_v(), g.q_heads, layers)?;
        rep.metrics.stages.workload += secs(t);
        let observe = self.trace.is_some() || self.capture_next;
        let graphs = self.graphs && !self.graphs_off && !observe && layers > 2;
        let mut step = cache.begin_step(&ids)?;
        let launched = self.launch_layers(&mut step, graphs, step_no, rep).and_then(|()| {
            // The kernels run: meanwhile, the model's host work for the next step.
            self.model.ahead(sched.foreseen().as_deref())
        });
        let ended = launched.and_then(|()| step.end())?;
        rep.metrics.absorb(&ended);
        self.model.end_step(cache, &batch)?;
        if self.digests {
            let tokens: Vec<u32> = sched.running.iter().map(|r| r.generated as u32).collect();
            for l in 0..layers {
                let (o, s) = (mem.download(&self.outs[l])?, mem.download(&self.lses[l])?);
                push_digests(&g, &ids, &tokens, l, &o, &s, rep);
            }
        }
        if self.capture_next && n > 0 {
            self.capture_next = false;
        }
        Ok(())
    }

    /// Every layer of the step: layer 0 launched, then layers 1..L replayed as one captured
    /// sequence (captured first when its key is new) or launched one by one.
    fn launch_layers<B: Backend<Memory = M>>(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        graphs: bool,
        step_no: u64,
        rep: &mut StepReport,
    ) -> Result<()>
    where
        D: DecodeModel<B>,
    {
        let layers = step.cache().config().geometry.layers;
        step.cache().backend().launch_print();
        self.layer(step, 0, step_no, rep)?;
        if graphs {
            let print = step.cache().backend().launch_print();
            let key = key_of(&[print, step.generation(), self.model.generation(), self.outs_generation, layers as u64]);
            let got =
                step.run_captured(key, layers, |s| (1..layers).try_for_each(|l| self.layer(s, l, step_no, rep)))?;
            if got != Captured::NotCaptured {
                return Ok(());
            }
            self.graphs_off = true;
        }
        (1..layers).try_for_each(|l| self.layer(step, l, step_no, rep))
    }

    /// Layer `l`: projections, the cache's layer, the model's GEMMs, the observers.
    fn layer<B: Backend<Memory = M>>(
        &mut self,
        step: &mut DecodeStep<'_, B>,
        l: usize,
        step_no: u64,
        rep: &mut StepReport,
    ) -> Result<()>
    where
        D: DecodeModel<B>,
    {
        let t = Instant::now();
        let Self { outs, lses, model, .. } = self;
        let li = model.project(step.cache(), l)?;
        rep.metrics.stages.workload += secs(t);
        let at = if outs.len() > 1 { l } else { 0 };
        let (out, lse) = (&mut outs[at], &mut lses[at]);
        step.layer(l, &li, out, lse)?;
        model.after_attention(step, l, out, lse)?;
        if self.trace.is_none() && !self.capture_next {
            return Ok(());
        }
        let ids = step.batch().to_vec();
        step.load_view()?;
        let view = step.loaded_view();
        if let Some((tr, margin)) = self.trace.as_mut() {
            let scores = if *margin > 0 { Some(step.cache().backend().memory().download(view.scores)?) } else { None };
            write_trace(tr, step_no, l, &ids, &view, scores.as_deref().map(|s| (s, *margin)))?;
        }
        if self.capture_next {
            let t = self
                .model
                .tensors(l, &self.outs[at], &self.lses[at])
                .ok_or_else(|| EngineError::Worker(format!("no inputs of layer {l}")))?;
            rep.dump.push(dump_layer(step.cache(), l, &ids, &view, &t)?);
        }
        Ok(())
    }
}
