//! RACER's draft tree: an optional draft-model chain, then retrieval paths, then the copy-logit
//! tree, merged in one trie so the budget is charged on distinct nodes.
#![forbid(unsafe_code)]

use crate::automaton::Automaton;
use crate::error::{Result, invalid};
use crate::logits_table::LogitsTable;
use crate::tree::{DraftTree, TreeBuilder, check_budget};

/// Settings of one draft-tree build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftOptions {
    /// Maximum nodes, root included.
    pub capacity: usize,
    /// Add retrieval paths from the automaton.
    pub use_retrieval: bool,
    /// Fill the rest with the copy-logit tree.
    pub use_logits: bool,
    /// Depth whose nodes do not halve their children's breadth (1 as in the reference code).
    pub exempt_depth: u32,
}

impl Default for DraftOptions {
    fn default() -> Self {
        Self {
            capacity: 64,
            use_retrieval: true,
            use_logits: true,
            exempt_depth: 1,
        }
    }
}

/// Build the draft tree rooted at `next_token`: `draft_chain` (tokens after the root) first,
/// then retrieval paths, then the logits tree fills what is left. The tree has exactly
/// `min(capacity, available)` nodes and is deterministic.
///
/// # Errors
/// `InvalidArgument` if `capacity` is outside `1..=MAX_TREE_NODES` or a token is negative or outside the table.
pub fn build_draft_tree(
    automaton: &mut Automaton,
    table: &LogitsTable,
    next_token: i32,
    draft_chain: &[i32],
    options: &DraftOptions,
) -> Result<DraftTree> {
    check_budget("capacity", options.capacity)?;
    let vocab = table.vocab_size();
    if next_token < 0 || next_token as usize >= vocab {
        return Err(invalid(
            "next_token",
            format!("token {next_token} is outside 0..{vocab}"),
        ));
    }
    if let Some(t) = draft_chain.iter().find(|&&t| t < 0 || t as usize >= vocab) {
        return Err(invalid(
            "draft_chain",
            format!("token {t} is outside 0..{vocab}"),
        ));
    }
    let mut builder = TreeBuilder::new(next_token);
    builder.insert_path(draft_chain, options.capacity);
    if options.use_retrieval {
        automaton.retrieve_into(&mut builder, next_token as u32, options.capacity);
    }
    if options.use_logits {
        table.expand_into(&mut builder, options.capacity, options.exempt_depth);
    }
    Ok(builder.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrieval_first_then_logits_fill_to_capacity() {
        let mut a = Automaton::new(4, 1000, 2).unwrap();
        a.extend(&[1, 2, 3, 4, 5, 1]).unwrap();
        let mut t = LogitsTable::new(50, 4).unwrap();
        let tokens: Vec<i32> = (0..50).collect();
        let ids: Vec<i32> = (0..50)
            .flat_map(|r| (0..4).map(move |j| (r * 4 + j + 7) % 50))
            .collect();
        t.update(&tokens, &ids, 4).unwrap();
        for cap in [1, 2, 5, 16, 64, 200] {
            let tree = build_draft_tree(
                &mut a,
                &t,
                2,
                &[],
                &DraftOptions {
                    capacity: cap,
                    ..Default::default()
                },
            )
            .unwrap();
            assert_eq!(tree.len(), cap);
            if cap >= 4 {
                assert_eq!(&tree.tokens()[..2], &[2, 3]);
            }
        }
        let chain = build_draft_tree(
            &mut a,
            &t,
            2,
            &[9, 9],
            &DraftOptions {
                capacity: 3,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(chain.tokens(), &[2, 9, 9]);
    }
}
