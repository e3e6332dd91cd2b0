//! The one map from core errors to Python exceptions: the classes of `racer_rs.errors`, each a
//! `RacerError` that is also the builtin a caller would catch (`ValueError`, `TypeError`, ...).

use pyo3::exceptions::{
    PyFileNotFoundError, PyIsADirectoryError, PyMemoryError, PyOSError, PyPermissionError,
    PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::error::Error;

static INVALID_ARGUMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INVALID_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static STATE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static CORRUPT_FILE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static OUT_OF_MEMORY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

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
            Error::CorruptFile { .. } => corrupt_file(e.to_string()),
            Error::OutOfMemory { .. } => racer_error(
                &OUT_OF_MEMORY,
                "OutOfMemoryError",
                PyMemoryError::new_err,
                e.to_string(),
            ),
            Error::Io {
                path,
                kind,
                errno,
                msg,
            } => os_error(&path, kind, errno, &msg),
        }
    }
}

/// `CorruptFileError` (an `InvalidArgumentError`, so a `ValueError`): a file or image is
/// truncated, damaged or of another format version; the message names it and what is wrong.
pub(crate) fn corrupt_file(msg: String) -> PyErr {
    racer_error(
        &CORRUPT_FILE,
        "CorruptFileError",
        PyValueError::new_err,
        msg,
    )
}

/// The `OSError` subclass Python itself raises for `errno` (`FileNotFoundError`,
/// `PermissionError`, `IsADirectoryError`, ...), with `filename` set to `path`.
fn os_error(path: &str, kind: std::io::ErrorKind, errno: Option<i32>, msg: &str) -> PyErr {
    use std::io::ErrorKind;
    let path = path.to_string();
    match errno {
        // `OSError(errno, strerror, filename)` picks the subclass from the errno.
        Some(errno) => Python::attach(|py| {
            match py
                .get_type::<PyOSError>()
                .call1((errno, msg.to_string(), path.clone()))
            {
                Ok(instance) => PyErr::from_value(instance),
                Err(_) => PyOSError::new_err(format!("{path}: {msg}")),
            }
        }),
        None => {
            let args = format!("{path}: {msg}");
            match kind {
                ErrorKind::NotFound => PyFileNotFoundError::new_err(args),
                ErrorKind::PermissionDenied => PyPermissionError::new_err(args),
                ErrorKind::IsADirectory => PyIsADirectoryError::new_err(args),
                _ => PyOSError::new_err(args),
            }
        }
    }
}

/// `err` as an `OutOfMemoryError` naming `what` and its size if it is Python's own
/// `MemoryError` (an object Python could not allocate); any other error unchanged.
pub(crate) fn memory_error(py: Python<'_>, err: PyErr, what: &str, bytes: usize) -> PyErr {
    if err.is_instance_of::<PyMemoryError>(py) {
        return Error::OutOfMemory {
            what: what.to_string(),
            bytes,
        }
        .into();
    }
    err
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
pub(crate) fn value_error(arg: impl std::fmt::Display, msg: impl std::fmt::Display) -> PyErr {
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
