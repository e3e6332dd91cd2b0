//! `Automaton` for Python: a frozen wrapper whose state sits behind a read-write lock, so that
//! many requests can draft from one shared automaton at once (readers), while `extend` and the
//! recency updates that follow a read take the write lock briefly.

use std::path::PathBuf;

use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict, PyTuple, PyType};

use super::arrays::{Int, at_least, no_unknown_keywords, token_arg, token_id};
use super::errors::{type_error, value_error};
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
    #[pyo3(signature = (ngram = Int::of(10), max_nodes = None, min_depth = Int::of(2), *extra, capacity = None, **unexpected))]
    #[pyo3(text_signature = "(ngram=10, max_nodes=None, min_depth=2, *, capacity=None)")]
    fn py_new(
        ngram: Int,
        max_nodes: Option<Int>,
        min_depth: Int,
        extra: &Bound<'_, PyTuple>,
        capacity: Option<Int>,
        unexpected: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        no_unknown_keywords(
            "Automaton",
            extra,
            unexpected,
            "ngram, max_nodes, min_depth, capacity",
        )?;
        let ngram = at_least(ngram, 2, "ngram")?;
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
    fn extend(&self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = token_arg(tokens, "tokens")?;
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

    fn new_sequence(&self) {
        self.inner.write().new_sequence();
    }

    fn clear(&self) {
        self.inner.write().clear();
    }

    fn count(&self, pattern: &Bound<'_, PyAny>) -> PyResult<u64> {
        let p = token_arg(pattern, "pattern")?;
        Ok(self.inner.read().count(p.as_slice())?)
    }

    #[pyo3(signature = (next_token, budget, context = None))]
    #[pyo3(text_signature = "(self, next_token, budget, context=None)")]
    fn retrieve(
        &self,
        py: Python<'_>,
        next_token: Int,
        budget: Int,
        context: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDraftTree> {
        let next_token = token_id(next_token, "next_token")?;
        let budget = at_least(budget, 1, "budget")?;
        let Some(context) = context else {
            let tree = py.detach(|| self.inner.write().retrieve(next_token, budget))?;
            return Ok(tree.into());
        };
        let c = token_arg(context, "context")?;
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

    fn memory_bytes(&self) -> usize {
        self.inner.read().memory_bytes()
    }

    fn check_integrity(&self, py: Python<'_>) -> PyResult<()> {
        Ok(py.detach(|| self.inner.read().check_integrity())?)
    }

    /// Write the automaton to ``path`` atomically (temporary file, fsync, rename).
    fn save(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        let path = path_arg(path)?;
        py.detach(|| {
            // Snapshot under the read lock; the disk write does not block writers.
            let image = self.inner.read().try_to_bytes()?;
            write_atomic(&path, &image)
        })?;
        Ok(())
    }

    /// Read an automaton written by ``save``.
    #[classmethod]
    fn load(_cls: &Bound<'_, PyType>, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Self> {
        let path = path_arg(path)?;
        Ok(py.detach(|| Automaton::load(&path))?.into())
    }

    /// The automaton's image, as ``save`` writes it.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let image = py.detach(|| self.inner.read().try_to_bytes())?;
        Ok(PyBytes::new(py, &image))
    }

    /// Rebuild an automaton from ``to_bytes`` output.
    #[classmethod]
    fn from_bytes(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let data: PyBackedBytes = data.extract().map_err(|_| {
            type_error(format!(
                "data: expected bytes or bytearray, got {}",
                type_name(data)
            ))
        })?;
        Ok(py.detach(|| Automaton::from_bytes(&data))?.into())
    }

    /// Pickle support: ``Automaton.from_bytes(self.to_bytes())``.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let from_bytes = slf.get_type().getattr("from_bytes")?;
        let image = slf.get().to_bytes(py)?;
        (from_bytes, (image,)).into_pyobject(py)
    }
}
