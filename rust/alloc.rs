//! Buffers sized by a caller's input: a hard element limit, then a fallible reservation, so an
//! impossible request is an error naming the size, never an allocation failure that aborts the
//! interpreter.
#![forbid(unsafe_code)]

use crate::error::{Error, Result, invalid};

/// The most elements one buffer built from a caller's input may hold (256 Mi: a bool mask of a
/// 16,384-node tree, or 2 GiB of `i32`s).
pub const MAX_ELEMENTS: usize = 1 << 28;

/// A vector of `len` copies of `value`, or an error naming `what` and the size.
///
/// # Errors
/// `InvalidArgument` naming `arg` when `len` exceeds [`MAX_ELEMENTS`]; `OutOfMemory` when the
/// system cannot provide the memory.
pub fn filled<T: Clone>(arg: &'static str, what: &str, len: usize, value: T) -> Result<Vec<T>> {
    if len > MAX_ELEMENTS {
        return Err(invalid(
            arg,
            format!("{what} would hold {len} elements; at most {MAX_ELEMENTS} (2**28) are built"),
        ));
    }
    let mut buffer = Vec::new();
    buffer
        .try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory {
            what: what.to_string(),
            bytes: len.saturating_mul(size_of::<T>()),
        })?;
    buffer.resize(len, value);
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_request_is_an_error_not_an_abort() {
        assert!(matches!(
            filled("n", "a mask", MAX_ELEMENTS + 1, false),
            Err(Error::InvalidArgument { .. })
        ));
        assert_eq!(filled("n", "a mask", 3, 7u8).unwrap(), vec![7, 7, 7]);
    }
}
