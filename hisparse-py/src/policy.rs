//! Eviction policies written in Python: [`PyPolicy`] calls a Python object's hooks (the hooks
//! of our `EvictionPolicy`: `priority`, and optionally `on_hit`, `on_insert`, `on_keep`,
//! `on_evict`) from the simulator's threads, each call under the interpreter's lock. A hook
//! gets the slot's record, two 32-bit words `(a, b)`, and a [`SlotEnv`]; `priority` returns an
//! int (lowest evicted first), the others the new `(a, b)` (or None to keep it). The first
//! exception or bad return value stops every later call and is raised when the replay ends.

use std::borrow::Cow;
use std::sync::Mutex;

use hisparse_policy::policy::{EvictionPolicy, PolicyEnv, SlotRecord};
use pyo3::prelude::*;

/// What a hook knows about the slot and the step.
#[pyclass(module = "hisparse", name = "SlotEnv", frozen, get_all)]
pub struct SlotEnv {
    /// The request's decode step (from 1).
    pub step: u32,
    /// The layer.
    pub layer: u32,
    /// The request id.
    pub request: u64,
    /// Regular slots of the buffer.
    pub device_buffer_size: u32,
    /// The slot.
    pub slot: u32,
    /// Its token (in `on_insert` the token filling it, in `on_evict` the one leaving).
    pub token: u32,
    /// The token's indexer score this step (NaN where unknown).
    pub score: f32,
    /// Whether a prefetch filled the slot and no selection used it since.
    pub prefetched: bool,
    /// The step the token is next selected at (for a policy with `needs_future = True`; else
    /// 2**32 - 1, unknown).
    pub next_use: u32,
}

impl SlotEnv {
    fn of(env: &PolicyEnv) -> Self {
        Self {
            step: env.ctx.step,
            layer: env.ctx.layer,
            request: env.ctx.request,
            device_buffer_size: env.ctx.device_buffer_size,
            slot: env.slot,
            token: env.token,
            score: env.score,
            prefetched: env.prefetched != 0,
            next_use: env.next_use,
        }
    }
}

/// A Python object as an eviction policy.
pub struct PyPolicy {
    obj: Py<PyAny>,
    name: String,
    hooks: [bool; 4],
    needs: [bool; 2],
    /// The first failure of any hook.
    pub error: Mutex<Option<PyErr>>,
    /// Set when the replay is being stopped (Ctrl-C): hooks then return at once.
    pub stop: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PyPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyPolicy({})", self.name)
    }
}

const HOOKS: [&str; 4] = ["on_hit", "on_insert", "on_keep", "on_evict"];

