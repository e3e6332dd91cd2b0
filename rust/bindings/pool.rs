//! `DraftPool` and `BatchDraft` for Python: argument conversion here, every check that
//! concerns a request in the core (`crate::pool`), one GIL release per call.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};

use super::arrays::{
    Flag, Int, Real, Text, Tokens, array1, at_least, converted, int_arg, native, prob_vector,
    topk_rows,
};
use super::automaton::PyAutomaton;
use super::errors::{type_error, value_error};
use super::logits_table::exempt;
use super::signature::{Given, Signature, no_arguments, unless_none};
use super::tree::PyDraftTree;
use crate::automaton::{Automaton, Recency};
use crate::pool::{
    BatchDraft, DraftPool, PROPOSE_REQUEST_UNITS, PoolOptions, RequestId, split_ragged,
};
use crate::tree::MAX_TREE_NODES;

/// Batches of fewer committed tokens are indexed without releasing the GIL.
const DETACH_MIN_TOKENS: usize = 64;
/// Batches of less drafting work (`PROPOSE_REQUEST_UNITS + capacity` per request, about 30 ns
/// a unit) are drafted without releasing the GIL: up to a few small trees.
const DETACH_MIN_UNITS: usize = 256;

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// A request id: a Python int (or numpy integer) within int64, or a str. `bool` is refused
/// (``True == 1`` would make two spellings of one key).
fn request_id(obj: &Bound<'_, PyAny>, arg: impl std::fmt::Display) -> PyResult<RequestId> {
    if obj.is_instance_of::<PyBool>() {
        return Err(type_error(format!(
            "{arg}: a request id must be an int or a str, got bool"
        )));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return s
            .to_str()
            .map(|s| RequestId::Str(s.to_owned()))
            .map_err(|_| value_error(&arg, "the str id is not valid Unicode (a lone surrogate)"));
    }
    match obj.extract::<i64>() {
        Ok(v) => Ok(RequestId::Int(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(value_error(
            &arg,
            format!("int id {obj} does not fit in int64"),
        )),
        Err(_) => Err(type_error(format!(
            "{arg}: a request id must be an int or a str, got {}",
            type_name(obj)
        ))),
    }
}

fn id_object<'py>(py: Python<'py>, id: &RequestId) -> PyResult<Bound<'py, PyAny>> {
    Ok(match id {
        RequestId::Int(v) => v.into_pyobject(py)?.into_any(),
        RequestId::Str(s) => PyString::new(py, s).into_any(),
    })
}

/// Refuse a str or bytes where a sequence of items is expected (both iterate).
fn not_text(obj: &Bound<'_, PyAny>, arg: &str, what: &str) -> PyResult<()> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(type_error(format!("{arg}: expected {what}, got a str")));
    }
    Ok(())
}

/// Every item of an iterable, or `InvalidTypeError` naming `arg` if it is none.
fn items<'py>(obj: &Bound<'py, PyAny>, arg: &str, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    not_text(obj, arg, what)?;
    let iter = obj
        .try_iter()
        .map_err(|_| type_error(format!("{arg}: expected {what}, got {}", type_name(obj))))?;
    // The caller's sequence sizes this buffer: it grows by fallible reservations (a list or a
    // tuple says its length up front).
    let mut out: Vec<Bound<'py, PyAny>> = Vec::new();
    let known = obj
        .cast::<PyList>()
        .map(|l| l.len())
        .or_else(|_| obj.cast::<PyTuple>().map(|t| t.len()));
    if let Ok(len) = known {
        out.try_reserve_exact(len)
            .map_err(|_| out_of_memory(arg, len))?;
    }
    for item in iter {
        if out.len() == out.capacity() {
            out.try_reserve(out.len().max(16))
                .map_err(|_| out_of_memory(arg, out.len()))?;
        }
        out.push(item?);
    }
    Ok(out)
}

fn out_of_memory(arg: &str, len: usize) -> PyErr {
    crate::error::Error::OutOfMemory {
        what: format!("the items of {arg}"),
        bytes: len.saturating_mul(2 * size_of::<usize>()),
    }
    .into()
}

