//! `Automaton` for Python: a frozen wrapper whose state sits behind a mutex.

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::arrays::{Int, at_least, token_arg, token_id};
use super::errors::value_error;
use super::tree::PyDraftTree;
use crate::automaton::Automaton;
use crate::error::Error;

/// Inputs shorter than this are processed without releasing the GIL (the handoff costs more).
const DETACH_MIN_TOKENS: usize = 64;

/// Aho-Corasick automaton over the token stream with LRU eviction under a node budget.
#[pyclass(name = "Automaton", module = "racer_rs", frozen)]
pub struct PyAutomaton {
    pub(crate) inner: Mutex<Automaton>,
}

#[pymethods]
impl PyAutomaton {
    #[new]
    #[pyo3(signature = (ngram = Int(10), max_nodes = None, min_depth = Int(2), *, capacity = None))]
    #[pyo3(text_signature = "(ngram=10, max_nodes=None, min_depth=2, *, capacity=None)")]
    fn py_new(
        ngram: Int,
        max_nodes: Option<Int>,
        min_depth: Int,
        capacity: Option<Int>,
    ) -> PyResult<Self> {
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
            (None, None) => ("max_nodes", Int(10_000)),
        };
        let capacity = at_least(budget, 1, name)?;
        let min_depth = at_least(min_depth, 1, "min_depth")?;
        Ok(Self {
            inner: Mutex::new(
                Automaton::new(ngram, capacity, min_depth).map_err(|e| match e {
                    // Name the budget as the caller spelled it.
                    Error::InvalidArgument { arg, msg } if arg == "max_nodes" => {
                        Error::InvalidArgument {
                            arg: name.into(),
                            msg,
                        }
                    }
                    other => other,
                })?,
            ),
        })
    }

    #[getter]
    fn ngram(&self) -> usize {
        self.inner.lock().ngram()
    }

    /// The node budget (LRU eviction beyond it).
    #[getter]
    fn max_nodes(&self) -> usize {
        self.inner.lock().capacity()
    }

    /// The node budget: `max_nodes`'s earlier name.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.lock().capacity()
    }

    #[getter]
    fn min_depth(&self) -> usize {
        self.inner.lock().min_depth()
    }

    #[getter]
    fn match_length(&self) -> usize {
        self.inner.lock().match_length()
    }

    fn __len__(&self) -> usize {
        self.inner.lock().len()
    }

    fn __repr__(&self) -> String {
        let a = self.inner.lock();
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
            return Ok(self.inner.lock().extend(slice)?);
        }
        Ok(py.detach(|| self.inner.lock().extend(slice))?)
    }

    fn new_sequence(&self) {
        self.inner.lock().new_sequence();
    }

    fn clear(&self) {
        self.inner.lock().clear();
    }

    fn count(&self, pattern: &Bound<'_, PyAny>) -> PyResult<u64> {
        let p = token_arg(pattern, "pattern")?;
        Ok(self.inner.lock().count(p.as_slice())?)
    }

    fn retrieve(&self, py: Python<'_>, next_token: Int, budget: Int) -> PyResult<PyDraftTree> {
        let next_token = token_id(next_token, "next_token")?;
        let budget = at_least(budget, 1, "budget")?;
        let tree = py.detach(|| self.inner.lock().retrieve(next_token, budget))?;
        Ok(tree.into())
    }

    fn memory_bytes(&self) -> usize {
        self.inner.lock().memory_bytes()
    }

    fn check_integrity(&self, py: Python<'_>) -> PyResult<()> {
        Ok(py.detach(|| self.inner.lock().check_integrity())?)
    }
}
