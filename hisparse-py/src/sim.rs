//! `hisparse.simulate`: the trace-driven simulator from Python — built-in policies by name and
//! Python policy objects replayed side by side, under each prefetcher and buffer size, with
//! Belady's offline bound in every row; rows as dicts (a `pandas.DataFrame` takes the list).
//! The replays run on another thread with the interpreter's lock released (a Python policy's
//! hooks take it back call by call); Ctrl-C stops them between streams with KeyboardInterrupt.

use std::sync::Arc;

use hisparse_policy::policy::{EvictionPolicy, PolicyConfig};
use hisparse_policy::{PolicyChoice, PrefetcherChoice};
use hisparse_policy::{SimConfig, SimResult, replays_in_one_pass, simulate_encoded_policies, simulate_policies};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::error::{policy, value};
use crate::policy::PyPolicy;
use crate::trace::Trace;

/// The built-in eviction policies' names.
#[pyfunction]
pub fn builtin_policies() -> Vec<&'static str> {
    hisparse_policy::policy::POLICY_NAMES.to_vec()
}

/// The built-in prefetchers' names.
#[pyfunction]
pub fn builtin_prefetchers() -> Vec<&'static str> {
    hisparse_policy::prefetch::PREFETCHER_NAMES.to_vec()
}

/// A policy argument: a built-in's name, or a Python object with hooks.
enum Chosen {
    Builtin(Arc<dyn EvictionPolicy>),
    Python(Arc<PyPolicy>),
}

fn choose(p: &Bound<'_, PyAny>, cfg: &PolicyConfig) -> PyResult<Chosen> {
    if p.is_instance_of::<PyString>() {
        let name: String = p.extract()?;
        let c = PolicyChoice::parse(&name).map_err(|e| value("policies", e))?;
        return Ok(Chosen::Builtin(c.make(cfg).map_err(|e| policy("policies", e))?));
    }
    // A class of ours (hisparse.LRU(...)) carries the built-in's name.
    if let Ok(b) = p.getattr("builtin")
        && let Ok(name) = b.extract::<String>()
    {
        let c = PolicyChoice::parse(&name).map_err(|e| value("policies", e))?;
        return Ok(Chosen::Builtin(c.make(cfg).map_err(|e| policy("policies", e))?));
    }
    Ok(Chosen::Python(Arc::new(PyPolicy::new(p)?)))
}

