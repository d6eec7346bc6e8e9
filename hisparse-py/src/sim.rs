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

use crate::error::{policy, uint, value};
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

/// A name no built-in has, as the argument it was given in names it.
fn unknown(e: hisparse_policy::PolicyError) -> PyErr {
    use hisparse_policy::PolicyError;
    match e {
        PolicyError::UnknownPolicy { name, known } => {
            value("policies", format!("{name}: no such policy (known: {known})"))
        }
        PolicyError::Invalid { field: "prefetcher", value: name, reason } => {
            value("prefetchers", format!("{name}: no such prefetcher ({reason})"))
        }
        e => value("policies", e),
    }
}

/// `p` as a policy, and the buffer size it carries (a class of ours: `hisparse.LRU(64)`).
fn choose(p: &Bound<'_, PyAny>, cfg: &PolicyConfig) -> PyResult<(Chosen, Option<usize>)> {
    if p.is_instance_of::<PyString>() {
        let name: String = p.extract()?;
        let c = PolicyChoice::parse(&name).map_err(unknown)?;
        return Ok((Chosen::Builtin(c.make(cfg).map_err(|e| policy("policies", e))?), None));
    }
    // A class of ours (hisparse.LRU(...)) carries the built-in's name and its cache_size.
    if let Ok(b) = p.getattr("builtin")
        && let Ok(name) = b.extract::<String>()
    {
        let c = PolicyChoice::parse(&name).map_err(unknown)?;
        let size = match p.getattr("cache_size") {
            Ok(v) if !v.is_none() => Some(uint::<usize>("policies", &v, u64::from(u32::MAX))?),
            _ => None,
        };
        return Ok((Chosen::Builtin(c.make(cfg).map_err(|e| policy("policies", e))?), size));
    }
    Ok((Chosen::Python(Arc::new(PyPolicy::new(p)?)), None))
}

/// The buffer sizes of a call: `buffers` as given, or the one `cache_size` its policy classes
/// carry; a class's own size is never silently replaced by `buffers`, nor two classes' sizes
/// merged into one grid.
fn buffer_sizes(given: Option<Vec<Bound<'_, PyAny>>>, carried: &[usize], top_k: u32) -> PyResult<Vec<usize>> {
    let k = top_k as usize;
    let sizes = match (given, carried) {
        (Some(_), [first, ..]) => {
            return Err(value(
                "buffers",
                format!(
                    "a policy class of cache_size {first} replays at its own size: leave buffers out, or name the policy (\"lru\") to replay it at each buffer"
                ),
            ));
        }
        (None, [first, rest @ ..]) => {
            if let Some(other) = rest.iter().find(|&&s| s != *first) {
                return Err(value(
                    "policies",
                    format!("classes of cache_size {first} and {other} in one call: simulate them one size at a time"),
                ));
            }
            vec![*first]
        }
        (Some(b), []) => b.iter().map(|b| uint::<usize>("buffers", b, u64::from(u32::MAX))).collect::<PyResult<_>>()?,
        (None, []) => hisparse_policy::compared_device_buffer_sizes(k),
    };
    if sizes.is_empty() {
        return Err(value("buffers", "empty; give at least one buffer size"));
    }
    if let Some(b) = sizes.iter().find(|&&b| b < k) {
        return Err(value("buffers", format!("{b}: a buffer holds at least the trace's top_k = {k} slots")));
    }
    Ok(sizes)
}

