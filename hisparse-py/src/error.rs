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
