//! Conversion of Python token inputs (lists or int32/int64 numpy arrays) and of outputs.

use numpy::{
    Element, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

use std::fmt::Display;

use super::errors::{type_error, value_error};

/// Int32 arrays up to this length are copied rather than borrowed (see [`int_arg`]).
const COPY_MAX_ELEMENTS: usize = 64;

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

    /// The ids as an owned vector (a borrowed array copied with a fallible allocation).
    pub(crate) fn into_vec(self, arg: &str) -> PyResult<Vec<i32>> {
        match self {
            Self::Borrowed(_) => {
                let slice = self.as_slice();
                converted(arg, slice.len(), slice.iter().copied(), Ok)
            }
            Self::Owned(v) => Ok(v),
        }
    }
}

/// The `len` items of `values`, each through `convert`, in a buffer from
/// [`crate::alloc::filled`]: every copy of a caller's argument is a fallible allocation, so one
/// too large for the memory left is an `OutOfMemoryError` (or an `InvalidArgumentError` past
/// 2**28 elements), never an abort.
pub(crate) fn converted<T, U: Clone + Default>(
    arg: &(impl Display + ?Sized),
    len: usize,
    values: impl IntoIterator<Item = T>,
    mut convert: impl FnMut(T) -> PyResult<U>,
) -> PyResult<Vec<U>> {
    let mut out = crate::alloc::filled("ids", format_args!("a copy of {arg}"), len, U::default())
        .map_err(|e| match e {
        crate::error::Error::InvalidArgument { msg, .. } => value_error(arg, msg),
        other => other.into(),
    })?;
    for (slot, value) in out.iter_mut().zip(values) {
        *slot = convert(value)?;
    }
    Ok(out)
}

fn to_i32<T: Copy + std::fmt::Display>(
    arg: &(impl Display + ?Sized),
    len: usize,
    values: impl IntoIterator<Item = T>,
) -> PyResult<Vec<i32>>
where
    i32: TryFrom<T>,
{
    converted(arg, len, values, |v| {
        i32::try_from(v).map_err(|_| value_error(arg, format!("value {v} does not fit in int32")))
    })
}

fn dtype_name(a: &Bound<'_, PyUntypedArray>) -> String {
    a.dtype()
        .str()
        .map_or_else(|_| "unknown".into(), |s| s.to_string())
}

/// A 1-D numpy array of another integer dtype than int32, range-checked element by element
/// before narrowing (so ``2**32 + 5`` is an error, never 5).
fn other_integer_array(
    obj: &Bound<'_, PyAny>,
    arg: &(impl Display + ?Sized),
) -> Option<PyResult<Vec<i32>>> {
    macro_rules! try_dtype {
        ($($t:ty),*) => {$(
            if let Ok(a) = obj.extract::<PyReadonlyArray1<'_, $t>>() {
                return Some(to_i32(arg, a.len(), a.as_array().iter().copied()));
            }
        )*};
    }
    try_dtype!(i64, u64, i16, u16, i8, u8, u32);
    None
}

/// Extract a 1-D sequence of ints from a list/tuple of ints or an integer numpy array (int32
/// borrowed without a copy when contiguous and longer than `COPY_MAX_ELEMENTS`; any other
/// integer dtype range-checked). Python bools are refused inside lists as they are as arrays
/// and scalars: `True` is not the int 1 here.
/// Negative values pass: this is the rule for parents, cells, ranks and lengths; token ids go
/// through [`token_arg`].
pub(crate) fn int_arg<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &(impl Display + ?Sized),
) -> PyResult<Tokens<'py>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if a.ndim() != 1 {
            return Err(value_error(
                arg,
                format!("expected a 1-D array, got shape {:?}", a.shape()),
            ));
        }
        if let Ok(a32) = obj.cast::<PyArray1<i32>>() {
            let len = a32.len();
            if len <= COPY_MAX_ELEMENTS {
                // Copied under the GIL, element by element: registering a numpy borrow and
                // releasing it costs more than copying a few ids (a decode step's extend).
                return Ok(Tokens::Owned(converted(arg, len, 0..len, |i| {
                    a32.get_owned(i)
                        .ok_or_else(|| value_error(arg, format!("index {i} out of bounds")))
                })?));
            }
        }
        if let Ok(a32) = obj.extract::<PyReadonlyArray1<'py, i32>>() {
            if a32.as_slice().is_ok() {
                return Ok(Tokens::Borrowed(a32));
            }
            return Ok(Tokens::Owned(converted(
                arg,
                a32.len(),
                a32.as_array().iter().copied(),
                Ok,
            )?));
        }
        if let Some(values) = other_integer_array(obj, arg) {
            return Ok(Tokens::Owned(values?));
        }
        return Err(type_error(format!(
            "{arg}: expected an integer array, got dtype {}",
            dtype_name(a)
        )));
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(type_error(format!(
            "{arg}: expected a sequence of ints, got a string"
        )));
    }
    let not_a_sequence = || {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string());
        type_error(format!(
            "{arg}: expected a sequence of ints or an integer array, got {ty}"
        ))
    };
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(Tokens::Owned(elements(list.iter(), arg)?));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(Tokens::Owned(elements(tuple.iter(), arg)?));
    }
    // Any other sequence: its items, then the same rule.
    let items: Vec<Bound<'py, PyAny>> = obj.extract().map_err(|_| not_a_sequence())?;
    Ok(Tokens::Owned(elements(items.into_iter(), arg)?))
}

