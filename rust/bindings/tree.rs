//! `DraftTree` for Python.

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{array1, int_arg, token_arg};
use super::signature::{Given, Signature, no_arguments, unless_none};
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
    #[pyo3(signature = (tokens = Given::MISSING, parents = Given::MISSING, cells = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "(tokens, parents, cells=None)")]
    fn py_new(
        tokens: Given<'_>,
        parents: Given<'_>,
        cells: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<2, 1> =
            Signature::new("DraftTree", ["tokens", "parents"], ["cells"], &[]);
        let ([tokens, parents], [cells]) =
            SIGNATURE.bind([tokens, parents], [cells], extra, kwargs)?;
        let t = token_arg(&tokens, "tokens")?.into_vec("tokens")?;
        let p = int_arg(&parents, "parents")?.into_vec("parents")?;
        let tree = match unless_none(cells) {
            Some(c) => DraftTree::with_cells(t, p, int_arg(&c, "cells")?.into_vec("cells")?)?,
            None => DraftTree::from_parents(t, p)?,
        };
        Ok(tree.into())
    }

    /// A chain tree: ``tokens[0]`` is the root, each next token the child of the previous.
    #[staticmethod]
    #[pyo3(signature = (tokens = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "(tokens)")]
    fn chain(
        tokens: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<1, 0> = Signature::new("DraftTree.chain", ["tokens"], [], &[]);
        let ([tokens], []) = SIGNATURE.bind([tokens], [], extra, kwargs)?;
        Ok(DraftTree::chain(token_arg(&tokens, "tokens")?.as_slice())?.into())
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
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn attention_mask<'py>(
        &self,
        py: Python<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyArray2<bool>>> {
        no_arguments("DraftTree.attention_mask").bind_none(extra, kwargs)?;
        let n = self.inner.len();
        PyArray1::from_vec(py, self.inner.attention_mask()?).reshape([n, n])
    }

    /// ``int32[leaves, max_depth + 1]``: root-to-leaf node indices padded with ``-1``.
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn leaf_paths<'py>(
        &self,
        py: Python<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        no_arguments("DraftTree.leaf_paths").bind_none(extra, kwargs)?;
        let (data, rows, cols) = self.inner.leaf_paths()?;
        array1(py, data).reshape([rows, cols])
    }

    /// ``(path, bonus)``: the greedy walk over the target's per-node predictions.
    #[pyo3(signature = (predicted = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, predicted)")]
    fn greedy_accept(
        &self,
        predicted: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<(Vec<u32>, i32)> {
        const SIGNATURE: Signature<1, 0> =
            Signature::new("DraftTree.greedy_accept", ["predicted"], [], &[]);
        let ([predicted], []) = SIGNATURE.bind([predicted], [], extra, kwargs)?;
        Ok(self
            .inner
            .greedy_accept(token_arg(&predicted, "predicted")?.as_slice())?)
    }
}
