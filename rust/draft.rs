//! RACER's draft tree: an optional draft-model chain, then retrieval paths, then the copy-logit
//! tree, merged in one trie so the budget is charged on distinct nodes. A probability-scored
//! variant picks the nodes with the highest estimated acceptance probability instead.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::automaton::Automaton;
use crate::error::{Result, invalid};
use crate::logits_table::LogitsTable;
use crate::tree::{DraftTree, TreeBuilder, check_budget};

/// Settings of one draft-tree build.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftOptions {
    /// Maximum nodes, root included.
    pub capacity: usize,
    /// Add retrieval paths from the automaton.
    pub use_retrieval: bool,
    /// Fill the rest with the copy-logit tree.
    pub use_logits: bool,
    /// Depth whose nodes do not halve their children's breadth (1 as in the reference code).
    pub exempt_depth: u32,
    /// Choose nodes best first by estimated path probability (copy-logit probabilities and
    /// retrieval frequencies) instead of "retrieval first, then breadth halving".
    pub scored: bool,
    /// Scored trees only: leave out nodes whose estimated path probability is below this,
    /// so a tree only grows while a node is likely enough to pay for its verification cost.
    pub min_score: f32,
}

impl Default for DraftOptions {
    fn default() -> Self {
        Self {
            capacity: 64,
            use_retrieval: true,
            use_logits: true,
            exempt_depth: 1,
            scored: false,
            min_score: 0.0,
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
    if !(0.0..=1.0).contains(&options.min_score) {
        return Err(invalid(
            "min_score",
            format!("must be in [0, 1], got {}", options.min_score),
        ));
    }
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
    if options.scored {
        ScoredBuild::new(automaton, table, options).run(&mut builder, next_token as u32);
        return Ok(builder.finish());
    }
    if options.use_retrieval {
        automaton.retrieve_into(&mut builder, next_token as u32, options.capacity);
    }
    if options.use_logits {
        table.expand_into(&mut builder, options.capacity, options.exempt_depth);
    }
    Ok(builder.finish())
}

/// A node waiting to be placed, with its estimated path probability.
#[derive(Debug, Clone, Copy)]
struct Scored {
    score: f32,
    token: i32,
    parent: u32,
    /// The trie node it came from, or `u32::MAX` for a copy-logit candidate.
    trie: u32,
}

impl PartialEq for Scored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Scored {}

impl Ord for Scored {
    /// Higher score first; ties go to the smaller token, parent and trie node (deterministic).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.token.cmp(&self.token))
            .then(other.parent.cmp(&self.parent))
            .then(other.trie.cmp(&self.trie))
    }
}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Best-first tree growth: a path's score is the product of its edges' estimated acceptance
/// probabilities, so taking the best candidate each time keeps the tree prefix-closed and
/// maximises the expected number of accepted tokens under the estimates.
struct ScoredBuild<'a> {
    automaton: &'a mut Automaton,
    table: &'a LogitsTable,
    options: &'a DraftOptions,
    heap: BinaryHeap<Scored>,
    logits_expanded: Vec<bool>,
    used: Vec<u32>,
}

impl<'a> ScoredBuild<'a> {
    fn new(
        automaton: &'a mut Automaton,
        table: &'a LogitsTable,
        options: &'a DraftOptions,
    ) -> Self {
        Self {
            automaton,
            table,
            options,
            heap: BinaryHeap::new(),
            logits_expanded: Vec::new(),
            used: Vec::new(),
        }
    }

    fn run(mut self, builder: &mut TreeBuilder, next: u32) {
        // Nodes already there (root and draft chain) are certain as far as drafting goes.
        for node in 0..builder.len() as u32 {
            self.push_logits(builder, node, 1.0);
        }
        if self.options.use_retrieval {
            for border in self.automaton.borders(next) {
                self.used.push(border);
                self.push_trie(border, 0, 1.0);
            }
        }
        while builder.len() < self.options.capacity {
            let Some(c) = self.heap.pop() else { break };
            if c.score < self.options.min_score {
                break; // the heap is best first: nothing left scores higher
            }
            let Some((node, _)) = builder.child_or_insert(c.parent, c.token, self.options.capacity)
            else {
                break;
            };
            self.push_logits(builder, node, c.score);
            if c.trie != u32::MAX {
                self.used.push(c.trie);
                self.push_trie(c.trie, node, c.score);
            }
        }
        self.automaton.mark_used(&self.used);
    }

    fn push_logits(&mut self, builder: &TreeBuilder, node: u32, score: f32) {
        let i = node as usize;
        if self.logits_expanded.len() <= i {
            self.logits_expanded.resize(i + 1, false);
        }
        if !self.options.use_logits || self.logits_expanded[i] {
            return;
        }
        self.logits_expanded[i] = true;
        let token = builder.token(node);
        let (Some(ids), Some(probs)) = (self.table.row(token), self.table.row_probs(token)) else {
            return;
        };
        for (&t, &p) in ids.iter().zip(probs) {
            self.heap.push(Scored {
                score: score * p,
                token: t,
                parent: node,
                trie: u32::MAX,
            });
        }
    }

    fn push_trie(&mut self, trie: u32, parent: u32, score: f32) {
        let heap = &mut self.heap;
        self.automaton
            .for_each_continuation(trie, |token, p, child| {
                heap.push(Scored {
                    score: score * p,
                    token,
                    parent,
                    trie: child,
                });
            });
    }
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
        for cap in [1, 2, 5, 16, 64, 200] {
            let options = DraftOptions {
                capacity: cap,
                scored: true,
                ..Default::default()
            };
            let tree = build_draft_tree(&mut a, &t, 2, &[], &options).unwrap();
            assert_eq!(tree.len(), cap);
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
