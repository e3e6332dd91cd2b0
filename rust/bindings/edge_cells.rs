//! `edge_cell_priors`, `edge_cell_groups`, `edge_cell_shared_counterparts` and the
//! calibration's `monotone_fit` for Python.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{float_vector, int_arg};
use super::signature::{Given, Signature, no_arguments};
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

/// ``float64[n]``: ``values`` made non-decreasing within each group of ``groups`` (``-1``:
/// none) by the weighted isotonic fit (pool adjacent violators), the GIL released.
#[pyfunction]
#[pyo3(signature = (values = Given::MISSING, weights = Given::MISSING, groups = Given::MISSING, /, *extra, **kwargs))]
#[pyo3(text_signature = "(values, weights, groups)")]
pub(crate) fn monotone_fit<'py>(
    py: Python<'py>,
    values: Given<'py>,
    weights: Given<'py>,
    groups: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    const SIGNATURE: Signature<3, 0> =
        Signature::new("monotone_fit", ["values", "weights", "groups"], [], &[]);
    let ([values, weights, groups], []) =
        SIGNATURE.bind([values, weights, groups], [], extra, kwargs)?;
    let values = float_vector(&values, "values")?;
    let weights = float_vector(&weights, "weights")?;
    let groups = int_arg(&groups, "groups")?;
    let groups = groups.as_slice();
    let fitted = py.detach(|| crate::isotonic::monotone_fit(&values, &weights, groups))?;
    Ok(PyArray1::from_vec(py, fitted))
}