fn request_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<RequestId>> {
    let items = items(obj, "ids", "a sequence of request ids (ints or strs)")?;
    let mut ids = crate::alloc::filled("ids", "the request ids", items.len(), RequestId::Int(0))?;
    for (i, (slot, item)) in ids.iter_mut().zip(&items).enumerate() {
        // The argument's name is only spelled out for an error.
        *slot = request_id(item, format_args!("ids[{i}]"))?;
    }
    Ok(ids)
}

/// `ids[i]` spelled for messages: `ids[3] ('req-7')`, or `ids[3]` past the end.
fn element(arg: &str, i: usize, ids: &[RequestId]) -> String {
    ElementName { arg, i, ids }.to_string()
}

/// [`element`] spelled out only when displayed (in an error), not for every item of a batch.
struct ElementName<'a> {
    arg: &'a str,
    i: usize,
    ids: &'a [RequestId],
}

impl std::fmt::Display for ElementName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { arg, i, ids } = self;
        match ids.get(*i) {
            Some(id) => write!(f, "{arg}[{i}] ({id})"),
            None => write!(f, "{arg}[{i}]"),
        }
    }
}

fn capacity_value(v: &Int, arg: impl FnOnce() -> String) -> PyResult<usize> {
    let name = arg();
    let v = v.get(&name)?;
    usize::try_from(v)
        .ok()
        .filter(|c| (1..=MAX_TREE_NODES).contains(c))
        .ok_or_else(|| value_error(&name, format!("must be in 1..={MAX_TREE_NODES}, got {v}")))
}

/// One node budget per request: an int for all, or one int per id.
fn capacities(obj: &Bound<'_, PyAny>, ids: &[RequestId]) -> PyResult<Vec<usize>> {
    let scalar = obj.extract::<Int>()?;
    if scalar.is_int() {
        let capacity = capacity_value(&scalar, || "capacity".into())?;
        return Ok(crate::alloc::filled(
            "capacity",
            "the capacities",
            ids.len(),
            capacity,
        )?);
    }
    let values = items(obj, "capacity", "an int or a sequence of ints (one per id)")?;
    if values.len() != ids.len() {
        return Err(value_error(
            "capacity",
            format!(
                "expected one entry per id ({}), got {}",
                ids.len(),
                values.len()
            ),
        ));
    }
    crate::alloc::try_collect(
        values
            .iter()
            .enumerate()
            .map(|(i, v)| capacity_value(&v.extract::<Int>()?, || element("capacity", i, ids))),
        "the capacities",
    )
}

/// A pool of per-request RACER states (automaton + copy-logit table), drafted in one call.
#[pyclass(name = "DraftPool", module = "racer_rs", frozen)]
pub struct PyDraftPool {
    inner: DraftPool,
}

