//! Errors as Python exceptions: a bad argument is a `ValueError` or `TypeError` whose message
//! begins with the argument's name; a file that cannot be read or written an `OSError`
//! (`FileExistsError` for an existing output); a corrupt trace a `ValueError` naming where.

use hisparse_policy::PolicyError;
use pyo3::PyErr;
use pyo3::exceptions::{PyFileExistsError, PyOSError, PyTypeError, PyValueError};

/// `ValueError("{arg}: {message}")`.
pub fn value(arg: &str, message: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{arg}: {message}"))
}

/// `TypeError("{arg}: {message}")`.
pub fn kind(arg: &str, message: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!("{arg}: {message}"))
}

/// `FileExistsError` for an output that exists.
pub fn exists(path: &std::path::Path) -> PyErr {
    PyFileExistsError::new_err(format!("{}: exists (pass overwrite=True to replace it)", path.display()))
}

/// `OSError` naming the file.
pub fn io(path: &std::path::Path, e: std::io::Error) -> PyErr {
    PyOSError::new_err(format!("{}: {e}", path.display()))
}

/// A simulator or trace error, the argument `arg` named: reading and parsing errors of a file
/// are `ValueError`s naming the file and offset, the simulator's field names mapped to the
/// Python arguments.
pub fn policy(arg: &str, e: PolicyError) -> PyErr {
    match e {
        PolicyError::Invalid { field, value, reason } => {
            let name = match field {
                "buffer_sizes" => "buffers",
                "policies" => "policies",
                "prefetchers" => "prefetchers",
                other => other,
            };
            PyValueError::new_err(format!("{name}: {value}: {reason}"))
        }
        other => PyValueError::new_err(format!("{arg}: {other}")),
    }
}

/// The integer argument `arg` as a `T` in `0..=max`: a `TypeError` naming it unless it is an
/// int (a bool is not), a `ValueError` naming it and its value outside the range (never a bare
/// `OverflowError`, never a wrapped value).
pub fn uint<T: TryFrom<u64>>(arg: &str, v: &pyo3::Bound<'_, pyo3::PyAny>, max: u64) -> pyo3::PyResult<T> {
    use pyo3::types::{PyAnyMethods, PyBool, PyInt, PyTypeMethods};
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        let t = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(kind(arg, format!("{t}; expected an int")));
    }
    let out_of_range =
        || value(arg, format!("{}: must be in 0..={max}", v.str().map(|s| s.to_string()).unwrap_or_default()));
    let n: i128 = v.extract().map_err(|_| out_of_range())?;
    u64::try_from(n).ok().filter(|&n| n <= max).and_then(|n| T::try_from(n).ok()).ok_or_else(out_of_range)
}
