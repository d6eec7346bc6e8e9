//! `hisparse._hisparse`, the Rust side of the Python package `hisparse`: selection traces
//! ([`trace::Trace`]: our files, NumPy arrays, SGLang's `indexer_topk`), the trace-driven
//! simulator ([`sim::simulate`]) and eviction policies written in Python ([`policy::PyPolicy`])
//! that it replays beside the built-ins. The pure-Python side (`python/hisparse/`) adds the
//! policy classes in libCacheSim's shape and miss-ratio curves.

use pyo3::prelude::*;

mod arrays;
mod error;
mod policy;
mod sim;
mod trace;

/// The extension module.
#[pymodule]
fn _hisparse(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<trace::Trace>()?;
    m.add_class::<policy::SlotEnv>()?;
    m.add_function(wrap_pyfunction!(sim::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(sim::builtin_policies, m)?)?;
    m.add_function(wrap_pyfunction!(sim::builtin_prefetchers, m)?)?;
    Ok(())
}
