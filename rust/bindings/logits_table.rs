//! `LogitsTable` for Python.

use numpy::PyArray1;
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{
    Int, array1, at_least, int_arg, matrix, no_unknown_keywords, prob_matrix, token_arg, token_id,
};
use super::tree::PyDraftTree;
use crate::logits_table::LogitsTable;

/// The copy-logit table: per token id, the target's top-k next tokens at its latest occurrence.
#[pyclass(name = "LogitsTable", module = "racer_rs", frozen)]
pub struct PyLogitsTable {
    pub(crate) inner: RwLock<LogitsTable>,
}

pub(crate) fn exempt(value: Int) -> PyResult<u32> {
    let value = value.get("exempt_depth")?;
    u32::try_from(value).map_err(|_| {
        super::errors::value_error("exempt_depth", format!("must be >= 0, got {value}"))
    })
}

/// A row accessor's token: a token id below the table's `vocab_size` (a row that does not exist
/// is an error; `None` means only "never written").
fn row_index(table: &LogitsTable, token: Int) -> PyResult<i32> {
    let token = token_id(token, "token")?;
    let vocab = table.vocab_size();
    if usize::try_from(token).is_ok_and(|t| t < vocab) {
        return Ok(token);
    }
    Err(super::errors::value_error(
        "token",
        format!("must be a token id in 0..{vocab} (the table's vocab_size), got {token}"),
    ))
}

#[pymethods]
impl PyLogitsTable {
    #[new]
    #[pyo3(signature = (vocab_size, top_k = Int::of(8), *extra, **unexpected))]
    #[pyo3(text_signature = "(vocab_size, top_k=8)")]
    fn py_new(
        vocab_size: Int,
        top_k: Int,
        extra: &Bound<'_, PyTuple>,
        unexpected: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        no_unknown_keywords("LogitsTable", extra, unexpected, "vocab_size, top_k")?;
        let vocab_size = at_least(vocab_size, 1, "vocab_size")?;
        let top_k = at_least(top_k, 1, "top_k")?;
        Ok(Self {
            inner: RwLock::new(LogitsTable::new(vocab_size, top_k)?),
        })
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.read().vocab_size()
    }

    #[getter]
    fn top_k(&self) -> usize {
        self.inner.read().top_k()
    }

    fn __len__(&self) -> usize {
        self.inner.read().rows_written()
    }

    fn __repr__(&self) -> String {
        let t = self.inner.read();
        format!(
            "LogitsTable(vocab_size={}, top_k={}, rows={})",
            t.vocab_size(),
            t.top_k(),
            t.rows_written()
        )
    }

    #[pyo3(signature = (tokens, topk_ids, topk_probs = None))]
    fn update(
        &self,
        tokens: &Bound<'_, PyAny>,
        topk_ids: &Bound<'_, PyAny>,
        topk_probs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let t = token_arg(tokens, "tokens")?;
        let (ids, n, k) = matrix(topk_ids, "topk_ids")?;
        if n != t.as_slice().len() {
            return Err(super::errors::value_error(
                "topk_ids",
                format!("has {n} rows but tokens has {} entries", t.as_slice().len()),
            ));
        }
        let probs = topk_probs
            .map(|p| prob_matrix(p, "topk_probs"))
            .transpose()?;
        if let Some((_, pn, pk)) = &probs {
            if (*pn, *pk) != (n, k) {
                return Err(super::errors::value_error(
                    "topk_probs",
                    format!("shape ({pn}, {pk}) differs from topk_ids ({n}, {k})"),
                ));
            }
        }
        let probs = probs.as_ref().map(|(p, _, _)| p.as_slice());
        Ok(self
            .inner
            .write()
            .update_with_probs(t.as_slice(), &ids, k, probs)?)
    }

    fn row_probs<'py>(
        &self,
        py: Python<'py>,
        token: Int,
    ) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let table = self.inner.read();
        let token = row_index(&table, token)?;
        Ok(table
            .row_probs(token)
            .map(|r| PyArray1::from_vec(py, r.to_vec())))
    }

    fn row<'py>(&self, py: Python<'py>, token: Int) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let table = self.inner.read();
        let token = row_index(&table, token)?;
        Ok(table.row(token).map(|r| array1(py, r.to_vec())))
    }

    fn clear(&self) {
        self.inner.write().clear();
    }

    fn memory_bytes(&self) -> usize {
        self.inner.read().memory_bytes()
    }

    #[pyo3(signature = (root, budget, exempt_depth = Int::of(1)))]
    #[pyo3(text_signature = "(self, root, budget, exempt_depth=1)")]
    fn expand(
        &self,
        py: Python<'_>,
        root: Int,
        budget: Int,
        exempt_depth: Int,
    ) -> PyResult<PyDraftTree> {
        let root = token_id(root, "root")?;
        let budget = at_least(budget, 1, "budget")?;
        let exempt_depth = exempt(exempt_depth)?;
        Ok(py
            .detach(|| self.inner.read().expand(root, budget, exempt_depth))?
            .into())
    }

    fn expand_static(
        &self,
        root: Int,
        parents: &Bound<'_, PyAny>,
        ranks: &Bound<'_, PyAny>,
    ) -> PyResult<PyDraftTree> {
        let root = token_id(root, "root")?;
        let p = int_arg(parents, "parents")?;
        let r = int_arg(ranks, "ranks")?;
        Ok(self
            .inner
            .read()
            .expand_static(root, p.as_slice(), r.as_slice())?
            .into())
    }
}