#[pymethods]
impl PyDraftPool {
    #[new]
    #[pyo3(signature = (vocab_size = Given::MISSING, /, *extra, ngram = Int::of(10), max_nodes = Int::of(10_000), breadth = Int::of(8), min_depth = Int::of(2), exempt_depth = Int::of(1), tree = Text::of("halving"), min_score = Real::of(0.0), use_retrieval = Flag::of(true), use_logits = Flag::of(true), threads = Int::of(1), **kwargs))]
    #[pyo3(
        text_signature = "(vocab_size, *, ngram=10, max_nodes=10000, breadth=8, min_depth=2, exempt_depth=1, tree='halving', min_score=0.0, use_retrieval=True, use_logits=True, threads=1)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        vocab_size: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        ngram: Int,
        max_nodes: Int,
        breadth: Int,
        min_depth: Int,
        exempt_depth: Int,
        tree: Text,
        min_score: Real,
        use_retrieval: Flag,
        use_logits: Flag,
        threads: Int,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        const SIGNATURE: Signature<1, 0> = Signature::new(
            "DraftPool",
            ["vocab_size"],
            [],
            &[
                "ngram",
                "max_nodes",
                "breadth",
                "min_depth",
                "exempt_depth",
                "tree",
                "min_score",
                "use_retrieval",
                "use_logits",
                "threads",
            ],
        );
        let ([vocab_size], []) = SIGNATURE.bind([vocab_size], [], extra, kwargs)?;
        let vocab_size: Int = vocab_size.extract()?;
        let scored = tree.one_of("tree", &["halving", "scored"])? == "scored";
        let options = PoolOptions {
            vocab_size: at_least(vocab_size, 1, "vocab_size")?,
            ngram: at_least(ngram, 2, "ngram")?,
            max_nodes: at_least(max_nodes, 1, "max_nodes")?,
            breadth: at_least(breadth, 1, "breadth")?,
            min_depth: at_least(min_depth, 1, "min_depth")?,
            exempt_depth: exempt(exempt_depth)?,
            scored,
            #[allow(clippy::cast_possible_truncation)] // a threshold: f32 precision is plenty
            min_score: min_score.within("min_score", 0.0, 1.0)? as f32,
            use_retrieval: use_retrieval.get("use_retrieval")?,
            use_logits: use_logits.get("use_logits")?,
        };
        let threads = at_least(threads, 1, "threads")?;
        Ok(Self {
            inner: DraftPool::new(options, threads)?,
        })
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.options().vocab_size
    }

    #[getter]
    fn ngram(&self) -> usize {
        self.inner.options().ngram
    }

    #[getter]
    fn max_nodes(&self) -> usize {
        self.inner.options().max_nodes
    }

    #[getter]
    fn breadth(&self) -> usize {
        self.inner.options().breadth
    }

    #[getter]
    fn min_depth(&self) -> usize {
        self.inner.options().min_depth
    }

    #[getter]
    fn exempt_depth(&self) -> u32 {
        self.inner.options().exempt_depth
    }

    #[getter]
    fn tree(&self) -> &'static str {
        if self.inner.options().scored {
            "scored"
        } else {
            "halving"
        }
    }

    #[getter]
    fn min_score(&self) -> f32 {
        self.inner.options().min_score
    }

    #[getter]
    fn use_retrieval(&self) -> bool {
        self.inner.options().use_retrieval
    }

    #[getter]
    fn use_logits(&self) -> bool {
        self.inner.options().use_logits
    }

    /// Most threads one batch call uses, the calling thread included (>= 1).
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    #[setter]
    fn set_threads(&self, threads: Int) -> PyResult<()> {
        Ok(self.inner.set_threads(at_least(threads, 1, "threads")?)?)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, id: &Bound<'_, PyAny>) -> bool {
        request_id(id, "id").is_ok_and(|id| self.inner.contains(&id))
    }

    fn __repr__(&self) -> String {
        let o = self.inner.options();
        format!(
            "DraftPool(vocab_size={}, requests={}, tree='{}', breadth={}, threads={})",
            o.vocab_size,
            self.inner.len(),
            self.tree(),
            o.breadth,
            self.inner.threads()
        )
    }

    /// The request ids, in insertion order.
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn ids<'py>(
        &self,
        py: Python<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        no_arguments("DraftPool.ids").bind_none(extra, kwargs)?;
        let ids = self.inner.ids()?;
        list(py, ids.iter().map(|id| id_object(py, id)))
    }

    /// Approximate heap memory of every request's state, in bytes.
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn memory_bytes(
        &self,
        py: Python<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<usize> {
        no_arguments("DraftPool.memory_bytes").bind_none(extra, kwargs)?;
        Ok(py.detach(|| self.inner.memory_bytes()))
    }

    /// Remove every request.
    #[pyo3(signature = (*extra, **kwargs))]
    #[pyo3(text_signature = "($self)")]
    fn clear(
        &self,
        py: Python<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        no_arguments("DraftPool.clear").bind_none(extra, kwargs)?;
        py.detach(|| self.inner.clear());
        Ok(())
    }

    /// Start request ``id``: a new automaton indexing ``prompt_ids`` and an empty copy-logit
    /// table.
    #[pyo3(signature = (id = Given::MISSING, prompt_ids = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, id, prompt_ids)")]
    fn add(
        &self,
        py: Python<'_>,
        id: Given<'_>,
        prompt_ids: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<2, 0> =
            Signature::new("DraftPool.add", ["id", "prompt_ids"], [], &[]);
        let ([id, prompt_ids], []) = SIGNATURE.bind([id, prompt_ids], [], extra, kwargs)?;
        let id = request_id(&id, "id")?;
        let prompt = int_arg(&prompt_ids, &format!("prompt_ids ({id})"))?;
        let prompt = prompt.as_slice();
        Ok(py.detach(|| self.inner.add(id, prompt))?)
    }

    /// Forget request ``id``.
    #[pyo3(signature = (id = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, id)")]
    fn remove(
        &self,
        py: Python<'_>,
        id: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<1, 0> = Signature::new("DraftPool.remove", ["id"], [], &[]);
        let ([id], []) = SIGNATURE.bind([id], [], extra, kwargs)?;
        let id = request_id(&id, "id")?;
        Ok(py.detach(|| self.inner.remove(&id))?)
    }

    /// Append committed tokens to each request's context (``tokens[i]`` to ``ids[i]``).
    #[pyo3(signature = (ids = Given::MISSING, tokens = Given::MISSING, lengths = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, ids, tokens, lengths=None)")]
    fn extend(
        &self,
        py: Python<'_>,
        ids: Given<'_>,
        tokens: Given<'_>,
        lengths: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<2, 1> =
            Signature::new("DraftPool.extend", ["ids", "tokens"], ["lengths"], &[]);
        let ([ids, tokens], [lengths]) = SIGNATURE.bind([ids, tokens], [lengths], extra, kwargs)?;
        let tokens = &tokens;
        let ids = request_ids(&ids)?;
        if let Some(lengths) = unless_none(lengths) {
            let flat = int_arg(tokens, "tokens")?;
            let lengths = int_arg(&lengths, "lengths")?;
            let lengths = lengths.as_slice();
            let lengths: Vec<i64> = converted("lengths", lengths.len(), lengths.iter(), |&n| {
                Ok(i64::from(n))
            })?;
            let flat = flat.as_slice();
            return Ok(py.detach(|| {
                let parts = split_ragged(flat, &lengths, &ids)?;
                self.inner.extend(&ids, &parts)
            })?);
        }
        if let Ok(a) = tokens.cast::<numpy::PyUntypedArray>() {
            use numpy::PyUntypedArrayMethods;
            if a.ndim() == 1 {
                return Err(value_error(
                    "tokens",
                    "a flat array needs lengths= (one length per id); without it, pass one array per id",
                ));
            }
        }
        let items = items(
            tokens,
            "tokens",
            "one token array per id (or a flat array with lengths=)",
        )?;
        let parts: Vec<Tokens<'_>> = crate::alloc::try_collect(
            items.iter().enumerate().map(|(i, t)| {
                let ids = &ids[..];
                int_arg(
                    t,
                    &ElementName {
                        arg: "tokens",
                        i,
                        ids,
                    },
                )
            }),
            "the token arrays",
        )?;
        let slices = crate::alloc::collect(parts.iter().map(Tokens::as_slice), "the token arrays")?;
        // A few tokens are indexed at once: releasing the GIL would cost about as much.
        if slices.iter().map(|t| t.len()).sum::<usize>() < DETACH_MIN_TOKENS {
            return Ok(self.inner.extend(&ids, &slices)?);
        }
        Ok(py.detach(|| self.inner.extend(&ids, &slices))?)
    }

    /// Write copy-logit rows of request ``id`` (as ``LogitsTable.update``).
    #[pyo3(signature = (id = Given::MISSING, tokens = Given::MISSING, topk_ids = Given::MISSING, topk_probs = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, id, tokens, topk_ids, topk_probs=None)")]
    #[allow(clippy::too_many_arguments)]
    fn update_topk(
        &self,
        py: Python<'_>,
        id: Given<'_>,
        tokens: Given<'_>,
        topk_ids: Given<'_>,
        topk_probs: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<3, 1> = Signature::new(
            "DraftPool.update_topk",
            ["id", "tokens", "topk_ids"],
            ["topk_probs"],
            &[],
        );
        let ([id, tokens, topk_ids], [topk_probs]) =
            SIGNATURE.bind([id, tokens, topk_ids], [topk_probs], extra, kwargs)?;
        let id = request_id(&id, "id")?;
        let t = int_arg(&tokens, &format!("tokens ({id})"))?;
        let (ids, k, probs) = topk_rows(
            &topk_ids,
            unless_none(topk_probs),
            t.as_slice().len(),
            &format!("topk_ids ({id})"),
            &format!("topk_probs ({id})"),
        )?;
        let probs = probs.as_deref();
        let tokens = t.as_slice();
        Ok(py.detach(|| self.inner.update_topk(&id, tokens, &ids, k, probs))?)
    }

    /// Write copy-logit rows of several requests in one call (as ``update_topk`` per request).
    #[pyo3(signature = (ids = Given::MISSING, tokens = Given::MISSING, topk_ids = Given::MISSING, lengths = Given::MISSING, topk_probs = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, ids, tokens, topk_ids, lengths, topk_probs=None)")]
    #[allow(clippy::too_many_arguments)]
    fn update_topk_many(
        &self,
        py: Python<'_>,
        ids: Given<'_>,
        tokens: Given<'_>,
        topk_ids: Given<'_>,
        lengths: Given<'_>,
        topk_probs: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        const SIGNATURE: Signature<4, 1> = Signature::new(
            "DraftPool.update_topk_many",
            ["ids", "tokens", "topk_ids", "lengths"],
            ["topk_probs"],
            &[],
        );
        let ([ids, tokens, topk_ids, lengths], [topk_probs]) = SIGNATURE.bind(
            [ids, tokens, topk_ids, lengths],
            [topk_probs],
            extra,
            kwargs,
        )?;
        let ids = request_ids(&ids)?;
        let t = int_arg(&tokens, "tokens")?;
        let (rows, k, probs) = topk_rows(
            &topk_ids,
            unless_none(topk_probs),
            t.as_slice().len(),
            "topk_ids",
            "topk_probs",
        )?;
        let lengths = int_arg(&lengths, "lengths")?;
        let lengths = lengths.as_slice();
        let lengths: Vec<i64> = converted("lengths", lengths.len(), lengths.iter(), |&n| {
            Ok(i64::from(n))
        })?;
        let probs = probs.as_deref();
        let tokens = t.as_slice();
        // A step's rows are a few dozen: releasing the GIL would cost about as much.
        if tokens.len() < DETACH_MIN_TOKENS {
            return Ok(self
                .inner
                .update_topk_many(&ids, tokens, &rows, k, probs, &lengths)?);
        }
        Ok(py.detach(|| {
            self.inner
                .update_topk_many(&ids, tokens, &rows, k, probs, &lengths)
        })?)
    }

    /// Per request, its automaton's longest-match chain rooted at ``last_tokens[i]``
    /// (``Automaton.chain``), at most ``max_len`` tokens after the root, as one-path trees;
    /// with ``shared``, that automaton's chain after the request's latest tokens instead.
    #[pyo3(signature = (ids = Given::MISSING, last_tokens = Given::MISSING, max_len = Given::MISSING, /, *extra, shared = None, **kwargs))]
    #[pyo3(text_signature = "($self, ids, last_tokens, max_len, *, shared=None)")]
    #[allow(clippy::too_many_arguments)]
    fn retrieval_chains(
        &self,
        py: Python<'_>,
        ids: Given<'_>,
        last_tokens: Given<'_>,
        max_len: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        shared: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyBatchDraft> {
        const SIGNATURE: Signature<3, 0> = Signature::new(
            "DraftPool.retrieval_chains",
            ["ids", "last_tokens", "max_len"],
            [],
            &["shared"],
        );
        let ([ids, last_tokens, max_len], []) =
            SIGNATURE.bind([ids, last_tokens, max_len], [], extra, kwargs)?;
        let ids = request_ids(&ids)?;
        let last = int_arg(&last_tokens, "last_tokens")?;
        let max_len = at_least(max_len.extract()?, 0, "max_len")?;
        let shared = shared_arg(shared)?;
        let last = last.as_slice();
        let Some(shared) = shared.as_ref().map(Bound::get) else {
            let batch = py.detach(|| self.inner.retrieval_chains(&ids, last, max_len))?;
            return Ok(PyBatchDraft { inner: batch });
        };
        let batch = py.detach(|| {
            reading_shared(shared, |s| self.inner.shared_chains(&ids, last, max_len, s))
        })?;
        Ok(PyBatchDraft { inner: batch })
    }

    /// One draft tree per request, rooted at ``last_tokens[i]``, in one GIL release; with
    /// ``shared``, every request also drafts from that automaton (read, its recency refreshed).
    #[pyo3(signature = (ids = Given::MISSING, last_tokens = Given::MISSING, capacity = Given::MISSING, /, *extra, calibration = None, shared = None, **kwargs))]
    #[pyo3(
        text_signature = "($self, ids, last_tokens, capacity, *, calibration=None, shared=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn propose(
        &self,
        py: Python<'_>,
        ids: Given<'_>,
        last_tokens: Given<'_>,
        capacity: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        calibration: Option<&Bound<'_, PyAny>>,
        shared: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyBatchDraft> {
        const SIGNATURE: Signature<3, 0> = Signature::new(
            "DraftPool.propose",
            ["ids", "last_tokens", "capacity"],
            [],
            &["calibration", "shared"],
        );
        let ([ids, last_tokens, capacity], []) =
            SIGNATURE.bind([ids, last_tokens, capacity], [], extra, kwargs)?;
        let ids = request_ids(&ids)?;
        let last = int_arg(&last_tokens, "last_tokens")?;
        let caps = capacities(&capacity, &ids)?;
        let calibration = calibration
            .map(|c| prob_vector(c, "calibration"))
            .transpose()?;
        let shared = shared_arg(shared)?;
        let last = last.as_slice();
        let Some(shared) = shared.as_ref().map(Bound::get) else {
            // A batch of a few small trees is drafted at once: releasing the GIL would cost
            // about as much as a tree.
            let work = caps.iter().fold(0usize, |w, &c| {
                w.saturating_add(PROPOSE_REQUEST_UNITS.saturating_add(c))
            });
            if work < DETACH_MIN_UNITS {
                let batch = self
                    .inner
                    .propose(&ids, last, &caps, calibration.as_deref())?;
                return Ok(PyBatchDraft { inner: batch });
            }
            let batch = py.detach(|| {
                self.inner
                    .propose(&ids, last, &caps, calibration.as_deref())
            })?;
            return Ok(PyBatchDraft { inner: batch });
        };
        // The shared automaton's lock may be held by another thread: always release the GIL.
        let batch = py.detach(|| {
            reading_shared(shared, |s| {
                self.inner
                    .propose_shared(&ids, last, &caps, calibration.as_deref(), Some(s))
            })
        })?;
        Ok(PyBatchDraft { inner: batch })
    }
}

