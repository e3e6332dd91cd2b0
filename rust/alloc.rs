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
pub fn filled<T: Clone>(
    arg: &'static str,
    what: impl std::fmt::Display,
    len: usize,
    value: T,
) -> Result<Vec<T>> {
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

/// The `OutOfMemory` error for a buffer of `bytes` bytes for `what`.
pub(crate) fn out_of_memory(what: &str, bytes: usize) -> Error {
    Error::OutOfMemory {
        what: what.to_string(),
        bytes,
    }
}

/// Room for `extra` more elements in `buffer` (amortized growth, as `push` would do), or
/// `OutOfMemory` naming `what`: the fallible form of the growth every container sized by a
/// caller or by the number of requests goes through.
///
/// # Errors
/// `OutOfMemory` when the system cannot provide the memory.
pub fn grow<T>(buffer: &mut Vec<T>, extra: usize, what: &str) -> Result<()> {
    buffer
        .try_reserve(extra)
        .map_err(|_| out_of_memory(what, extra.saturating_mul(size_of::<T>())))
}

/// An empty vector with room for `len` elements, or `OutOfMemory` naming `what`: the fallible
/// `Vec::with_capacity` for buffers sized by a caller or by the number of requests.
///
/// # Errors
/// `OutOfMemory` when the system cannot provide the memory.
pub fn with_capacity<T>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut buffer = Vec::new();
    buffer
        .try_reserve_exact(len)
        .map_err(|_| out_of_memory(what, len.saturating_mul(size_of::<T>())))?;
    Ok(buffer)
}

/// `items` in a vector reserved (fallibly) for their exact count up front, so collecting them
/// allocates nothing else: the fallible `collect` for the same buffers.
///
/// # Errors
/// `OutOfMemory` naming `what` when the system cannot provide the memory.
pub fn collect<T>(items: impl ExactSizeIterator<Item = T>, what: &str) -> Result<Vec<T>> {
    let mut buffer = with_capacity(items.len(), what)?;
    for item in items {
        // Within the reservation (an exact-size iterator): no allocation.
        buffer.push(item);
    }
    Ok(buffer)
}

/// [`collect`] for fallible items: the first error, or every item.
///
/// # Errors
/// The first item's error; `OutOfMemory` naming `what` when the system cannot provide the
/// memory.
pub fn try_collect<T, E: From<Error>>(
    items: impl ExactSizeIterator<Item = std::result::Result<T, E>>,
    what: &str,
) -> std::result::Result<Vec<T>, E> {
    let mut buffer = with_capacity(items.len(), what)?;
    for item in items {
        buffer.push(item?);
    }
    Ok(buffer)
}

/// Heap bytes held by a `std` hash map (SwissTable) of `capacity` (its `capacity()`, not its
/// length) with entries of `entry` bytes: the buckets, then one control byte per bucket plus
/// one group of 16.
#[must_use]
pub fn hash_map_bytes(capacity: usize, entry: usize) -> usize {
    let buckets = match capacity {
        0 => return 0,
        c if c < 8 => c + 1,
        c => c / 7 * 8,
    };
    buckets * (entry + 1) + 16
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

    #[test]
    fn hash_map_bytes_follow_the_bucket_count() {
        let mut m: rustc_hash::FxHashMap<u64, u32> = rustc_hash::FxHashMap::default();
        assert_eq!(hash_map_bytes(m.capacity(), 16), 0);
        for n in [1, 3, 4, 7, 8, 14, 15, 100, 1000] {
            m.insert(n as u64, 0);
            m.reserve(n);
            let buckets = m.capacity().next_power_of_two();
            let bytes = hash_map_bytes(m.capacity(), 16);
            assert!(
                bytes >= buckets * 17 && bytes <= buckets * 17 * 2 + 16,
                "{n}: {bytes}"
            );
            assert!(bytes.saturating_sub(16) % 17 == 0);
        }
        let mut v: Vec<u8> = with_capacity(10, "x").unwrap();
        assert!(v.capacity() >= 10);
        assert!(matches!(
            with_capacity::<u64>(usize::MAX / 4, "x"),
            Err(Error::OutOfMemory { .. })
        ));
        assert_eq!(collect([1, 2, 3].into_iter(), "x").unwrap(), vec![1, 2, 3]);
        let items = [Ok(1), Err(Error::Integrity("two".into())), Ok(3)];
        assert!(try_collect::<i32, Error>(items.into_iter(), "x").is_err());
        grow(&mut v, 10, "x").unwrap();
        assert!(v.capacity() >= 10);
        assert!(matches!(
            grow(&mut v, usize::MAX, "x"),
            Err(Error::OutOfMemory { .. })
        ));
    }
}
