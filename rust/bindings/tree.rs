//! `DraftTree` for Python.

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{array1, int_arg, no_unknown_keywords, token_arg};
use crate::tree::DraftTree;

/// A draft tree flattened in BFS order (root at index 0, parents before children).
#[pyclass(name = "DraftTree", module = "racer_rs", frozen)]
pub struct PyDraftTree {
    pub(crate) inner: DraftTree,
}

impl From<DraftTree> for PyDraftTree {
    fn from(inner: DraftTree) -> Self {
        Self { inner }
    }
}

#[pymethods]
impl PyDraftTree {
    #[new]
    #[pyo3(signature = (tokens, parents, cells = None, *extra, **unexpected))]
    #[pyo3(text_signature = "(tokens, parents, cells=None)")]
    fn py_new(
        tokens: &Bound<'_, PyAny>,
        parents: &Bound<'_, PyAny>,
        cells: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        unexpected: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        no_unknown_keywords("DraftTree", extra, unexpected, "tokens, parents, cells")?;
        let t = token_arg(tokens, "tokens")?.into_vec("tokens")?;
        let p = int_arg(parents, "parents")?.into_vec("parents")?;
        let tree = match cells {
            Some(c) => DraftTree::with_cells(t, p, int_arg(c, "cells")?.into_vec("cells")?)?,
            None => DraftTree::from_parents(t, p)?,
        };
        Ok(tree.into())
    }

    /// A chain tree: ``tokens[0]`` is the root, each next token the child of the previous.
    #[staticmethod]
    fn chain(tokens: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(DraftTree::chain(token_arg(tokens, "tokens")?.as_slice())?.into())
    }

    #[getter]
    fn tokens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        array1(py, self.inner.tokens().to_vec())
    }

    #[getter]
    fn parents<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        array1(py, self.inner.parents().to_vec())
    }

    #[getter]
    fn depths<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        array1(py, self.inner.depths().to_vec())
    }

    /// ``int32[n]``: every node's edge cell (``-1`` for the root).
    #[getter]
    fn cells<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        array1(py, self.inner.cells().to_vec())
    }

    #[getter]
    fn max_depth(&self) -> usize {
        self.inner.max_depth()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "DraftTree(nodes={}, max_depth={})",
            self.inner.len(),
            self.inner.max_depth()
        )
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let me = slf.get();
        let args = (me.tokens(py), me.parents(py), me.cells(py));
        (slf.get_type(), args).into_pyobject(py)
    }

    /// ``bool[n, n]``: row ``i`` marks the ancestors of ``i`` and ``i`` itself.
    fn attention_mask<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<bool>>> {
        let n = self.inner.len();
        PyArray1::from_vec(py, self.inner.attention_mask()?).reshape([n, n])
    }

    /// ``int32[leaves, max_depth + 1]``: root-to-leaf node indices padded with ``-1``.
    fn leaf_paths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let (data, rows, cols) = self.inner.leaf_paths()?;
        array1(py, data).reshape([rows, cols])
    }

    /// ``(path, bonus)``: the greedy walk over the target's per-node predictions.
    fn greedy_accept(&self, predicted: &Bound<'_, PyAny>) -> PyResult<(Vec<u32>, i32)> {
        Ok(self
            .inner
            .greedy_accept(token_arg(predicted, "predicted")?.as_slice())?)
    }
}
