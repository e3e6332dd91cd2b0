//! The core's error type: every failure names the offending argument.

use std::borrow::Cow;

/// Result alias used across the core.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors raised by the core. Bindings map `InvalidArgument` to `ValueError` and
/// `Integrity` to `RuntimeError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A caller passed a value outside its domain.
    #[error("{arg}: {msg}")]
    InvalidArgument {
        /// Name of the argument, as the caller spells it (with the element and the request it
        /// concerns for batch calls, e.g. `ids[3] ('req-7')`).
        arg: Cow<'static, str>,
        /// What was expected and what arrived.
        msg: String,
    },
    /// An internal invariant does not hold (reported by `check_integrity`).
    #[error("integrity check failed: {0}")]
    Integrity(String),
}

/// Shorthand for an `InvalidArgument` error.
pub(crate) fn invalid(arg: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        arg: Cow::Borrowed(arg),
        msg: msg.into(),
    }
}

/// An `InvalidArgument` error whose argument name is built at run time (`tokens[2] ('a')`).
pub(crate) fn invalid_at(arg: String, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        arg: Cow::Owned(arg),
        msg: msg.into(),
    }
}
