//! Mapping of core errors to Python exceptions.

use pyo3::PyErr;
use pyo3::exceptions::{PyRuntimeError, PyValueError};

use crate::error::Error;

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument { .. } => PyValueError::new_err(e.to_string()),
            Error::Integrity(_) => PyRuntimeError::new_err(e.to_string()),
        }
    }
}

/// A `ValueError` whose message starts with the argument's name.
pub(crate) fn value_error(arg: &str, msg: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{arg}: {msg}"))
}
