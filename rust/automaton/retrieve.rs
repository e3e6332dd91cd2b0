//! Retrieval: the draft tree of continuations that followed `context suffix + next_token`.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Automaton, NIL, ROOT, key};
use crate::edge_cells;
use crate::error::{Result, invalid};
use crate::tree::{DraftTree, TreeBuilder, check_budget};

/// A trie node waiting to be placed below builder node `parent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    count: u32,
    rel_depth: u32,
    token: u32,
    parent: u32,
    node: u32,
    /// Edge cell (the matched string's length and the continuation's share).
    cell: i32,
}

impl Ord for Candidate {
    /// Better candidates compare greater: higher count, then shallower, then smaller token id
    /// (then smaller builder parent and node index, so the order is total and deterministic).
    fn cmp(&self, other: &Self) -> Ordering {
        self.count
            .cmp(&other.count)
            .then(other.rel_depth.cmp(&self.rel_depth))
            .then(other.token.cmp(&self.token))
            .then(other.parent.cmp(&self.parent))
            .then(other.node.cmp(&self.node))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Automaton {
    /// The retrieval tree rooted at `next_token` with at most `budget` nodes (root included).
    /// Read-only for the context, the counts and the match state; refreshes LRU recency of the
    /// nodes it uses.
    ///
    /// # Errors
    /// `InvalidArgument` if `next_token` is negative or `budget` outside `1..=MAX_TREE_NODES`.
    pub fn retrieve(&mut self, next_token: i32, budget: usize) -> Result<DraftTree> {
        if next_token < 0 {
            return Err(invalid(
                "next_token",
                format!("token ids must be >= 0, got {next_token}"),
            ));
        }
        check_budget("budget", budget)?;
        let mut builder = TreeBuilder::new(next_token);
        self.retrieve_into(&mut builder, next_token as u32, budget);
        Ok(builder.finish())
    }

    /// The borders: nodes for `s + [next]` with `s` a context suffix (found on the failure chain
    /// of the state) and depth >= `min_depth`, longest first.
    pub(crate) fn borders(&mut self, next: u32) -> Vec<u32> {
        self.ensure_state();
        let mut borders = Vec::new();
        let mut u = self.state;
        loop {
            if let Some(&v) = self.goto.get(&key(u, next)) {
                if self.nodes[v as usize].depth as usize >= self.min_depth {
                    borders.push(v);
                }
            }
            if u == ROOT {
                return borders;
            }
            u = self.nodes[u as usize].fail;
        }
    }

    /// Add retrieval paths below the builder's root (whose token is `next`) until it holds
    /// `budget` nodes. Continuations are taken best first across the borders' subtrees, ranked
    /// by count, then depth, then token id; paths spelling the same tokens merge.
    pub fn retrieve_into(&mut self, builder: &mut TreeBuilder, next: u32, budget: usize) {
        let borders = self.borders(next);
        // Suffix closure makes every path under a longer border also a path under the shortest
        // one, with a count at least as high; ranked by count, the longer borders only ever
        // produce merges, so the shortest border alone yields the same tree, faster.
        let Some(&border) = borders.last() else {
            return;
        };
        self.tick += 1;
        let mut used = vec![border];
        let mut heap = BinaryHeap::new();
        self.push_children(&mut heap, border, 0, 1);
        while builder.len() < budget {
            let Some(c) = heap.pop() else { break };
            let Some((placed, _)) =
                builder.child_or_insert(c.parent, c.token as i32, budget, c.cell)
            else {
                break;
            };
            used.push(c.node);
            self.push_children(&mut heap, c.node, placed, c.rel_depth + 1);
        }
        for v in used {
            self.nodes[v as usize].tick = self.tick;
            self.push_if_evictable(v);
        }
    }

    fn push_children(
        &self,
        heap: &mut BinaryHeap<Candidate>,
        node: u32,
        parent: u32,
        rel_depth: u32,
    ) {
        let (total, depth) = (
            self.nodes[node as usize].count,
            self.nodes[node as usize].depth,
        );
        let mut c = self.nodes[node as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            heap.push(Candidate {
                count: n.count,
                rel_depth,
                token: n.token,
                parent,
                node: c,
                cell: edge_cells::retrieval(depth as usize, share(n.count, total)),
            });
            c = n.next_sibling;
        }
    }
}

/// Hooks for the probability-scored tree builder (`crate::draft`).
impl Automaton {
    /// Calls `f(token, probability, child, cell)` for every child of trie node `node`, where the
    /// probability is the add-one smoothed estimate `count(child) / (count(node) + 1)` that
    /// the child's token follows the node's string, and `cell` the edge's cell.
    pub(crate) fn for_each_continuation(&self, node: u32, mut f: impl FnMut(i32, f32, u32, i32)) {
        let (total, depth) = (
            self.nodes[node as usize].count,
            self.nodes[node as usize].depth,
        );
        let mut c = self.nodes[node as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            #[allow(clippy::cast_precision_loss)]
            let smoothed = n.count as f32 / (total as f32 + 1.0);
            let cell = edge_cells::retrieval(depth as usize, share(n.count, total));
            f(n.token as i32, smoothed, c, cell);
            c = n.next_sibling;
        }
    }

    /// Record `nodes` as used now (LRU recency).
    pub(crate) fn mark_used(&mut self, nodes: &[u32]) {
        self.tick += 1;
        for &v in nodes {
            if self.nodes[v as usize].alive {
                self.nodes[v as usize].tick = self.tick;
                self.push_if_evictable(v);
            }
        }
    }
}

/// The share of a string's occurrences that a continuation followed.
#[allow(clippy::cast_precision_loss)]
fn share(count: u32, total: u32) -> f32 {
    if total == 0 {
        return 0.0;
    }
    (count as f32 / total as f32).min(1.0)
}
