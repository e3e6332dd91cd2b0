//! `choose_chains` and `chain_outcomes` for Python. Both run under the GIL: a step's tables
//! hold a few hundred entries, less work than releasing and taking it back.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{Int, Real, at_least, converted, float_vector, int_arg};
use super::errors::{type_error, value_error};
use super::signature::{Given, Signature, unless_none};
use crate::chains::{ChainTable, Sampled, StepCost, choose, outcomes};

/// A `[candidates, rows, k]` C-contiguous int32 array, borrowed.
fn table3<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<PyReadonlyArray3<'py, i32>> {
    let array: PyReadonlyArray3<'py, i32> = obj.extract().map_err(|_| {
        type_error(format!(
            "{arg}: expected an int32 array of shape [candidates, rows, k]"
        ))
    })?;
    if array.as_slice().is_err() {
        return Err(value_error(arg, "must be C-contiguous"));
    }
    Ok(array)
}

/// The table of `tokens` and `cells` (their shapes must match).
fn chain_table<'a>(
    tokens: &'a PyReadonlyArray3<'_, i32>,
    cells: &'a PyReadonlyArray3<'_, i32>,
) -> PyResult<ChainTable<'a>> {
    let shape = tokens.shape();
    if cells.shape() != shape {
        return Err(value_error(
            "cells",
            format!(
                "must have the shape of tokens {shape:?}, got {:?}",
                cells.shape()
            ),
        ));
    }
    // Both contiguous (checked by `table3`).
    Ok(ChainTable {
        tokens: tokens.as_slice().unwrap_or(&[]),
        cells: cells.as_slice().unwrap_or(&[]),
        candidates: shape[0],
        rows: shape[1],
        k: shape[2],
    })
}

/// A contiguous float32 array of edge probabilities, borrowed.
fn edges_arg<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, f32>> {
    let edges: PyReadonlyArray1<'py, f32> = obj
        .extract()
        .map_err(|_| type_error("edges: expected a 1-D float32 array".into()))?;
    if edges.as_slice().is_err() {
        return Err(value_error("edges", "must be contiguous"));
    }
    Ok(edges)
}

