//! `edge_cell_priors` and `edge_cell_groups` for Python.

use numpy::PyArray1;
use pyo3::prelude::*;

use crate::edge_cells;

/// ``float32[EDGE_CELLS]``: the prior acceptance probability of every edge cell.
#[pyfunction]
pub(crate) fn edge_cell_priors(py: Python<'_>) -> Bound<'_, PyArray1<f32>> {
    PyArray1::from_vec(py, edge_cells::priors())
}

/// ``int32[EDGE_CELLS]``: the monotone group of every edge cell (-1: none).
#[pyfunction]
pub(crate) fn edge_cell_groups(py: Python<'_>) -> Bound<'_, PyArray1<i32>> {
    PyArray1::from_vec(py, edge_cells::monotone_groups())
}
