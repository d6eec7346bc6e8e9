//! `CudaDevice`: one GPU's context and stream, and its loaded modules (each source compiled and
//! loaded at most once per device).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

use super::{driver_available, driver_error, nvrtc, sources};
use crate::error::{KernelError, Result};

/// A CUDA device ready to run the workspace's kernels.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// Print of the launches since it was last taken (see `printed_launch.rs`).
    pub(crate) print: Arc<super::printed_launch::LaunchPrint>,
    /// Whether the stream is being captured into a graph.
    pub(crate) capturing: AtomicBool,
}

impl CudaDevice {
    /// Opens GPU `ordinal`, or returns `CudaUnavailable` where there is no driver or no such GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_available() {
            return Err(KernelError::CudaUnavailable { reason: "no CUDA driver (libcuda.so) on this machine".into() });
        }
        let count = CudaContext::device_count().map_err(driver_error("cuDeviceGetCount"))?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(KernelError::CudaUnavailable { reason: format!("GPU {ordinal} asked for, {count} present") });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error("cuCtxCreate"))?;
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            print: Arc::default(),
            capturing: AtomicBool::new(false),
        })
    }

    /// GPU `ordinal` with a stream of its own (not the legacy default stream, so that work on
    /// it can be captured into CUDA graphs) and cudarc's per-buffer event tracking off: every
    /// buffer of this device is used on that one stream, in stream order.
    pub fn with_own_stream(ordinal: usize) -> Result<Self> {
        let base = Self::new(ordinal)?;
        // SAFETY: called before any buffer exists on this context (the context is new); all of
        // the device's buffers are then used on its single stream, so no cross-stream
        // synchronisation is needed.
        unsafe { base.ctx.disable_event_tracking() };
        let stream = base.ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        Ok(Self { stream, ..base })
    }

    /// The device of `stream`'s context, launching on `stream` itself: how another engine's
    /// stream (candle's, say) shares its buffers with our kernels in stream order. Event
    /// tracking stays as that context has it.
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        if !driver_available() {
            return Err(KernelError::CudaUnavailable { reason: "no CUDA driver (libcuda.so) on this machine".into() });
        }
        Ok(Self {
            ctx: stream.context().clone(),
            stream,
            modules: Mutex::new(HashMap::new()),
            print: Arc::default(),
            capturing: AtomicBool::new(false),
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kernels are launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name (e.g. "NVIDIA H200").
    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(driver_error("cuDeviceGetName"))
    }

    /// Kernel `kernel` of source `module`, compiling and loading the module on first use.
    pub fn function(&self, module: &str, kernel: &str) -> Result<CudaFunction> {
        self.function_of(module, kernel, || sources::source(module))
    }

    /// Kernel `kernel` of the module `module` built from `make()` on first use (for sources
    /// that are generated, such as a user policy's harness).
    pub fn function_of(
        &self,
        module: &str,
        kernel: &str,
        make: impl FnOnce() -> Option<sources::KernelSource>,
    ) -> Result<CudaFunction> {
        let m = {
            let mut modules = self.modules.lock().map_err(|_| KernelError::Cuda {
                context: "module cache".into(),
                message: "a thread panicked while holding the cache".into(),
            })?;
            match modules.get(module) {
                Some(m) => m.clone(),
                None => {
                    let src = make()
                        .ok_or_else(|| KernelError::invalid("module", module, "no kernel source of that name"))?;
                    let compiled = nvrtc::compile(&src)?;
                    let m =
                        self.ctx.load_module(compiled.ptx).map_err(driver_error(format!("loading module {module}")))?;
                    modules.insert(module.to_owned(), m.clone());
                    m
                }
            }
        };
        m.load_function(kernel).map_err(driver_error(format!("loading kernel {module}::{kernel}")))
    }
}