/// Runs `trace` under every policy x prefetcher x buffer size; returns one dict per
/// combination: `policy`, `prefetcher`, `buffer`, `selected`, `hits`, `misses` (on the
/// critical path: fetched after the selection is known), `miss_ratio`, `bytes` (host to
/// device, prefetches included), `prefetched`, `prefetch_useful`, `prefetch_wasted`,
/// `misses_p99_per_step`, and with `belady=True` `belady_misses` and `vs_belady` (misses over
/// the offline bound's at the same prefetcher and buffer).
#[pyfunction]
#[pyo3(signature = (trace, policies = None, buffers = None, prefetchers = None, *, warmup_steps = None, seed = None, belady = true))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
pub fn simulate<'py>(
    py: Python<'py>,
    trace: &Trace,
    policies: Option<Vec<Bound<'py, PyAny>>>,
    buffers: Option<Vec<Bound<'py, PyAny>>>,
    prefetchers: Option<Vec<String>>,
    warmup_steps: Option<Bound<'py, PyAny>>,
    seed: Option<Bound<'py, PyAny>>,
    belady: bool,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let warmup_steps = warmup_steps.map_or(Ok(0), |w| uint::<usize>("warmup_steps", &w, u64::from(u32::MAX)))?;
    let seed = seed.map_or(Ok(1), |s| uint::<u64>("seed", &s, u64::MAX))?;
    let policy_config = PolicyConfig { seed, ..PolicyConfig::default() };
    let given = match policies {
        Some(p) if p.is_empty() => return Err(value("policies", "empty; give at least one policy")),
        Some(p) => p,
        None => vec![PyString::new(py, "lru").into_any()],
    };
    let (mut chosen, carried): (Vec<Chosen>, Vec<Option<usize>>) =
        given.iter().map(|p| choose(p, &policy_config)).collect::<PyResult<Vec<_>>>()?.into_iter().unzip();
    let carried: Vec<usize> = carried.into_iter().flatten().collect();
    let buffer_sizes = buffer_sizes(buffers, &carried, trace.header.top_k)?;
    let has_belady = chosen.iter().any(|c| matches!(c, Chosen::Builtin(p) if p.name() == "belady"));
    if belady && !has_belady {
        chosen.push(choose(&PyString::new(py, "belady").into_any(), &policy_config)?.0);
    }
    let prefetchers = prefetchers
        .unwrap_or_else(|| vec!["none".into()])
        .iter()
        .map(|n| PrefetcherChoice::parse(n).map_err(unknown))
        .collect::<PyResult<Vec<_>>>()?;
    // A trace read with scores=False has none, whatever its file held: say so.
    if trace.read_without_scores {
        let reads = chosen.iter().find_map(|c| match c {
            Chosen::Builtin(p) if p.needs_scores() => Some(("policies", p.name().to_owned())),
            Chosen::Python(p) if p.needs_scores() => Some(("policies", p.name().to_owned())),
            _ => None,
        });
        let near = prefetchers
            .iter()
            .find(|p| p.make(&Default::default()).needs_near())
            .map(|p| ("prefetchers", p.to_string()));
        if let Some((arg, name)) = reads.or(near) {
            return Err(value(
                arg,
                format!("{name} reads scores; the trace was read with scores=False: read it with Trace.read(path)"),
            ));
        }
    }
    let made: Vec<Arc<dyn EvictionPolicy>> = chosen
        .iter()
        .map(|c| match c {
            Chosen::Builtin(p) => p.clone(),
            Chosen::Python(p) => p.clone() as Arc<dyn EvictionPolicy>,
        })
        .collect();
    let cfg = SimConfig { prefetchers, buffer_sizes, policy_config, warmup_steps, ..SimConfig::default() };
    let python = chosen.iter().any(|c| matches!(c, Chosen::Python(_)));
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
            let replay = || match trace.encoded() {
                Some(t) if replays_in_one_pass(&cfg, &made) => {
                    simulate_encoded_policies(t, &cfg, &made, &|_| {}, &cancel)
                }
                _ => simulate_policies(&trace.header, trace.records(), &cfg, &made, &|_| {}, &cancel),
            };
            // Python policies' hooks run on threads that keep their Python thread state.
            let r = if python { crate::policy::with_python_threads(replay) } else { replay() };
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
            .find(|b| {
                b.policy == "belady" && b.prefetcher == r.prefetcher && b.device_buffer_size == r.device_buffer_size
            })
            .map(|b| b.swap.misses)
    };
    let mut rows = Vec::new();
    for r in report.results.iter().filter(|r| r.policy != "compulsory") {
        let d = PyDict::new(py);
        d.set_item("policy", &r.policy)?;
        d.set_item("prefetcher", &r.prefetcher)?;
        d.set_item("buffer", r.device_buffer_size)?;
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