/// The ``shared`` keyword: an automaton, or ``None`` (given or not).
fn shared_arg<'py>(
    shared: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<Bound<'py, PyAutomaton>>> {
    shared
        .filter(|s| !s.is_none())
        .map(|s| native::<PyAutomaton>(s, "shared", "an Automaton or None"))
        .transpose()
}

/// A batch drafted from `shared` under its read lock, which covers the whole batch; the
/// recency of the nodes used is refreshed after, under the write lock alone (the pool's own
/// locks are private, so no lock order can be crossed).
fn reading_shared(
    shared: &PyAutomaton,
    draft: impl FnOnce(&Automaton) -> crate::Result<(BatchDraft, Vec<Recency>)>,
) -> crate::Result<BatchDraft> {
    let (batch, recency) = draft(&shared.inner.read())?;
    if recency.iter().any(|r| !r.is_empty()) {
        let mut s = shared.inner.write();
        for r in &recency {
            s.touch(r);
        }
    }
    Ok(batch)
}

/// The draft trees of one ``DraftPool.propose`` call, in the order of its ids.
#[pyclass(name = "BatchDraft", module = "racer_rs", frozen)]
pub struct PyBatchDraft {
    inner: BatchDraft,
}

fn int64_array(
    py: Python<'_>,
    v: impl ExactSizeIterator<Item = usize>,
) -> PyResult<Bound<'_, PyArray1<i64>>> {
    #[allow(clippy::cast_possible_wrap)] // node counts are far below 2**63
    let v = crate::alloc::collect(v.map(|x| x as i64), "the batch's counts")?;
    Ok(PyArray1::from_vec(py, v))
}

