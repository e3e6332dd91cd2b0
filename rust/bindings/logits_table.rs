//! `LogitsTable` for Python.

use numpy::PyArray1;
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{Int, array1, at_least, int_arg, token_arg, token_id, topk_rows};
use super::signature::{Given, Signature, no_arguments, or_default, unless_none};
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
    #[pyo3(signature = (vocab_size = Given::MISSING, top_k = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "(vocab_size, top_k=8)")]
    fn py_new(
        vocab_size: Given<'_>,
        top_k: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<1, 1> =
            Signature::new("LogitsTable", ["vocab_size"], ["top_k"], &[]);
        let ([vocab_size], [top_k]) = SIGNATURE.bind([vocab_size], [top_k], extra, kwargs)?;
        let vocab_size = at_least(vocab_size.extract()?, 1, "vocab_size")?;
        let top_k = at_least(or_default(top_k.as_ref(), Int::of(8))?, 1, "top_k")?;
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

    #[pyo3(signature = (tokens = Given::MISSING, topk_ids = Given::MISSING, topk_probs = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, tokens, topk_ids, topk_probs=None)")]
    fn update(
        &self,
        tokens: Given<'_>,
        topk_ids: Given<'_>,
        topk_probs: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<2, 1> = Signature::new(
            "LogitsTable.update",
            ["tokens", "topk_ids"],
            ["topk_probs"],
            &[],
        );
        let ([tokens, topk_ids], [topk_probs]) =
            SIGNATURE.bind([tokens, topk_ids], [topk_probs], extra, kwargs)?;
        let t = token_arg(&tokens, "tokens")?;
        let (ids, k, probs) = topk_rows(
            &topk_ids,
            unless_none(topk_probs),
            t.as_slice().len(),
            "topk_ids",
            "topk_probs",
        )?;
        let probs = probs.as_deref();
        Ok(self
            .inner
            .write()
            .update_with_probs(t.as_slice(), &ids, k, probs)?)
    }

    #[pyo3(signature = (token = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, token)")]
    fn row_probs<'py>(
        &self,
        py: Python<'py>,
        token: Given<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        const SIGNATURE: Signature<1, 0> =
            Signature::new("LogitsTable.row_probs", ["token"], [], &[]);
        let ([token], []) = SIGNATURE.bind([token], [], extra, kwargs)?;
        let table = self.inner.read();
        let token = row_index(&table, token.extract()?)?;
        Ok(table
            .row_probs(token)
            .map(|r| PyArray1::from_vec(py, r.to_vec())))
    }

    #[pyo3(signature = (token = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, token)")]
    fn row<'py>(
        &self,
        py: Python<'py>,
        token: Given<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        const SIGNATURE: Signature<1, 0> = Signature::new("LogitsTable.row", ["token"], [], &[]);
        let ([token], []) = SIGNATURE.bind([token], [], extra, kwargs)?;
        let table = self.inner.read();
        let token = row_index(&table, token.extract()?)?;
        Ok(table.row(token).map(|r| array1(py, r.to_vec())))
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn clear(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        no_arguments("LogitsTable.clear").bind_none(extra, kwargs)?;
        self.inner.write().clear();
        Ok(())
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn memory_bytes(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<usize> {
        no_arguments("LogitsTable.memory_bytes").bind_none(extra, kwargs)?;
        Ok(self.inner.read().memory_bytes())
    }

    #[pyo3(signature = (root = Given::MISSING, budget = Given::MISSING, exempt_depth = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, root, budget, exempt_depth=1)")]
    fn expand(
        &self,
        py: Python<'_>,
        root: Given<'_>,
        budget: Given<'_>,
        exempt_depth: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDraftTree> {
        const SIGNATURE: Signature<2, 1> = Signature::new(
            "LogitsTable.expand",
            ["root", "budget"],
            ["exempt_depth"],
            &[],
        );
        let ([root, budget], [exempt_depth]) =
            SIGNATURE.bind([root, budget], [exempt_depth], extra, kwargs)?;
        let root = token_id(root.extract()?, "root")?;
        let budget = at_least(budget.extract()?, 1, "budget")?;
        let exempt_depth = exempt(or_default(exempt_depth.as_ref(), Int::of(1))?)?;
        Ok(py
            .detach(|| self.inner.read().expand(root, budget, exempt_depth))?
            .into())
    }

    #[pyo3(signature = (root = Given::MISSING, parents = Given::MISSING, ranks = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, root, parents, ranks)")]
    fn expand_static(
        &self,
        root: Given<'_>,
        parents: Given<'_>,
        ranks: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDraftTree> {
        const SIGNATURE: Signature<3, 0> = Signature::new(
            "LogitsTable.expand_static",
            ["root", "parents", "ranks"],
            [],
            &[],
        );
        let ([root, parents, ranks], []) =
            SIGNATURE.bind([root, parents, ranks], [], extra, kwargs)?;
        let root = token_id(root.extract()?, "root")?;
        let p = int_arg(&parents, "parents")?;
        let r = int_arg(&ranks, "ranks")?;
        Ok(self
            .inner
            .read()
            .expand_static(root, p.as_slice(), r.as_slice())?
            .into())
    }
}
