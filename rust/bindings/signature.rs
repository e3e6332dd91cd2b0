//! Argument binding for every native entry point: a call Python cannot bind (a required argument
//! missing, a positional one too many, an unknown keyword, a value given both by position and by
//! keyword) is an `InvalidTypeError` (a `RacerError` and a `TypeError`) naming the entry point,
//! the arguments at fault and the ones it takes. PyO3's own binding errors are plain
//! `TypeError`s, so no entry point leaves binding to PyO3:
//!
//! - its positional-or-keyword parameters are declared positional-only with the default
//!   [`Given::MISSING`] (so PyO3 never finds one missing, and a keyword that names one lands in
//!   `**kwargs` instead of clashing with a positional value);
//! - `*extra` takes the positional arguments beyond them, `**kwargs` every keyword argument
//!   that is not keyword-only;
//! - [`Signature::bind`] then binds them as Python would, or names what is wrong.
//!
//! Keyword-only parameters stay PyO3's own (a keyword cannot be given twice in one call). The
//! success path costs an empty tuple and a few comparisons; each entry point's
//! `text_signature` states the signature the caller sees (the stubs' one).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::errors::type_error;

/// A positional-or-keyword argument as PyO3 hands it over: the object passed by position, or
/// nothing (then [`Signature::bind`] looks for it among the keywords).
pub(crate) struct Given<'py>(Option<Bound<'py, PyAny>>);

impl Given<'_> {
    /// Not passed by position: the default of every positional-only parameter.
    pub(crate) const MISSING: Self = Self(None);
}

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self(Some(obj.to_owned())))
    }
}

/// The parameters of one entry point: `R` required positional-or-keyword ones, then `O`
/// optional ones, then the keyword-only ones (named in messages only).
pub(crate) struct Signature<const R: usize, const O: usize> {
    /// The entry point as messages name it: `Class.method`, `Class` or `function`.
    name: &'static str,
    required: [&'static str; R],
    optional: [&'static str; O],
    keyword_only: &'static [&'static str],
}

/// The parameters of an entry point that takes no argument.
pub(crate) const fn no_arguments(name: &'static str) -> Signature<0, 0> {
    Signature::new(name, [], [], &[])
}

impl<const R: usize, const O: usize> Signature<R, O> {
    pub(crate) const fn new(
        name: &'static str,
        required: [&'static str; R],
        optional: [&'static str; O],
        keyword_only: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            required,
            optional,
            keyword_only,
        }
    }

    /// The required arguments, then the optional ones (`None` where not given; an explicit
    /// `None` stays `Some`): `positional` as PyO3 filled it, completed from `kwargs`.
    ///
    /// # Errors
    /// `InvalidTypeError` if `extra` is not empty, a keyword is unknown or names an argument
    /// also given by position, or a required argument is missing (checked in that order).
    #[allow(clippy::type_complexity)]
    pub(crate) fn bind<'py>(
        &self,
        required: [Given<'py>; R],
        optional: [Given<'py>; O],
        extra: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<([Bound<'py, PyAny>; R], [Option<Bound<'py, PyAny>>; O])> {
        if !extra.is_empty() {
            return Err(self.too_many(extra.len()));
        }
        let mut required = required.map(|g| g.0);
        let mut optional = optional.map(|g| g.0);
        if let Some(kwargs) = kwargs.filter(|k| !k.is_empty()) {
            self.bind_keywords(kwargs, &mut required, &mut optional)?;
        }
        if required.iter().any(Option::is_none) {
            return Err(self.missing(&required));
        }
        let py = extra.py();
        // Every entry is `Some` (checked just above): the fallback is never used.
        let required = required.map(|a| a.unwrap_or_else(|| py.None().into_bound(py)));
        Ok((required, optional))
    }

    #[cold]
    fn bind_keywords<'py>(
        &self,
        kwargs: &Bound<'py, PyDict>,
        required: &mut [Option<Bound<'py, PyAny>>; R],
        optional: &mut [Option<Bound<'py, PyAny>>; O],
    ) -> PyResult<()> {
        let mut unknown: Vec<String> = Vec::new();
        for (key, value) in kwargs.iter() {
            let name = key.cast::<PyString>().ok().and_then(|k| k.to_str().ok());
            let slot = name.and_then(|name| {
                let r = self.required.iter().position(|&p| p == name);
                let o = self.optional.iter().position(|&p| p == name);
                match (r, o) {
                    (Some(i), _) => Some(&mut required[i]),
                    (None, Some(i)) => Some(&mut optional[i]),
                    (None, None) => None,
                }
            });
            match slot {
                Some(slot) if slot.is_some() => {
                    return Err(type_error(format!(
                        "{}() got multiple values for argument '{}' (by position and by keyword)",
                        self.name,
                        name.unwrap_or("?")
                    )));
                }
                Some(slot) => *slot = Some(value),
                // As Python spells the name (quoted, escapes and all): one line whatever it is.
                None => unknown.push(key.repr().map_or_else(|_| "'?'".into(), |r| r.to_string())),
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        Err(type_error(format!(
            "{}() got unknown keyword argument(s) {}; it takes {}",
            self.name,
            unknown.join(", "),
            self.takes()
        )))
    }

    #[cold]
    fn too_many(&self, extra: usize) -> PyErr {
        let later = if self.keyword_only.is_empty() {
            ""
        } else {
            " (the later ones by keyword)"
        };
        type_error(format!(
            "{}() got {extra} positional argument(s) too many; it takes {}{later}",
            self.name,
            self.takes()
        ))
    }

    #[cold]
    fn missing(&self, required: &[Option<Bound<'_, PyAny>>; R]) -> PyErr {
        let names: Vec<String> = self
            .required
            .iter()
            .zip(required)
            .filter(|(_, a)| a.is_none())
            .map(|(name, _)| format!("'{name}'"))
            .collect();
        type_error(format!(
            "{}() missing required argument(s) {}; it takes {}",
            self.name,
            names.join(", "),
            self.takes()
        ))
    }

    /// The parameters, for messages: `ids, last_tokens, capacity, calibration`, or `no arguments`.
    fn takes(&self) -> String {
        let all: Vec<&str> = self
            .required
            .iter()
            .chain(&self.optional)
            .chain(self.keyword_only)
            .copied()
            .collect();
        if all.is_empty() {
            "no arguments".into()
        } else {
            all.join(", ")
        }
    }
}

impl Signature<0, 0> {
    /// Check that the entry point got no argument.
    ///
    /// # Errors
    /// As [`Signature::bind`].
    pub(crate) fn bind_none(
        &self,
        extra: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        self.bind([], [], extra, kwargs).map(|_| ())
    }
}

/// An optional argument that may also be given as `None`: `None` either way.
pub(crate) fn unless_none<'py>(arg: Option<Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    arg.filter(|a| !a.is_none())
}

/// An optional argument extracted as `T`, or `default` when not given.
///
/// # Errors
/// `T`'s extraction error (the bindings' `Int`, `Flag`, ... never fail: they report a wrong type
/// when their value is read, naming the argument).
pub(crate) fn or_default<'py, T>(arg: Option<&Bound<'py, PyAny>>, default: T) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
{
    arg.map_or(Ok(default), |a| a.extract())
}