/// Runs `trace` under every policy x prefetcher x buffer size; returns one dict per
/// combination: `policy`, `prefetcher`, `buffer`, `selected`, `hits`, `misses` (on the
/// critical path: fetched after the selection is known), `miss_ratio`, `bytes` (host to
/// device, prefetches included), `prefetched`, `prefetch_useful`, `prefetch_wasted`,
/// `misses_p99_per_step`, and with `belady=True` `belady_misses` and `vs_belady` (misses over
/// the offline bound's at the same prefetcher and buffer).
#[pyfunction]
#[pyo3(signature = (trace, policies = None, buffers = None, prefetchers = None, *, warmup_steps = 0, seed = 1, belady = true))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
pub fn simulate<'py>(
    py: Python<'py>,
    trace: &Trace,
    policies: Option<Vec<Bound<'py, PyAny>>>,
    buffers: Option<Vec<i64>>,
    prefetchers: Option<Vec<String>>,
    warmup_steps: usize,
    seed: u64,
    belady: bool,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let k = trace.header.top_k as i64;
    let buffers = buffers.unwrap_or_else(|| vec![k, 2 * k, 4 * k]);
    if buffers.is_empty() {
        return Err(value("buffers", "empty; give at least one buffer size"));
    }
    let buffer_sizes = buffers
        .iter()
        .map(|&b| {
            usize::try_from(b)
                .ok()
                .filter(|&b| b as i64 >= k)
                .ok_or_else(|| value("buffers", format!("{b}: a buffer holds at least the trace's top_k = {k} slots")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let policy_config = PolicyConfig { seed, ..PolicyConfig::default() };
    let given = match policies {
        Some(p) if p.is_empty() => return Err(value("policies", "empty; give at least one policy")),
        Some(p) => p,
        None => vec![PyString::new(py, "lru").into_any()],
    };
    let mut chosen = given.iter().map(|p| choose(p, &policy_config)).collect::<PyResult<Vec<_>>>()?;
    let has_belady = chosen.iter().any(|c| matches!(c, Chosen::Builtin(p) if p.name() == "belady"));
    if belady && !has_belady {
        chosen.push(choose(&PyString::new(py, "belady").into_any(), &policy_config)?);
    }
    let prefetchers = prefetchers
        .unwrap_or_else(|| vec!["none".into()])
        .iter()
        .map(|n| PrefetcherChoice::parse(n).map_err(|e| value("prefetchers", e)))
        .collect::<PyResult<Vec<_>>>()?;
    let made: Vec<Arc<dyn EvictionPolicy>> = chosen
        .iter()
        .map(|c| match c {
            Chosen::Builtin(p) => p.clone(),
            Chosen::Python(p) => p.clone() as Arc<dyn EvictionPolicy>,
        })
        .collect();
    let cfg = SimConfig { prefetchers, buffer_sizes, policy_config, warmup_steps, ..SimConfig::default() };
    // The replays run on another thread while this one watches for Ctrl-C (Python runs its
    // signal handlers only on the main thread): a KeyboardInterrupt stops them between streams.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut interrupted = None;
    // Set when the replays end; its condition wakes the watching thread at once (a replay is
    // often shorter than one watch).
    let done = (std::sync::Mutex::new(false), std::sync::Condvar::new());
    let report = std::thread::scope(|s| {
        let job = s.spawn(|| {
            let cancel = || stop.load(std::sync::atomic::Ordering::Relaxed);
            // LRU and FIFO without prefetch over a trace read encoded: a stream at a time from
            // its encoded positions; anything else from the decoded records.
            let r = match trace.encoded() {
                Some(t) if replays_in_one_pass(&cfg, &made) => {
                    simulate_encoded_policies(t, &cfg, &made, &|_| {}, &cancel)
                }
                _ => simulate_policies(&trace.header, trace.records(), &cfg, &made, &|_| {}, &cancel),
            };
            if let Ok(mut d) = done.0.lock() {
                *d = true;
            }
            done.1.notify_all();
            r
        });
        let tick = std::time::Duration::from_millis(20);
        // A replay thread that panicked ends the watch too (finished, or its lock poisoned); the
        // join reports it.
        let finished = || {
            let d = done.0.lock().map_err(|_| ())?;
            let (d, _) = done.1.wait_timeout_while(d, tick, |d| !*d).map_err(|_| ())?;
            Ok::<bool, ()>(*d)
        };
        while !job.is_finished() && py.detach(finished) == Ok(false) {
            if interrupted.is_none()
                && let Err(e) = py.check_signals()
            {
                interrupted = Some(e);
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                for c in &chosen {
                    if let Chosen::Python(p) = c {
                        p.stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }
        py.detach(|| job.join())
    });
    if let Some(e) = interrupted {
        return Err(e);
    }
    let report = report.map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the simulation thread panicked"))?;
    for c in &chosen {
        if let Chosen::Python(p) = c
            && let Some(e) = p.error.lock().ok().and_then(|mut e| e.take())
        {
            return Err(e);
        }
    }
    let report = report.map_err(|e| policy("trace", e))?;
    let bound = |r: &SimResult| {
        report
            .results
            .iter()
            .find(|b| b.policy == "belady" && b.prefetcher == r.prefetcher && b.buffer_slots == r.buffer_slots)
            .map(|b| b.swap.misses)
    };
    let mut rows = Vec::new();
    for r in report.results.iter().filter(|r| r.policy != "compulsory") {
        let d = PyDict::new(py);
        d.set_item("policy", &r.policy)?;
        d.set_item("prefetcher", &r.prefetcher)?;
        d.set_item("buffer", r.buffer_slots)?;
        d.set_item("selected", r.selected)?;
        d.set_item("hits", r.swap.hits)?;
        d.set_item("misses", r.swap.misses)?;
        d.set_item("miss_ratio", r.miss_ratio)?;
        d.set_item("bytes", r.swap.bytes_h2d)?;
        d.set_item("prefetched", r.swap.prefetched)?;
        d.set_item("prefetch_useful", r.swap.prefetch_useful)?;
        d.set_item("prefetch_wasted", r.swap.prefetch_wasted)?;
        d.set_item("misses_p99_per_step", r.misses_per_request_step.p99)?;
        if belady && let Some(b) = bound(r) {
            d.set_item("belady_misses", b)?;
            d.set_item("vs_belady", if b > 0 { r.swap.misses as f64 / b as f64 } else { f64::NAN })?;
        }
        rows.push(d);
    }
    Ok(rows)
}
