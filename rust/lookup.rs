//! Prompt lookup decoding: copy what followed the latest earlier occurrence of the context's
//! longest matching suffix n-gram.
#![forbid(unsafe_code)]

use crate::error::{Result, invalid};

/// Find the most recent earlier occurrence of the context's last `n` tokens, for `n` from
/// `max_ngram` down to `min_ngram`, and return up to `num_pred` tokens that followed it.
///
/// # Errors
/// `InvalidArgument` unless `1 <= min_ngram <= max_ngram` and `num_pred >= 1`.
pub fn prompt_lookup(
    context: &[i32],
    max_ngram: usize,
    min_ngram: usize,
    num_pred: usize,
) -> Result<Vec<i32>> {
    if min_ngram < 1 || min_ngram > max_ngram {
        return Err(invalid(
            "min_ngram",
            format!("need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}"),
        ));
    }
    if num_pred < 1 {
        return Err(invalid("num_pred", "must be >= 1"));
    }
    let len = context.len();
    // An n-gram needs at least one earlier token before the suffix to match anything.
    for n in (min_ngram..=max_ngram.min(len.saturating_sub(1))).rev() {
        let suffix = &context[len - n..];
        // Latest start i < len - n whose n-gram equals the suffix.
        if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
            let start = i + n;
            let found = &context[start..start.saturating_add(num_pred).min(len)];
            // As long as the caller's context at most: a fallible allocation.
            let mut out = crate::alloc::filled("num_pred", "the looked-up tokens", found.len(), 0)?;
            out.copy_from_slice(found);
            return Ok(out);
        }
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_then_latest_match() {
        assert_eq!(
            prompt_lookup(&[1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], 3, 1, 2).unwrap(),
            vec![5, 1]
        );
        assert_eq!(prompt_lookup(&[7, 8, 9, 8], 3, 1, 10).unwrap(), vec![9, 8]);
        assert!(prompt_lookup(&[1, 2, 3], 3, 1, 10).unwrap().is_empty());
        assert!(prompt_lookup(&[1], 0, 1, 10).is_err());
    }
}
