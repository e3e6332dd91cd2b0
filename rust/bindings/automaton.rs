//! `Automaton` for Python: a frozen wrapper whose state sits behind a read-write lock, so that
//! many requests can draft from one shared automaton at once (readers), while `extend` and the
//! recency updates that follow a read take the write lock briefly.

use std::path::PathBuf;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple, PyType};

use super::arrays::{Int, at_least, token_arg, token_id};
use super::errors::{memory_error, type_error, value_error};
use super::signature::{Given, Signature, no_arguments, or_default, unless_none};
use super::tree::PyDraftTree;
use crate::automaton::{Automaton, write_atomic};
use crate::error::Error;

/// Inputs shorter than this are processed without releasing the GIL (the handoff costs more).
const DETACH_MIN_TOKENS: usize = 64;

/// Aho-Corasick automaton over the token stream with LRU eviction under a node budget.
#[pyclass(name = "Automaton", module = "racer_rs", frozen)]
pub struct PyAutomaton {
    pub(crate) inner: RwLock<Automaton>,
}

impl From<Automaton> for PyAutomaton {
    fn from(a: Automaton) -> Self {
        Self {
            inner: RwLock::new(a),
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// A `str` or `os.PathLike` argument.
fn path_arg(obj: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    obj.extract::<PathBuf>().map_err(|_| {
        type_error(format!(
            "path: expected a str or os.PathLike, got {}",
            type_name(obj)
        ))
    })
}

#[pymethods]
impl PyAutomaton {
    #[new]
    #[pyo3(signature = (ngram = Given::MISSING, max_nodes = Given::MISSING, min_depth = Given::MISSING, /, *extra, capacity = None, **kwargs))]
    #[pyo3(text_signature = "(ngram=10, max_nodes=None, min_depth=2, *, capacity=None)")]
    fn py_new(
        ngram: Given<'_>,
        max_nodes: Given<'_>,
        min_depth: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        capacity: Option<Int>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<0, 3> = Signature::new(
            "Automaton",
            [],
            ["ngram", "max_nodes", "min_depth"],
            &["capacity"],
        );
        let ([], [ngram, max_nodes, min_depth]) =
            SIGNATURE.bind([], [ngram, max_nodes, min_depth], extra, kwargs)?;
        let ngram = at_least(or_default(ngram.as_ref(), Int::of(10))?, 2, "ngram")?;
        let max_nodes: Option<Int> = unless_none(max_nodes).map(|m| m.extract()).transpose()?;
        let min_depth = or_default(min_depth.as_ref(), Int::of(2))?;
        // `capacity` is the node budget's earlier name, kept as an alias.
        let (name, budget) = match (max_nodes, capacity) {
            (Some(_), Some(_)) => {
                return Err(value_error(
                    "max_nodes",
                    "given twice (capacity is its alias)",
                ));
            }
            (Some(n), None) => ("max_nodes", n),
            (None, Some(c)) => ("capacity", c),
            (None, None) => ("max_nodes", Int::of(10_000)),
        };
        let capacity = at_least(budget, 1, name)?;
        let min_depth = at_least(min_depth, 1, "min_depth")?;
        let automaton = Automaton::new(ngram, capacity, min_depth).map_err(|e| match e {
            // Name the budget as the caller spelled it.
            Error::InvalidArgument { arg, msg } if arg == "max_nodes" => Error::InvalidArgument {
                arg: name.into(),
                msg,
            },
            other => other,
        })?;
        Ok(automaton.into())
    }

    #[getter]
    fn ngram(&self) -> usize {
        self.inner.read().ngram()
    }

    /// The node budget (LRU eviction beyond it).
    #[getter]
    fn max_nodes(&self) -> usize {
        self.inner.read().capacity()
    }

    /// The node budget: `max_nodes`'s earlier name.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.read().capacity()
    }

    #[getter]
    fn min_depth(&self) -> usize {
        self.inner.read().min_depth()
    }

    #[getter]
    fn match_length(&self) -> usize {
        self.inner.read().match_length()
    }

    fn __len__(&self) -> usize {
        self.inner.read().len()
    }

    fn __repr__(&self) -> String {
        let a = self.inner.read();
        format!(
            "Automaton(ngram={}, max_nodes={}, min_depth={}, nodes={})",
            a.ngram(),
            a.capacity(),
            a.min_depth(),
            a.len()
        )
    }

    /// Append tokens to the context (zero-copy for contiguous int32 arrays; the array must
    /// not be mutated while the call runs).
    #[pyo3(signature = (tokens = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, tokens)")]
    fn extend(
        &self,
        py: Python<'_>,
        tokens: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<1, 0> = Signature::new("Automaton.extend", ["tokens"], [], &[]);
        let ([tokens], []) = SIGNATURE.bind([tokens], [], extra, kwargs)?;
        let t = token_arg(&tokens, "tokens")?;
        let slice = t.as_slice();
        if slice.len() < DETACH_MIN_TOKENS {
            // Without waiting for the lock while holding the GIL: a busy automaton (another
            // thread's long extend or build) is waited for with the GIL released.
            if let Some(mut a) = self.inner.try_write() {
                return Ok(a.extend(slice)?);
            }
        }
        Ok(py.detach(|| self.inner.write().extend(slice))?)
    }

    /// Append tokens to the sequence whose last tokens are `lead`, in place of the current
    /// one (a shared index fed by many running requests in turns; see the stub).
    #[pyo3(signature = (lead = Given::MISSING, tokens = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, lead, tokens)")]
    fn extend_after(
        &self,
        py: Python<'_>,
        lead: Given<'_>,
        tokens: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<2, 0> =
            Signature::new("Automaton.extend_after", ["lead", "tokens"], [], &[]);
        let ([lead, tokens], []) = SIGNATURE.bind([lead, tokens], [], extra, kwargs)?;
        let l = token_arg(&lead, "lead")?;
        let t = token_arg(&tokens, "tokens")?;
        let (lead, tokens) = (l.as_slice(), t.as_slice());
        if tokens.len() < DETACH_MIN_TOKENS {
            if let Some(mut a) = self.inner.try_write() {
                return Ok(a.extend_after(lead, tokens)?);
            }
        }
        Ok(py.detach(|| self.inner.write().extend_after(lead, tokens))?)
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn new_sequence(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        no_arguments("Automaton.new_sequence").bind_none(extra, kwargs)?;
        self.inner.write().new_sequence();
        Ok(())
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn clear(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        no_arguments("Automaton.clear").bind_none(extra, kwargs)?;
        self.inner.write().clear();
        Ok(())
    }

    #[pyo3(signature = (pattern = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, pattern)")]
    fn count(
        &self,
        pattern: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<u64> {
        const SIGNATURE: Signature<1, 0> = Signature::new("Automaton.count", ["pattern"], [], &[]);
        let ([pattern], []) = SIGNATURE.bind([pattern], [], extra, kwargs)?;
        let p = token_arg(&pattern, "pattern")?;
        Ok(self.inner.read().count(p.as_slice())?)
    }

    /// The longest-match chain rooted at ``next_token``: at most ``max_len`` tokens, each the
    /// continuation that most often followed the longest matched string, as a one-path
    /// ``DraftTree`` (see the Rust ``Automaton::chain``). With ``context``, for that context
    /// instead of the automaton's own (read-only, as ``retrieve``).
    #[pyo3(signature = (next_token = Given::MISSING, max_len = Given::MISSING, context = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, next_token, max_len, context=None)")]
    fn chain(
        &self,
        py: Python<'_>,
        next_token: Given<'_>,
        max_len: Given<'_>,
        context: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDraftTree> {
        const SIGNATURE: Signature<2, 1> = Signature::new(
            "Automaton.chain",
            ["next_token", "max_len"],
            ["context"],
            &[],
        );
        let ([next_token, max_len], [context]) =
            SIGNATURE.bind([next_token, max_len], [context], extra, kwargs)?;
        let next_token = token_id(next_token.extract()?, "next_token")?;
        let max_len = at_least(max_len.extract()?, 0, "max_len")?;
        let Some(context) = unless_none(context) else {
            let tree = py.detach(|| self.inner.write().chain(next_token, max_len))?;
            return Ok(tree.into());
        };
        let c = token_arg(&context, "context")?;
        let slice = c.as_slice();
        let tree = py.detach(|| {
            let (tree, recency) = self.inner.read().chain_after(slice, next_token, max_len)?;
            if !recency.is_empty() {
                self.inner.write().touch(&recency);
            }
            Ok::<_, crate::Error>(tree)
        })?;
        Ok(tree.into())
    }

    #[pyo3(signature = (next_token = Given::MISSING, budget = Given::MISSING, context = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, next_token, budget, context=None)")]
    fn retrieve(
        &self,
        py: Python<'_>,
        next_token: Given<'_>,
        budget: Given<'_>,
        context: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDraftTree> {
        const SIGNATURE: Signature<2, 1> = Signature::new(
            "Automaton.retrieve",
            ["next_token", "budget"],
            ["context"],
            &[],
        );
        let ([next_token, budget], [context]) =
            SIGNATURE.bind([next_token, budget], [context], extra, kwargs)?;
        let next_token = token_id(next_token.extract()?, "next_token")?;
        let budget = at_least(budget.extract()?, 1, "budget")?;
        let Some(context) = unless_none(context) else {
            let tree = py.detach(|| self.inner.write().retrieve(next_token, budget))?;
            return Ok(tree.into());
        };
        let c = token_arg(&context, "context")?;
        let slice = c.as_slice();
        let tree = py.detach(|| {
            // Read under the shared lock, then refresh recency under the write lock.
            let (tree, recency) = self
                .inner
                .read()
                .retrieve_after(slice, next_token, budget)?;
            if !recency.is_empty() {
                self.inner.write().touch(&recency);
            }
            Ok::<_, crate::Error>(tree)
        })?;
        Ok(tree.into())
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn memory_bytes(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<usize> {
        no_arguments("Automaton.memory_bytes").bind_none(extra, kwargs)?;
        Ok(self.inner.read().memory_bytes())
    }

    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn check_integrity(
        &self,
        py: Python<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        no_arguments("Automaton.check_integrity").bind_none(extra, kwargs)?;
        Ok(py.detach(|| self.inner.read().check_integrity())?)
    }

    /// Write the automaton to ``path`` atomically (temporary file, fsync, rename).
    #[pyo3(signature = (path = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, path)")]
    fn save(
        &self,
        py: Python<'_>,
        path: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<1, 0> = Signature::new("Automaton.save", ["path"], [], &[]);
        let ([path], []) = SIGNATURE.bind([path], [], extra, kwargs)?;
        let path = path_arg(&path)?;
        py.detach(|| {
            // Snapshot under the read lock; the disk write does not block writers.
            let image = self.inner.read().try_to_bytes()?;
            write_atomic(&path, &image)
        })?;
        Ok(())
    }

    /// Read an automaton written by ``save``.
    #[classmethod]
    #[pyo3(signature = (path = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($cls, path)")]
    fn load(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<1, 0> = Signature::new("Automaton.load", ["path"], [], &[]);
        let ([path], []) = SIGNATURE.bind([path], [], extra, kwargs)?;
        let path = path_arg(&path)?;
        Ok(py.detach(|| Automaton::load(&path))?.into())
    }

    /// The automaton's image, as ``save`` writes it.
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn to_bytes<'py>(
        &self,
        py: Python<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        no_arguments("Automaton.to_bytes").bind_none(extra, kwargs)?;
        self.image(py)
    }

    /// Rebuild an automaton from ``to_bytes`` output.
    #[classmethod]
    #[pyo3(signature = (data = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($cls, data)")]
    fn from_bytes(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        data: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<1, 0> =
            Signature::new("Automaton.from_bytes", ["data"], [], &[]);
        let ([data], []) = SIGNATURE.bind([data], [], extra, kwargs)?;
        // A bytearray is copied into bytes by Python (a failed allocation is a MemoryError
        // there; PyO3's own copy would abort the process).
        let data = match data.cast::<PyByteArray>() {
            Ok(array) => py
                .get_type::<PyBytes>()
                .call1((array,))
                .map_err(|e| memory_error(py, e, "a copy of data", array.len()))?,
            Err(_) => data,
        };
        let data: PyBackedBytes = data.extract().map_err(|_| {
            type_error(format!(
                "data: expected bytes or bytearray, got {}",
                type_name(&data)
            ))
        })?;
        Ok(py.detach(|| Automaton::from_bytes(&data))?.into())
    }

    /// Pickle support: ``Automaton.from_bytes(self.to_bytes())``.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let from_bytes = slf.get_type().getattr("from_bytes")?;
        let image = slf.get().image(py)?;
        (from_bytes, (image,)).into_pyobject(py)
    }
}

impl PyAutomaton {
    /// The image as Python bytes; a failed allocation (the image's or the bytes') is an
    /// `OutOfMemoryError`.
    fn image<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let image = py.detach(|| self.inner.read().try_to_bytes())?;
        PyBytes::new_with(py, image.len(), |bytes| {
            bytes.copy_from_slice(&image);
            Ok(())
        })
        .map_err(|e| memory_error(py, e, "an automaton's image", image.len()))
    }
}