/// The ints of a list's items, each one an int (never a bool) within int32; the buffer is a
/// fallible allocation (the length is the caller's).
fn elements<'py>(
    items: impl ExactSizeIterator<Item = Bound<'py, PyAny>>,
    arg: &(impl Display + ?Sized),
) -> PyResult<Vec<i32>> {
    let len = items.len();
    converted(arg, len, items.enumerate(), |(i, item)| {
        let v = match item.extract::<Int>()?.0 {
            Ok(v) => v,
            Err(ty) => return Err(type_error(format!("{arg}[{i}] must be an int, got {ty}"))),
        };
        i32::try_from(v).map_err(|_| value_error(arg, format!("value {v} does not fit in int32")))
    })
}

/// Token ids: [`int_arg`]'s sequences with every id non-negative (the one rule for every token
/// id argument of the bindings; each consumer checks its own upper bound, e.g. a vocabulary).
/// `DraftPool` takes [`int_arg`]'s and leaves the whole range `0..vocab_size` to its core, whose
/// messages name the request an id belongs to.
pub(crate) fn token_arg<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &(impl Display + ?Sized),
) -> PyResult<Tokens<'py>> {
    let tokens = int_arg(obj, arg)?;
    if let Some(i) = tokens.as_slice().iter().position(|&t| t < 0) {
        return Err(value_error(
            arg,
            format!(
                "token {} at index {i} is negative (token ids are >= 0)",
                tokens.as_slice()[i]
            ),
        ));
    }
    Ok(tokens)
}

/// Extract a 2-D array of element type `Narrow` (taken as is) or `Wide` (converted by `narrow`)
/// as row-major `(data, rows, cols)`; `kinds` names the two dtypes in error messages.
fn matrix_of<Narrow: Element + Copy + Default, Wide: Element + Copy>(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    kinds: &str,
    narrow: impl FnMut(Wide) -> PyResult<Narrow>,
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
    let cells = n.saturating_mul(k);
    if let Ok(m) = obj.extract::<PyReadonlyArray2<'_, Narrow>>() {
        return Ok((
            converted(arg, cells, m.as_array().iter().copied(), Ok)?,
            n,
            k,
        ));
    }
    if let Ok(m) = obj.extract::<PyReadonlyArray2<'_, Wide>>() {
        return Ok((
            converted(arg, cells, m.as_array().iter().copied(), narrow)?,
            n,
            k,
        ));
    }
    Err(type_error(format!(
        "{arg}: expected a {kinds} array, got dtype {}",
        dtype_name(a)
    )))
}

/// Extract an `[n, k]` int32/int64 array of token ids as row-major `(data, n, k)`.
pub(crate) fn matrix(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Vec<i32>, usize, usize)> {
    matrix_of::<i32, i64>(obj, arg, "int32 or int64", |v| {
        i32::try_from(v).map_err(|_| value_error(arg, format!("value {v} does not fit in int32")))
    })
}

/// Extract an `[n, k]` float32/float64 array of probabilities as row-major `(data, n, k)`.
pub(crate) fn prob_matrix(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Vec<f32>, usize, usize)> {
    // Probabilities: f32 precision is plenty.
    #[allow(clippy::cast_possible_truncation)]
    matrix_of::<f32, f64>(obj, arg, "float32 or float64", |p| Ok(p as f32))
}

