//! `prompt_lookup` for Python.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{Int, array1, at_least_or_unlimited, token_arg};
use super::signature::{Given, Signature};

/// Prompt lookup: the tokens that followed the latest earlier occurrence of the longest
/// matching context suffix n-gram (``max_ngram`` down to ``min_ngram``); empty if none.
#[pyfunction]
#[pyo3(signature = (context = Given::MISSING, /, *extra, max_ngram = Int::of(3), min_ngram = Int::of(1), num_pred = Int::of(10), **kwargs))]
#[pyo3(text_signature = "(context, *, max_ngram=3, min_ngram=1, num_pred=10)")]
pub(crate) fn prompt_lookup<'py>(
    py: Python<'py>,
    context: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    max_ngram: Int,
    min_ngram: Int,
    num_pred: Int,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    const SIGNATURE: Signature<1, 0> = Signature::new(
        "prompt_lookup",
        ["context"],
        [],
        &["max_ngram", "min_ngram", "num_pred"],
    );
    let ([context], []) = SIGNATURE.bind([context], [], extra, kwargs)?;
    let max_ngram = at_least_or_unlimited(max_ngram, 1, "max_ngram")?;
    let min_ngram = at_least_or_unlimited(min_ngram, 1, "min_ngram")?;
    let num_pred = at_least_or_unlimited(num_pred, 1, "num_pred")?;
    let ctx = token_arg(&context, "context")?;
    let slice = ctx.as_slice();
    let found =
        py.detach(|| crate::lookup::prompt_lookup(slice, max_ngram, min_ngram, num_pred))?;
    Ok(array1(py, found))
}
