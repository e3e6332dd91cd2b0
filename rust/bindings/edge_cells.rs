//! `edge_cell_priors` for Python.

use numpy::PyArray1;
use pyo3::prelude::*;

use crate::edge_cells;

/// ``float32[EDGE_CELLS]``: the prior acceptance probability of every edge cell.
#[pyfunction]
pub(crate) fn edge_cell_priors(py: Python<'_>) -> Bound<'_, PyArray1<f32>> {
    PyArray1::from_vec(py, edge_cells::priors())
}