/// The copy-logit rows of a table update: `topk_ids` as `[n, k]` (`n` must be `tokens`, the
/// number of tokens written) and the optional `topk_probs` of the same shape, each named in its
/// errors by `ids_arg` / `probs_arg`; `(ids, k, probs)`.
pub(crate) fn topk_rows(
    topk_ids: &Bound<'_, PyAny>,
    topk_probs: Option<Bound<'_, PyAny>>,
    tokens: usize,
    ids_arg: &str,
    probs_arg: &str,
) -> PyResult<(Vec<i32>, usize, Option<Vec<f32>>)> {
    let (ids, n, k) = matrix(topk_ids, ids_arg)?;
    if n != tokens {
        return Err(value_error(
            ids_arg,
            format!("has {n} rows but tokens has {tokens} entries"),
        ));
    }
    let probs = topk_probs.map(|p| prob_matrix(&p, probs_arg)).transpose()?;
    if let Some((_, pn, pk)) = &probs {
        if (*pn, *pk) != (n, k) {
            return Err(value_error(
                probs_arg,
                format!("shape ({pn}, {pk}) differs from topk_ids ({n}, {k})"),
            ));
        }
    }
    Ok((ids, k, probs.map(|(p, _, _)| p)))
}

/// Extract a 1-D float32/float64 array (or a list of floats) of probabilities.
pub(crate) fn prob_vector(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<f32>> {
    // Probabilities: f32 precision is plenty.
    #[allow(clippy::cast_possible_truncation)]
    floats(obj, arg, |x| x, |p| p as f32)
}

/// Extract a 1-D float32/float64 array (or a list of floats) as float64 values.
pub(crate) fn float_vector(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<f64>> {
    floats(obj, arg, f64::from, |x| x)
}

/// A 1-D float32/float64 array (or a list of floats), each value through `from32` or `from64`.
fn floats<T: Clone + Default>(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    from32: fn(f32) -> T,
    from64: fn(f64) -> T,
) -> PyResult<Vec<T>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        if a.ndim() != 1 {
            return Err(value_error(
                arg,
                format!("expected a 1-D array, got shape {:?}", a.shape()),
            ));
        }
        if let Ok(v) = obj.extract::<PyReadonlyArray1<'_, f32>>() {
            return converted(arg, v.len(), v.as_array().iter(), |&x| Ok(from32(x)));
        }
        if let Ok(v) = obj.extract::<PyReadonlyArray1<'_, f64>>() {
            return converted(arg, v.len(), v.as_array().iter(), |&x| Ok(from64(x)));
        }
        return Err(type_error(format!(
            "{arg}: expected a float32 or float64 array, got dtype {}",
            dtype_name(a)
        )));
    }
    // A list: as long as the caller's own list (each item a float object, far larger).
    let values: Vec<f64> = obj.extract().map_err(|_| {
        type_error(format!(
            "{arg}: expected a 1-D float array or a list of floats"
        ))
    })?;
    Ok(values.into_iter().map(from64).collect())
}

/// A Python int argument that must be a token id (non-negative int32).
pub(crate) fn token_id(value: Int, arg: &str) -> PyResult<i32> {
    let value = value.get(arg)?;
    i32::try_from(value)
        .ok()
        .filter(|&t| t >= 0)
        .ok_or_else(|| value_error(arg, format!("expected a token id in 0..2**31, got {value}")))
}

/// A Python int argument that must be at least `min`.
pub(crate) fn at_least(value: Int, min: i64, arg: &str) -> PyResult<usize> {
    let value = value.get(arg)?;
    if value < i128::from(min) {
        return Err(value_error(arg, format!("must be >= {min}, got {value}")));
    }
    usize::try_from(value)
        .map_err(|_| value_error(arg, format!("must be <= {}, got {value}", usize::MAX)))
}

/// A Python int argument that must be at least `min`, where any larger value means "no limit"
/// (values beyond `usize` are taken as `usize::MAX`).
pub(crate) fn at_least_or_unlimited(value: Int, min: i64, arg: &str) -> PyResult<usize> {
    let value = value.get(arg)?;
    if value < i128::from(min) {
        return Err(value_error(arg, format!("must be >= {min}, got {value}")));
    }
    Ok(usize::try_from(value).unwrap_or(usize::MAX))
}

/// A 1-D int32 numpy array that takes ownership of `v` (no copy).
pub(crate) fn array1<'py>(py: Python<'py>, v: Vec<i32>) -> Bound<'py, PyArray1<i32>> {
    PyArray1::from_vec(py, v)
}

