//! Conversion of Python token inputs (lists or int32/int64 numpy arrays) and of outputs.

use numpy::{
    Element, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use super::errors::{type_error, value_error};

/// Token ids borrowed from a contiguous int32 array (zero-copy) or converted into a `Vec`.
pub(crate) enum Tokens<'py> {
    Borrowed(PyReadonlyArray1<'py, i32>),
    Owned(Vec<i32>),
}

impl Tokens<'_> {
    pub(crate) fn as_slice(&self) -> &[i32] {
        match self {
            // A contiguity check selected this variant, so `as_slice` cannot fail here.
            Self::Borrowed(a) => a.as_slice().unwrap_or(&[]),
            Self::Owned(v) => v,
        }
    }
}

fn to_i32(arg: &str, values: impl IntoIterator<Item = i64>) -> PyResult<Vec<i32>> {
    values
        .into_iter()
        .map(|v| {
            i32::try_from(v)
                .map_err(|_| value_error(arg, format!("value {v} does not fit in int32")))
        })
        .collect()
}

fn dtype_name(a: &Bound<'_, PyUntypedArray>) -> String {
    a.dtype()
        .str()
        .map_or_else(|_| "unknown".into(), |s| s.to_string())
}

/// Extract a 1-D sequence of token ids from a list/tuple of ints or an int32/int64 array.
pub(crate) fn token_arg<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<Tokens<'py>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if a.ndim() != 1 {
            return Err(value_error(
                arg,
                format!("expected a 1-D array, got shape {:?}", a.shape()),
            ));
        }
        if let Ok(a32) = obj.extract::<PyReadonlyArray1<'py, i32>>() {
            if a32.as_slice().is_ok() {
                return Ok(Tokens::Borrowed(a32));
            }
            return Ok(Tokens::Owned(a32.as_array().to_vec()));
        }
        if let Ok(a64) = obj.extract::<PyReadonlyArray1<'py, i64>>() {
            return Ok(Tokens::Owned(to_i32(arg, a64.as_array().iter().copied())?));
        }
        return Err(type_error(format!(
            "{arg}: expected an int32 or int64 array, got dtype {}",
            dtype_name(a)
        )));
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(type_error(format!(
            "{arg}: expected a sequence of ints, got a string"
        )));
    }
    let values: Vec<i64> = obj.extract().map_err(|_| {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string());
        type_error(format!(
            "{arg}: expected a sequence of ints or an int32/int64 array, got {ty}"
        ))
    })?;
    Ok(Tokens::Owned(to_i32(arg, values)?))
}

/// Extract a 2-D array of element type `Narrow` (taken as is) or `Wide` (converted by `narrow`)
/// as row-major `(data, rows, cols)`; `kinds` names the two dtypes in error messages.
fn matrix_of<Narrow: Element + Copy, Wide: Element + Copy>(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    kinds: &str,
    narrow: impl Fn(Vec<Wide>) -> PyResult<Vec<Narrow>>,
) -> PyResult<(Vec<Narrow>, usize, usize)> {
    let a = obj
        .cast::<PyUntypedArray>()
        .map_err(|_| type_error(format!("{arg}: expected a 2-D {kinds} numpy array")))?;
    if a.ndim() != 2 {
        return Err(value_error(
            arg,
            format!("expected a 2-D array, got shape {:?}", a.shape()),
        ));
    }
    let (n, k) = (a.shape()[0], a.shape()[1]);
    if let Ok(m) = obj.extract::<PyReadonlyArray2<'_, Narrow>>() {
        return Ok((m.as_array().iter().copied().collect(), n, k));
    }
    if let Ok(m) = obj.extract::<PyReadonlyArray2<'_, Wide>>() {
        return Ok((narrow(m.as_array().iter().copied().collect())?, n, k));
    }
    Err(type_error(format!(
        "{arg}: expected a {kinds} array, got dtype {}",
        dtype_name(a)
    )))
}

/// Extract an `[n, k]` int32/int64 array of token ids as row-major `(data, n, k)`.
pub(crate) fn matrix(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Vec<i32>, usize, usize)> {
    matrix_of::<i32, i64>(obj, arg, "int32 or int64", |wide| to_i32(arg, wide))
}

/// Extract an `[n, k]` float32/float64 array of probabilities as row-major `(data, n, k)`.
pub(crate) fn prob_matrix(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Vec<f32>, usize, usize)> {
    // Probabilities: f32 precision is plenty.
    #[allow(clippy::cast_possible_truncation)]
    matrix_of::<f32, f64>(obj, arg, "float32 or float64", |wide| {
        Ok(wide.into_iter().map(|p| p as f32).collect())
    })
}

/// Extract a 1-D float32/float64 array (or a list of floats) of probabilities.
pub(crate) fn prob_vector(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<f32>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if a.ndim() != 1 {
            return Err(value_error(
                arg,
                format!("expected a 1-D array, got shape {:?}", a.shape()),
            ));
        }
        if let Ok(v) = obj.extract::<PyReadonlyArray1<'_, f32>>() {
            return Ok(v.as_array().to_vec());
        }
        if let Ok(v) = obj.extract::<PyReadonlyArray1<'_, f64>>() {
            #[allow(clippy::cast_possible_truncation)] // probabilities: f32 precision is plenty
            return Ok(v.as_array().iter().map(|&p| p as f32).collect());
        }
        return Err(type_error(format!(
            "{arg}: expected a float32 or float64 array, got dtype {}",
            dtype_name(a)
        )));
    }
    let values: Vec<f64> = obj.extract().map_err(|_| {
        type_error(format!(
            "{arg}: expected a 1-D float array or a list of floats"
        ))
    })?;
    #[allow(clippy::cast_possible_truncation)]
    Ok(values.into_iter().map(|p| p as f32).collect())
}

/// A Python int argument that must be a token id (non-negative int32).
pub(crate) fn token_id(Int(value): Int, arg: &str) -> PyResult<i32> {
    i32::try_from(value)
        .ok()
        .filter(|&t| t >= 0)
        .ok_or_else(|| value_error(arg, format!("expected a token id in 0..2**31, got {value}")))
}

/// A Python int argument that must be at least `min`.
pub(crate) fn at_least(Int(value): Int, min: i64, arg: &str) -> PyResult<usize> {
    if value < min {
        return Err(value_error(arg, format!("must be >= {min}, got {value}")));
    }
    usize::try_from(value).map_err(|_| value_error(arg, format!("{value} is too large")))
}

/// A 1-D int32 numpy array that takes ownership of `v` (no copy).
pub(crate) fn array1<'py>(py: Python<'py>, v: Vec<i32>) -> Bound<'py, PyArray1<i32>> {
    PyArray1::from_vec(py, v)
}

/// A Python int argument. Values beyond int64 saturate, so the range checks that follow reject
/// them with the argument's name instead of raising `OverflowError`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int(pub(crate) i64);

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<i64>() {
            Ok(v) => Ok(Self(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Self(if obj.lt(0)? { i64::MIN } else { i64::MAX }))
            }
            Err(e) => Err(e),
        }
    }
}