/// A Python list of `items` (one per request): built by appending, so that a list too large
/// for the memory left is a `MemoryError` from Python, never a panic.
fn list<'py>(
    py: Python<'py>,
    items: impl Iterator<Item = PyResult<Bound<'py, PyAny>>>,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for item in items {
        out.append(item?)?;
    }
    Ok(out)
}

#[pymethods]
impl PyBatchDraft {
    /// Not built from Python: `DraftPool.propose` returns one (an `InvalidTypeError` here, as
    /// for every call that cannot be bound, instead of PyO3's plain `TypeError`).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    #[pyo3(text_signature = "(*args, **kwargs)")]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Err(type_error(
            "BatchDraft() cannot be built directly: DraftPool.propose returns one".into(),
        ))
    }

    /// ``int32[total]``: every node's token, request after request.
    #[getter]
    fn tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        Ok(array1(py, self.inner.tokens()?))
    }

    /// ``int32[total]``: every node's parent, local to its request (``-1`` at each root).
    #[getter]
    fn parents<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        Ok(array1(py, self.inner.parents()?))
    }

    /// ``int32[total]``: every node's edge cell (``-1`` at each root).
    #[getter]
    fn cells<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        Ok(array1(py, self.inner.cells()?))
    }

    /// ``int64[bs]``: nodes per request (root included).
    #[getter]
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        int64_array(
            py,
            self.inner.trees().iter().map(crate::tree::DraftTree::len),
        )
    }

    /// ``int64[bs + 1]``: request ``i``'s nodes are ``offsets[i]:offsets[i + 1]``.
    #[getter]
    fn offsets<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        int64_array(py, self.inner.offsets().iter().copied())
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        let offsets = self.inner.offsets();
        format!(
            "BatchDraft(requests={}, nodes={})",
            self.inner.len(),
            offsets[offsets.len() - 1]
        )
    }

    /// Request ``i``'s tree (a copy; negative ``i`` counts from the end).
    #[pyo3(signature = (i = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, i)")]
    fn tree(
        &self,
        i: Given<'_>,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyDraftTree> {
        const SIGNATURE: Signature<1, 0> = Signature::new("BatchDraft.tree", ["i"], [], &[]);
        let ([i], []) = SIGNATURE.bind([i], [], extra, kwargs)?;
        let i: Int = i.extract()?;
        let bs = self.inner.len();
        #[allow(clippy::cast_possible_wrap)] // batches are far below 2**63
        let i = i.get("i")?;
        let index = if i < 0 { i + bs as i128 } else { i };
        usize::try_from(index)
            .ok()
            .and_then(|j| self.inner.trees().get(j))
            .map(|t| t.clone().into())
            .ok_or_else(|| value_error("i", format!("index {i} is outside -{bs}..{bs}")))
    }

    /// ``(tokens int64[bs * n], mask bool[bs * n * n])``: SGLang's n-gram layout.
    #[pyo3(signature = (n = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, n)")]
    fn sglang<'py>(
        &self,
        py: Python<'py>,
        n: Given<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        const SIGNATURE: Signature<1, 0> = Signature::new("BatchDraft.sglang", ["n"], [], &[]);
        let ([n], []) = SIGNATURE.bind([n], [], extra, kwargs)?;
        let n = at_least(n.extract()?, 1, "n")?;
        let (tokens, mask) = py.detach(|| self.inner.sglang(n))?;
        (PyArray1::from_vec(py, tokens), PyArray1::from_vec(py, mask)).into_pyobject(py)
    }

    /// ``(tokens int32[bs, k], cells int32[bs, k])``: ``chains(k)`` as a table, with each
    /// node's edge cell, ``-1`` past a chain's end.
    #[pyo3(signature = (k = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, k)")]
    fn chain_table<'py>(
        &self,
        py: Python<'py>,
        k: Given<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        const SIGNATURE: Signature<1, 0> = Signature::new("BatchDraft.chain_table", ["k"], [], &[]);
        let ([k], []) = SIGNATURE.bind([k], [], extra, kwargs)?;
        let k = at_least(k.extract()?, 0, "k")?;
        let bs = self.inner.trees().len();
        let (tokens, cells) = self.inner.chain_table(k)?;
        let tokens = PyArray1::from_vec(py, tokens).reshape([bs, k])?;
        let cells = PyArray1::from_vec(py, cells).reshape([bs, k])?;
        (tokens, cells).into_pyobject(py)
    }

    /// Per request, up to ``k`` tokens of the best root-to-leaf path after the root.
    #[pyo3(signature = (k = Given::MISSING, /, *extra, **kwargs))]
    #[pyo3(text_signature = "($self, k)")]
    fn chains<'py>(
        &self,
        py: Python<'py>,
        k: Given<'py>,
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        const SIGNATURE: Signature<1, 0> = Signature::new("BatchDraft.chains", ["k"], [], &[]);
        let ([k], []) = SIGNATURE.bind([k], [], extra, kwargs)?;
        let k = at_least(k.extract()?, 0, "k")?;
        let chains = self.inner.chains(k)?;
        list(py, chains.into_iter().map(|c| Ok(array1(py, c).into_any())))
    }
}