/// A Python int argument, validated by the rule its consumer applies ([`at_least`],
/// [`token_id`]): extraction never fails, so that a wrong type is reported as an
/// `InvalidTypeError` naming the argument (PyO3's own extraction error would be a plain
/// `TypeError`). Values beyond 128 bits saturate (they are out of every range anyway).
#[derive(Debug, Clone)]
pub(crate) struct Int(Result<i128, String>);

impl Int {
    /// A default value.
    pub(crate) const fn of(value: i128) -> Self {
        Self(Ok(value))
    }

    /// Whether the argument was an int.
    pub(crate) fn is_int(&self) -> bool {
        self.0.is_ok()
    }

    /// The value, or an `InvalidTypeError` naming `arg` (bools are not ints here, as in the
    /// Python layer's rules).
    pub(crate) fn get(&self, arg: &str) -> PyResult<i128> {
        match &self.0 {
            Ok(value) => Ok(*value),
            Err(type_name) => Err(type_error(format!("{arg} must be an int, got {type_name}"))),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Int {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() {
            return Ok(Self(Err("bool".into())));
        }
        match obj.extract::<i128>() {
            Ok(v) => Ok(Self(Ok(v))),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                Ok(Self(Ok(if obj.lt(0)? { i128::MIN } else { i128::MAX })))
            }
            Err(_) => Ok(Self(Err(type_name(&obj)))),
        }
    }
}

/// A Python bool argument (numpy's too), validated with the argument's name (see [`Int`]).
#[derive(Debug, Clone)]
pub(crate) struct Flag(Result<bool, String>);

impl Flag {
    /// A default value.
    pub(crate) const fn of(value: bool) -> Self {
        Self(Ok(value))
    }

    /// The value, or an `InvalidTypeError` naming `arg`.
    pub(crate) fn get(&self, arg: &str) -> PyResult<bool> {
        match &self.0 {
            Ok(value) => Ok(*value),
            Err(type_name) => Err(type_error(format!(
                "{arg} must be True or False, got {type_name}"
            ))),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Flag {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self(obj.extract::<bool>().map_err(|_| type_name(&obj))))
    }
}

/// A finite real Python number, validated with the argument's name (see [`Int`]).
#[derive(Debug, Clone)]
pub(crate) struct Real(Result<f64, String>);

impl Real {
    /// A default value.
    pub(crate) const fn of(value: f64) -> Self {
        Self(Ok(value))
    }

    /// The value in `[min, max]`, or an error naming `arg`: `InvalidTypeError` for a non-number
    /// (or a bool), `InvalidArgumentError` for NaN, an infinity or a value out of range.
    pub(crate) fn within(&self, arg: &str, min: f64, max: f64) -> PyResult<f64> {
        match &self.0 {
            Err(type_name) => Err(type_error(format!(
                "{arg} must be a number, got {type_name}"
            ))),
            Ok(v) if !v.is_finite() => Err(value_error(arg, format!("must be finite, got {v}"))),
            Ok(v) if !(min..=max).contains(v) => Err(value_error(
                arg,
                format!("must be in [{min}, {max}], got {v}"),
            )),
            Ok(v) => Ok(*v),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Real {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() {
            return Ok(Self(Err("bool".into())));
        }
        Ok(Self(obj.extract::<f64>().map_err(|_| type_name(&obj))))
    }
}

/// A Python str argument, validated with the argument's name (see [`Int`]).
#[derive(Debug, Clone)]
pub(crate) struct Text(Result<String, String>);

impl Text {
    /// A default value.
    pub(crate) fn of(value: &str) -> Self {
        Self(Ok(value.to_string()))
    }

    /// The value, one of `options`, or an error naming `arg`.
    pub(crate) fn one_of(&self, arg: &str, options: &[&str]) -> PyResult<String> {
        let choices = options.join("', '");
        match &self.0 {
            Err(type_name) => Err(type_error(format!(
                "{arg} must be one of '{choices}', got {type_name}"
            ))),
            Ok(v) if !options.contains(&v.as_str()) => Err(value_error(
                arg,
                format!("must be one of '{choices}', got {v:?}"),
            )),
            Ok(v) => Ok(v.clone()),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Text {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self(obj.extract::<String>().map_err(|_| type_name(&obj))))
    }
}

/// `obj` as the native class `T`, or an `InvalidTypeError` naming `arg` and what it expects.
pub(crate) fn native<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    expected: &str,
) -> PyResult<Bound<'py, T>> {
    obj.cast::<T>().cloned().map_err(|_| {
        type_error(format!(
            "{arg} must be {expected}, got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Borrowed<'_, '_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}
