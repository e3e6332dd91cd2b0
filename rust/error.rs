//! The core's error type: every failure names the offending argument (or file).

use std::io;
use std::path::Path;

use std::borrow::Cow;

/// Result alias used across the core.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors raised by the core. Bindings map `InvalidArgument` to `ValueError`, `Integrity` to
/// `RuntimeError`, `CorruptFile` to `CorruptFileError` (a `ValueError`), `OutOfMemory` to
/// `OutOfMemoryError` (a `MemoryError`) and `Io` to the `OSError` subclass of its errno.
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
    /// A saved image is truncated, damaged, or of another format or version.
    #[error("{source_name}: {msg}")]
    CorruptFile {
        /// The file's path, or the argument's name for in-memory data.
        source_name: String,
        /// What is wrong with it.
        msg: String,
    },
    /// The system cannot provide the memory a buffer needs.
    #[error("out of memory: {what} needs {bytes} bytes")]
    OutOfMemory {
        /// What the buffer is for.
        what: String,
        /// Its size.
        bytes: usize,
    },
    /// The operating system refused a file operation.
    #[error("{path}: {msg}")]
    Io {
        /// The file the operation was on.
        path: String,
        /// The error's kind.
        kind: io::ErrorKind,
        /// The OS error number, when there is one.
        errno: Option<i32>,
        /// The OS's description, without the "(os error N)" suffix.
        msg: String,
    },
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

/// An `Io` error for an operation on `path`.
pub(crate) fn io_error(path: &Path, e: &io::Error) -> Error {
    let full = e.to_string();
    let msg = match full.rfind(" (os error ") {
        Some(i) if full.ends_with(')') => full[..i].to_string(),
        _ => full,
    };
    Error::Io {
        path: path.display().to_string(),
        kind: e.kind(),
        errno: e.raw_os_error(),
        msg,
    }
}