impl PyPolicy {
    /// `obj` as a policy: it needs a `priority(record, env)` method; its name is its `name`
    /// attribute, else its class's name; `needs_scores` / `needs_future` attributes (true) ask
    /// for the env's `score` / `next_use`.
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if !obj.hasattr("priority")? {
            let t = obj.get_type().name()?.to_string();
            return Err(crate::error::kind("policies", format!("{t} has no priority(record, env) method")));
        }
        let name: String = match obj.getattr("name") {
            Ok(n) if !n.is_none() => n.extract()?,
            _ => obj.get_type().name()?.to_string(),
        };
        let mut hooks = [false; 4];
        for (h, n) in hooks.iter_mut().zip(HOOKS) {
            *h = obj.hasattr(n)?;
        }
        let flag = |n: &str| -> PyResult<bool> {
            match obj.getattr(n) {
                Ok(v) => v.is_truthy(),
                Err(_) => Ok(false),
            }
        };
        let needs = [flag("needs_scores")?, flag("needs_future")?];
        Ok(Self {
            obj: obj.clone().unbind(),
            name,
            hooks,
            needs,
            error: Mutex::new(None),
            stop: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn failed(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Relaxed) || self.error.lock().map_or(true, |e| e.is_some())
    }

    fn fail(&self, e: PyErr) {
        if let Ok(mut slot) = self.error.lock()
            && slot.is_none()
        {
            *slot = Some(e);
        }
    }

    /// Calls hook `name` with `(record, env)`; `None` once a hook failed.
    fn call<T>(
        &self,
        name: &str,
        rec: &SlotRecord,
        env: &PolicyEnv,
        take: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> Option<T> {
        if self.failed() {
            return None;
        }
        Python::attach(|py| {
            let r = self
                .obj
                .bind(py)
                .call_method1(name, ((rec.a, rec.b), SlotEnv::of(env)))
                .and_then(|v| take(&v))
                .map_err(|e| {
                    let msg = format!("policy {}.{name}: {e}", self.name);
                    pyo3::exceptions::PyRuntimeError::new_err(msg).set_cause_from(py, e)
                });
            match r {
                Ok(v) => Some(v),
                Err(e) => {
                    self.fail(e);
                    None
                }
            }
        })
    }

    /// Calls a hook that returns the new record (or None).
    fn update(&self, name: &str, rec: &mut SlotRecord, env: &PolicyEnv) {
        let got = self.call(name, rec, env, |v| {
            if v.is_none() {
                return Ok(None);
            }
            let (a, b): (u32, u32) = v.extract().map_err(|_| {
                crate::error::kind("return value", "a hook returns (a, b), two ints in 0..2**32, or None")
            })?;
            Ok(Some((a, b)))
        });
        if let Some(Some((a, b))) = got {
            rec.a = a;
            rec.b = b;
        }
    }
}

trait CauseExt {
    fn set_cause_from(self, py: Python<'_>, cause: PyErr) -> PyErr;
}

impl CauseExt for PyErr {
    fn set_cause_from(self, py: Python<'_>, cause: PyErr) -> PyErr {
        self.set_cause(py, Some(cause));
        self
    }
}

impl EvictionPolicy for PyPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn priority(&self, rec: &SlotRecord, env: &PolicyEnv) -> u64 {
        self.call("priority", rec, env, |v| {
            v.extract::<u64>().map_err(|_| crate::error::kind("return value", "priority returns an int in 0..2**64"))
        })
        .unwrap_or(0)
    }

    fn on_hit(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        if self.hooks[0] {
            self.update("on_hit", rec, env);
        }
    }

    fn on_insert(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        if self.hooks[1] {
            self.update("on_insert", rec, env);
        }
    }

    fn on_keep(&self, rec: &mut SlotRecord, env: &PolicyEnv) {
        if self.hooks[2] {
            self.update("on_keep", rec, env);
        }
    }

    fn on_evict(&self, rec: &SlotRecord, env: &PolicyEnv) -> u32 {
        if !self.hooks[3] {
            return env.token_word;
        }
        self.call("on_evict", rec, env, |v| {
            v.extract::<u32>().map_err(|_| crate::error::kind("return value", "on_evict returns an int in 0..2**32"))
        })
        .unwrap_or(env.token_word)
    }

    fn needs_scores(&self) -> bool {
        self.needs[0]
    }

    fn needs_future(&self) -> bool {
        self.needs[1]
    }

    fn cuda(&self) -> Option<Cow<'static, str>> {
        None
    }
}

/// Runs `f` (a replay) on a pool of threads that each keep one Python thread state while it
/// runs, released from the interpreter's lock between hook calls: a hook call then only takes
/// the lock back, instead of making and dropping a thread state every time. Every state is
/// dropped on its own thread before this returns (never as the pool's threads exit, which may
/// be while the interpreter shuts down). Where the pool cannot be made, `f` runs on the global
/// pool as before.
pub fn with_python_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("hisparse-replay-{i}"))
        .start_handler(|_| kept::keep())
        .build();
    match pool {
        Ok(pool) => {
            let r = pool.install(f);
            pool.broadcast(|_| kept::release());
            r
        }
        Err(_) => f(),
    }
}

/// One Python thread state per replay thread (see [`with_python_threads`]).
mod kept {
    use std::cell::Cell;

    use pyo3::ffi;

    thread_local! {
        static STATE: Cell<Option<(ffi::PyGILState_STATE, *mut ffi::PyThreadState)>> = const { Cell::new(None) };
    }

    /// Makes this thread's Python thread state and releases the interpreter's lock, keeping it.
    pub fn keep() {
        // SAFETY: called on a replay thread started from a call into this extension, so the
        // interpreter is initialised; the state made here is released by `release` on the same
        // thread, in the reverse order (restore, then release the GIL state).
        let kept = unsafe {
            let g = ffi::PyGILState_Ensure();
            (g, ffi::PyEval_SaveThread())
        };
        STATE.with(|s| s.set(Some(kept)));
    }

    /// Drops what `keep` made on this thread, if it did.
    pub fn release() {
        if let Some((g, ts)) = STATE.with(Cell::take) {
            // SAFETY: `ts` and `g` were returned on this thread by `keep`, which left the lock
            // released; taking it back with `ts` and releasing the GIL state undoes `keep`.
            unsafe {
                ffi::PyEval_RestoreThread(ts);
                ffi::PyGILState_Release(g);
            }
        }
    }
}
