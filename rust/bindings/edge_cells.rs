//! `edge_cell_priors`, `edge_cell_groups` and `edge_cell_shared_counterparts` for Python.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::signature::no_arguments;
use crate::edge_cells;

/// ``float32[EDGE_CELLS]``: the prior acceptance probability of every edge cell.
#[pyfunction]
#[pyo3(signature = (*extra, **kwargs))]
#[pyo3(text_signature = "()")]
pub(crate) fn edge_cell_priors<'py>(
    py: Python<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    no_arguments("edge_cell_priors").bind_none(extra, kwargs)?;
    Ok(PyArray1::from_vec(py, edge_cells::priors()))
}

/// ``int32[EDGE_CELLS]``: every edge cell's counterpart for the same edge found in an automaton
/// shared across requests (a request's own retrieval cells move to the shared ones).
#[pyfunction]
#[pyo3(signature = (*extra, **kwargs))]
#[pyo3(text_signature = "()")]
pub(crate) fn edge_cell_shared_counterparts<'py>(
    py: Python<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    no_arguments("edge_cell_shared_counterparts").bind_none(extra, kwargs)?;
    Ok(PyArray1::from_vec(py, edge_cells::shared_counterparts()))
}

/// ``int32[EDGE_CELLS]``: the monotone group of every edge cell (-1: none).
#[pyfunction]
#[pyo3(signature = (*extra, **kwargs))]
#[pyo3(text_signature = "()")]
pub(crate) fn edge_cell_groups<'py>(
    py: Python<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    no_arguments("edge_cell_groups").bind_none(extra, kwargs)?;
    Ok(PyArray1::from_vec(py, edge_cells::monotone_groups()))
}
