//! `logits_summary` and `logits_topk` for Python.

use numpy::ndarray::Array2;
use numpy::{
    Element, IntoPyArray, PyArray1, PyArray2, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{Int, Real, at_least};
use super::errors::{type_error, value_error};
use super::signature::{Given, Signature, or_default};
use crate::alloc::filled;
use crate::logits_summary::{Logit, logits_summary as summarize, logits_topk as topk};

/// ``(ids, probs, greedy)``: the output arrays.
type Summary<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray2<f32>>,
    Bound<'py, PyArray1<i64>>,
);

/// The top-k ids of every row of ``logits`` (``[rows, V]``, float32 or bfloat16 bits as
/// uint16/int16, C-contiguous), their probabilities under ``softmax(logits * scale)`` and each
/// row's argmax (first index on ties), in one pass per row with the GIL released.
#[pyfunction]
#[pyo3(signature = (logits = Given::MISSING, k = Given::MISSING, scale = Given::MISSING, /, *extra, **kwargs))]
#[pyo3(text_signature = "(logits, k, scale=1.0)")]
pub(crate) fn logits_summary<'py>(
    py: Python<'py>,
    logits: Given<'py>,
    k: Given<'py>,
    scale: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Summary<'py>> {
    const SIGNATURE: Signature<2, 1> =
        Signature::new("logits_summary", ["logits", "k"], ["scale"], &[]);
    let ([logits, k], [scale]) = SIGNATURE.bind([logits, k], [scale], extra, kwargs)?;
    let k: Int = k.extract()?;
    let k = at_least(k, 1, "k")?;
    let scale = or_default(scale.as_ref(), Real::of(1.0))?;
    #[allow(clippy::cast_possible_truncation)] // a temperature's inverse: f32 is the kernel's
    let scale = scale.within("scale", 0.0, f64::from(f32::MAX))? as f32;
    let (ids, probs, greedy) = summary_of(py, &logits, k, Some(scale))?;
    let probs = probs.ok_or_else(|| value_error("logits", "no probabilities were computed"))?;
    Ok((ids, probs, greedy))
}

/// The top-k ids of every row of ``logits`` (as ``logits_summary``'s ``ids``, without
/// computing any probability), the GIL released.
#[pyfunction]
#[pyo3(signature = (logits = Given::MISSING, k = Given::MISSING, /, *extra, **kwargs))]
#[pyo3(text_signature = "(logits, k)")]
pub(crate) fn logits_topk<'py>(
    py: Python<'py>,
    logits: Given<'py>,
    k: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    const SIGNATURE: Signature<2, 0> = Signature::new("logits_topk", ["logits", "k"], [], &[]);
    let ([logits, k], []) = SIGNATURE.bind([logits, k], [], extra, kwargs)?;
    let k: Int = k.extract()?;
    let k = at_least(k, 1, "k")?;
    summary_of(py, &logits, k, None).map(|(ids, _, _)| ids)
}

/// ``(ids, probs, greedy)`` of ``logits`` of any accepted dtype; ``probs`` (and ``greedy``'s
/// meaning) only with a ``scale``.
type Partial<'py> = (
    Bound<'py, PyArray2<i64>>,
    Option<Bound<'py, PyArray2<f32>>>,
    Bound<'py, PyArray1<i64>>,
);

fn summary_of<'py>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    k: usize,
    scale: Option<f32>,
) -> PyResult<Partial<'py>> {
    let a = logits.cast::<PyUntypedArray>().map_err(|_| {
        type_error(format!(
            "logits: expected a 2-D float32, uint16 or int16 (bfloat16 bits) numpy array, got {}",
            logits
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    if a.ndim() != 2 {
        return Err(value_error(
            "logits",
            format!("expected a 2-D array, got shape {:?}", a.shape()),
        ));
    }
    if let Some(out) = typed::<f32>(py, logits, k, scale)? {
        return Ok(out);
    }
    if let Some(out) = typed::<u16>(py, logits, k, scale)? {
        return Ok(out);
    }
    if let Some(out) = typed::<i16>(py, logits, k, scale)? {
        return Ok(out);
    }
    Err(type_error(format!(
        "logits: expected a float32, uint16 or int16 (bfloat16 bits) array, got dtype {}",
        a.dtype()
            .str()
            .map_or_else(|_| "unknown".into(), |s| s.to_string())
    )))
}

/// The summary if `logits` is a 2-D array of `T`; `None` if it holds another dtype.
fn typed<'py, T: Logit + Element>(
    py: Python<'py>,
    logits: &Bound<'py, PyAny>,
    k: usize,
    scale: Option<f32>,
) -> PyResult<Option<Partial<'py>>> {
    let Ok(array) = logits.extract::<PyReadonlyArray2<'py, T>>() else {
        return Ok(None);
    };
    let (rows, vocab) = (array.shape()[0], array.shape()[1]);
    let not_c_contiguous = || {
        value_error(
            "logits",
            "must be C-contiguous (call np.ascontiguousarray or torch's .contiguous() first)",
        )
    };
    // `as_slice` takes a Fortran-ordered array too: its slice would be read column by column.
    if !array.is_c_contiguous() {
        return Err(not_c_contiguous());
    }
    let data = array.as_slice().map_err(|_| not_c_contiguous())?;
    if k > vocab {
        return Err(value_error(
            "k",
            format!("must be in [1, {vocab}] (the logits' last dimension), got {k}"),
        ));
    }
    let cells = rows
        .checked_mul(k)
        .ok_or_else(|| value_error("k", "too large"))?;
    let mut ids = filled("logits", "the top-k ids", cells, 0i64)?;
    let shape = (rows, k);
    let Some(scale) = scale else {
        py.detach(|| topk(data, rows, vocab, k, &mut ids))?;
        let ids = Array2::from_shape_vec(shape, ids).map_err(|e| value_error("k", e))?;
        let greedy = ids.column(0).to_vec();
        return Ok(Some((
            ids.into_pyarray(py),
            None,
            PyArray1::from_vec(py, greedy),
        )));
    };
    let mut probs = filled("logits", "the top-k probabilities", cells, 0f32)?;
    let mut greedy = filled("logits", "the argmaxes", rows, 0i64)?;
    py.detach(|| {
        summarize(
            data,
            rows,
            vocab,
            k,
            scale,
            &mut ids,
            &mut probs,
            &mut greedy,
        )
    })?;
    let ids = Array2::from_shape_vec(shape, ids).map_err(|e| value_error("k", e))?;
    let probs = Array2::from_shape_vec(shape, probs).map_err(|e| value_error("k", e))?;
    Ok(Some((
        ids.into_pyarray(py),
        Some(probs.into_pyarray(py)),
        PyArray1::from_vec(py, greedy),
    )))
}