/// A step cost: `(a, b)` seconds per step and per verified token, or `(a, b, measured)` with
/// `measured[n]` the seconds of a step verifying `n` tokens (where measured).
fn step_cost_arg(given: &Bound<'_, PyAny>) -> PyResult<(f64, f64, Vec<f64>)> {
    const EXPECTED: &str =
        "cost: expected None, a pair (a, b) of step seconds or a triple (a, b, measured seconds)";
    let (a, b, measured) = if let Ok((a, b)) = given.extract::<(Real, Real)>() {
        (a, b, Vec::new())
    } else {
        let (a, b, measured): (Real, Real, Bound<'_, PyAny>) =
            given.extract().map_err(|_| type_error(EXPECTED.into()))?;
        (a, b, float_vector(&measured, "cost")?)
    };
    // The measured seconds are checked by `choose`.
    Ok((
        a.within("cost", f64::MIN_POSITIVE, f64::MAX)?,
        b.within("cost", 0.0, f64::MAX)?,
        measured,
    ))
}

/// Non-negative ints as `usize`.
fn counts(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<usize>> {
    let values = int_arg(obj, arg)?;
    let values = values.as_slice();
    converted(arg, values.len(), values.iter(), |&v| {
        usize::try_from(v).map_err(|_| value_error(arg, format!("must be >= 0, got {v}")))
    })
}

/// Counts or indices as an int64 array (each below the table's size, so none saturates).
fn int64_array(py: Python<'_>, values: Vec<usize>) -> Bound<'_, PyArray1<i64>> {
    let values = values
        .into_iter()
        .map(|x| i64::try_from(x).unwrap_or(i64::MAX))
        .collect();
    PyArray1::from_vec(py, values)
}

/// Each row's chosen candidate and how many of its tokens to draft.
type ChoiceArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

/// ``(best int64[rows], lengths int64[rows])``: each row's chosen candidate chain and how many
/// of its tokens to draft (see ``racer_rs._native.choose_chains`` in the stubs).
#[pyfunction]
#[pyo3(signature = (tokens = Given::MISSING, cells = Given::MISSING, edges = Given::MISSING, scales = Given::MISSING, budgets = Given::MISSING, requests = Given::MISSING, cost = Given::MISSING, /, *extra, **kwargs))]
#[pyo3(text_signature = "(tokens, cells, edges, scales, budgets, requests, cost)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose_chains<'py>(
    py: Python<'py>,
    tokens: Given<'py>,
    cells: Given<'py>,
    edges: Given<'py>,
    scales: Given<'py>,
    budgets: Given<'py>,
    requests: Given<'py>,
    cost: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<ChoiceArrays<'py>> {
    const SIGNATURE: Signature<7, 0> = Signature::new(
        "choose_chains",
        [
            "tokens", "cells", "edges", "scales", "budgets", "requests", "cost",
        ],
        [],
        &[],
    );
    let ([tokens, cells, edges, scales, budgets, requests, cost], []) = SIGNATURE.bind(
        [tokens, cells, edges, scales, budgets, requests, cost],
        [],
        extra,
        kwargs,
    )?;
    let (tokens, cells) = (table3(&tokens, "tokens")?, table3(&cells, "cells")?);
    let table = chain_table(&tokens, &cells)?;
    let edges = edges_arg(&edges)?;
    let scales = float_vector(&scales, "scales")?;
    let budgets = counts(&budgets, "budgets")?;
    let requests = at_least(requests.extract::<Int>()?, 0, "requests")?;
    let given = match unless_none(Some(cost)) {
        None => None,
        Some(given) => Some(step_cost_arg(&given)?),
    };
    let cost = given.as_ref().map(|(a, b, measured)| StepCost {
        a: *a,
        b: *b,
        measured,
    });
    let choice = choose(
        table,
        edges.as_slice().unwrap_or(&[]),
        &scales,
        &budgets,
        requests,
        cost,
    )?;
    Ok((
        int64_array(py, choice.best),
        int64_array(py, choice.lengths),
    ))
}

/// The outcome arrays: observed cells, whether each was accepted, committed and expected
/// drafted tokens per step.
type OutcomeArrays<'py> = (
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<bool>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<f64>>,
);

/// What the target's sampled tokens say about every candidate chain of the given rows (see
/// ``racer_rs._native.chain_outcomes`` in the stubs).
#[pyfunction]
#[pyo3(signature = (tokens = Given::MISSING, cells = Given::MISSING, edges = Given::MISSING, rows = Given::MISSING, best = Given::MISSING, drafted = Given::MISSING, sampled = Given::MISSING, /, *extra, **kwargs))]
#[pyo3(text_signature = "(tokens, cells, edges, rows, best, drafted, sampled)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chain_outcomes<'py>(
    py: Python<'py>,
    tokens: Given<'py>,
    cells: Given<'py>,
    edges: Given<'py>,
    rows: Given<'py>,
    best: Given<'py>,
    drafted: Given<'py>,
    sampled: Given<'py>,
    extra: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<OutcomeArrays<'py>> {
    const SIGNATURE: Signature<7, 0> = Signature::new(
        "chain_outcomes",
        [
            "tokens", "cells", "edges", "rows", "best", "drafted", "sampled",
        ],
        [],
        &[],
    );
    let ([tokens, cells, edges, rows, best, drafted, sampled], []) = SIGNATURE.bind(
        [tokens, cells, edges, rows, best, drafted, sampled],
        [],
        extra,
        kwargs,
    )?;
    let (tokens, cells) = (table3(&tokens, "tokens")?, table3(&cells, "cells")?);
    let table = chain_table(&tokens, &cells)?;
    let edges = edges_arg(&edges)?;
    let (rows, best, drafted) = (
        counts(&rows, "rows")?,
        counts(&best, "best")?,
        counts(&drafted, "drafted")?,
    );
    let sampled: Vec<Vec<i64>> = sampled
        .extract()
        .map_err(|_| type_error("sampled: expected a list of lists of ints".into()))?;
    if best.len() != rows.len() || drafted.len() != rows.len() || sampled.len() != rows.len() {
        return Err(value_error(
            "rows",
            format!(
                "rows, best, drafted and sampled must have one length, got {}, {}, {} and {}",
                rows.len(),
                best.len(),
                drafted.len(),
                sampled.len()
            ),
        ));
    }
    let steps: Vec<Sampled<'_>> = (0..rows.len())
        .map(|i| Sampled {
            row: rows[i],
            best: best[i],
            drafted: drafted[i],
            tokens: &sampled[i],
        })
        .collect();
    let out = outcomes(table, edges.as_slice().unwrap_or(&[]), &steps)?;
    Ok((
        PyArray1::from_vec(py, out.cells),
        PyArray1::from_vec(py, out.accepted),
        int64_array(py, out.committed),
        PyArray1::from_vec(py, out.expected),
    ))
}
