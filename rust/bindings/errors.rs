//! The one map from core errors to Python exceptions: the classes of `racer_rs.errors`, each a
//! `RacerError` that is also the builtin a caller would catch (`ValueError`, `TypeError`, ...).

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::Error;

static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static STATE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// An instance of `racer_rs.errors.<name>`; the builtin `fallback` only if that module cannot be
/// imported (it is pure Python beside the extension, so only a broken install gets there).
fn racer_error(
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    fallback: fn(String) -> PyErr,
    msg: String,
) -> PyErr {
    Python::attach(|py| match cell.import(py, "racer_rs.errors", name) {
        Ok(class) => PyErr::from_type(class.clone(), msg),
        Err(_) => fallback(msg),
    })
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument { .. } => invalid_argument(e.to_string()),
            Error::Integrity(_) => state_error(e.to_string()),
        }
    }
}

/// `InvalidArgumentError` (a `ValueError`) with the message as given.
pub(crate) fn invalid_argument(msg: String) -> PyErr {
    racer_error(
        &INVALID_ARGUMENT,
        "InvalidArgumentError",
        PyValueError::new_err,
        msg,
    )
}

/// `InvalidArgumentError` (a `ValueError`) whose message starts with the argument's name.
pub(crate) fn value_error(arg: &str, msg: impl std::fmt::Display) -> PyErr {
    invalid_argument(format!("{arg}: {msg}"))
}

/// `InvalidTypeError` (a `TypeError`) with the message as given.
pub(crate) fn type_error(msg: String) -> PyErr {
    racer_error(&INVALID_TYPE, "InvalidTypeError", PyTypeError::new_err, msg)
}

/// `StateError` (a `RuntimeError`): an object's state does not allow the call.
pub(crate) fn state_error(msg: String) -> PyErr {
    racer_error(&STATE, "StateError", PyRuntimeError::new_err, msg)
}
