//! Retrieval: the draft tree of continuations that followed `context suffix + next_token`.
//!
//! The context is either the automaton's own (its match state, for the request it indexes) or
//! given explicitly (`borders_for`, for an automaton shared by many requests, which cannot keep
//! one match state: each request passes its own recent tokens, and the shared automaton is only
//! read, apart from the LRU recency of what was used, applied later through a [`Recency`]).
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Automaton, NIL, ROOT, check_tokens};
use crate::edge_cells;
use crate::error::Result;
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

/// Which automaton a retrieval edge comes from; it selects the edge's block of cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The request's own automaton.
    Local,
    /// An automaton shared across requests.
    Shared,
}

impl Source {
    fn cell(self, match_len: usize, share: f32) -> i32 {
        match self {
            Self::Local => edge_cells::retrieval(match_len, share),
            Self::Shared => edge_cells::shared_retrieval(match_len, share),
        }
    }
}

/// Nodes of one automaton a read-only build used, for [`Automaton::touch`] to refresh their
/// LRU recency afterwards (under a write lock, once the readers' lock is gone). Each node is
/// held with its generation, so a node evicted and recycled in between is left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recency {
    nodes: Vec<(u32, u32)>,
    epoch: u32,
}

impl Recency {
    /// True when nothing was used.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Number of node uses recorded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Buffers of one retrieval build, kept by an automaton between its own builds.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch {
    /// The trie nodes used (the border first).
    pub(crate) used: Vec<u32>,
    heap: BinaryHeap<Candidate>,
    candidates: Vec<Candidate>,
}

impl Scratch {
    pub(crate) fn memory_bytes(&self) -> usize {
        self.used.capacity() * size_of::<u32>()
            + (self.heap.capacity() + self.candidates.capacity()) * size_of::<Candidate>()
    }
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
        check_token("next_token", next_token)?;
        check_budget("budget", budget)?;
        let mut builder = TreeBuilder::new(next_token);
        self.retrieve_into(&mut builder, next_token as u32, budget);
        Ok(builder.finish())
    }

    /// [`Automaton::retrieve`] for an explicit `context` instead of the automaton's own: the
    /// borders are the nodes for `s + [next_token]` with `s` a suffix of `context` (at most
    /// `ngram - 1` tokens). Read-only, so a shared automaton can answer any request while others
    /// read it too: the match state is neither read nor changed, and the LRU recency of the
    /// nodes used comes back as a [`Recency`] for [`Automaton::touch`].
    ///
    /// # Errors
    /// `InvalidArgument` if a token is negative or `budget` is outside `1..=MAX_TREE_NODES`.
    pub fn retrieve_after(
        &self,
        context: &[i32],
        next_token: i32,
        budget: usize,
    ) -> Result<(DraftTree, Recency)> {
        check_token("next_token", next_token)?;
        check_budget("budget", budget)?;
        check_tokens("context", context)?;
        // Only its last `ngram - 1` tokens can match (`borders_for`): a copy of those alone,
        // however long the caller's context.
        let tail = &context[context.len().saturating_sub(self.ngram - 1)..];
        let context: Vec<u32> = tail.iter().map(|&t| t as u32).collect();
        let mut builder = TreeBuilder::new(next_token);
        let used = self.retrieve_after_into(
            &mut builder,
            &context,
            next_token as u32,
            budget,
            Source::Local,
        );
        Ok((builder.finish(), self.recency(&used)))
    }

    /// The longest-match chain rooted at `next_token`: at most `max_len` tokens after the root,
    /// from the longest border (the longest suffix `s` of the context with `s + [next_token]`
    /// indexed, at least `min_depth` tokens), each step the continuation that most often
    /// followed the string matched so far (ties to the smaller id), as SuffixDecoding's greedy
    /// path. Where the matched string has no continuation indexed (it reached `ngram` tokens,
    /// or the end of the text), the chain goes on from its longest suffix that has one, while
    /// that suffix is at least `min_depth` tokens. Each edge's cell holds the matched string's
    /// length and the continuation's count estimate `count / (string count + 1)` (the scored
    /// tree's retrieval cells), so calibration can tell long matches from short ones and much
    /// evidence from little. Unlike [`Automaton::retrieve`], which ranks continuations by
    /// count after the shortest border (where every longer border's continuations are merged),
    /// the chain follows the most specific context: what a verifier of one chain needs.
    /// Refreshes LRU recency of the nodes it uses.
    ///
    /// # Errors
    /// `InvalidArgument` if `next_token` is negative or `max_len` is above `MAX_TREE_NODES - 1`.
    pub fn chain(&mut self, next_token: i32, max_len: usize) -> Result<DraftTree> {
        check_token("next_token", next_token)?;
        check_budget("max_len + 1", max_len.saturating_add(1))?;
        self.ensure_state();
        let (tree, used) = self.chain_from(self.state, next_token as u32, max_len, Source::Local);
        self.mark_used(&used);
        Ok(tree)
    }

    /// [`Automaton::chain`] for an explicit `context` (as [`Automaton::retrieve_after`]):
    /// read-only, the recency of the nodes used comes back as a [`Recency`].
    ///
    /// # Errors
    /// `InvalidArgument` if a token is negative or `max_len` is above `MAX_TREE_NODES - 1`.
    pub fn chain_after(
        &self,
        context: &[i32],
        next_token: i32,
        max_len: usize,
    ) -> Result<(DraftTree, Recency)> {
        check_token("next_token", next_token)?;
        check_budget("max_len + 1", max_len.saturating_add(1))?;
        check_tokens("context", context)?;
        let tail = &context[context.len().saturating_sub(self.ngram - 1)..];
        let tail: Vec<u32> = tail.iter().map(|&t| t as u32).collect();
        let (tree, used) = self.chain_from(
            self.deepest(&tail),
            next_token as u32,
            max_len,
            Source::Local,
        );
        Ok((tree, self.recency(&used)))
    }

    /// The longest-match chain of this automaton, shared across requests, for a request whose
    /// latest tokens are `recent` (oldest first; its last `ngram - 1` count): as
    /// [`Automaton::chain_after`], its edges in the shared-retrieval cells. Read-only: the
    /// recency of the nodes used comes back as a [`Recency`].
    pub(crate) fn shared_chain(
        &self,
        recent: &[u32],
        next_token: u32,
        max_len: usize,
    ) -> (DraftTree, Recency) {
        let tail = &recent[recent.len().saturating_sub(self.ngram - 1)..];
        let (tree, used) = self.chain_from(self.deepest(tail), next_token, max_len, Source::Shared);
        (tree, self.recency(&used))
    }

    /// The chain below the longest border of `deepest` (a match state) and `next`, with the
    /// trie nodes it used (its border first).
    pub(crate) fn chain_from(
        &self,
        deepest: u32,
        next: u32,
        max_len: usize,
        source: Source,
    ) -> (DraftTree, Vec<u32>) {
        let mut builder = TreeBuilder::with_capacity(next as i32, max_len + 1);
        let mut used = Vec::new();
        let Some(&border) = self.borders_from(deepest, next).first() else {
            return (builder.finish(), used);
        };
        used.push(border);
        let (mut u, mut parent) = (border, 0u32);
        while (builder.len() as u64) <= max_len as u64 {
            // The longest suffix of the matched string with a continuation.
            let mut v = u;
            while self.nodes[v as usize].first_child == NIL && v != ROOT {
                v = self.nodes[v as usize].fail;
            }
            let depth = self.nodes[v as usize].depth as usize;
            if v == ROOT || depth < self.min_depth {
                break;
            }
            let Some(c) = self.most_frequent_child(v) else {
                break;
            };
            let (total, n) = (self.nodes[v as usize].count, &self.nodes[c as usize]);
            #[allow(clippy::cast_precision_loss)]
            let estimate = n.count as f32 / (total as f32 + 1.0);
            let cell = edge_cells::by_estimate(source.cell(depth, share(n.count, total)), estimate);
            let Some((placed, _)) =
                builder.child_or_insert(parent, n.token as i32, max_len + 1, cell)
            else {
                break;
            };
            used.push(c);
            (u, parent) = (c, placed);
        }
        (builder.finish(), used)
    }

    /// The child of `node` with the highest count (ties to the smaller token id).
    fn most_frequent_child(&self, node: u32) -> Option<u32> {
        let mut best: Option<u32> = None;
        let mut c = self.nodes[node as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            let better = best.is_none_or(|b| {
                let m = &self.nodes[b as usize];
                (n.count, std::cmp::Reverse(n.token)) > (m.count, std::cmp::Reverse(m.token))
            });
            if better {
                best = Some(c);
            }
            c = n.next_sibling;
        }
        best
    }

    /// The node of the longest suffix of `tail` that is indexed (the root if none).
    fn deepest(&self, tail: &[u32]) -> u32 {
        (0..tail.len())
            .find_map(|start| self.find(&tail[start..]))
            .unwrap_or(ROOT)
    }

    /// The borders: nodes for `s + [next]` with `s` a context suffix (found on the failure chain
    /// of the state) and depth >= `min_depth`, longest first.
    pub(crate) fn borders(&mut self, next: u32) -> Vec<u32> {
        self.ensure_state();
        self.borders_from(self.state, next)
    }

    /// The borders for an explicit context: nodes for `s + [next]` with `s` a suffix of
    /// `context` and depth >= `min_depth`, longest first. Stateless: the longest suffix of
    /// `context` with a node is found from the root (at most `ngram - 1` tokens are used, as
    /// a longer string cannot be continued), and its failure chain lists every shorter one.
    /// For the automaton's own recent tokens this is exactly [`Automaton::borders`].
    pub(crate) fn borders_for(&self, context: &[u32], next: u32) -> Vec<u32> {
        let tail = &context[context.len().saturating_sub(self.ngram - 1)..];
        self.borders_from(self.deepest(tail), next)
    }

    fn borders_from(&self, deepest: u32, next: u32) -> Vec<u32> {
        let mut borders = Vec::new();
        let mut u = deepest;
        loop {
            if let Some(v) = self.child(u, next) {
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
        // The match state is not needed, but it is kept valid as every build did.
        self.ensure_state();
        // Suffix closure makes every path under a longer border also a path under the shortest
        // one, with a count at least as high; ranked by count, the longer borders only ever
        // produce merges, so the shortest border alone yields the same tree, faster.
        let k = self.min_depth - 1;
        let Some(start) = self.recent.len().checked_sub(k) else {
            return;
        };
        let Some(border) = self.shortest_border(self.recent.range(start..).copied(), next) else {
            return;
        };
        // The request's own buffers, kept between builds (no allocation per call).
        let mut scratch = std::mem::take(&mut self.scratch);
        self.collect_into(builder, border, budget, Source::Local, &mut scratch);
        self.mark_used(&scratch.used);
        self.scratch = scratch;
    }

    /// The last (shortest) of the borders for a context whose last `min_depth - 1` tokens are
    /// `suffix`, without walking the failure chain: the node of `suffix + [next]`. It is a
    /// border if it exists (its depth is `min_depth`), and if it does not, no longer suffix
    /// `s` has a node `s + [next]` either (suffix closure: `suffix + [next]` would be a suffix
    /// of it, hence a node), so there is no border. Two or so look-ups from the root instead
    /// of one node (a cache miss, on a large batch) per level of the match state's chain.
    pub(super) fn shortest_border(
        &self,
        mut suffix: impl Iterator<Item = u32>,
        next: u32,
    ) -> Option<u32> {
        let u = suffix.try_fold(ROOT, |u, t| self.child(u, t))?;
        self.child(u, next)
    }

    /// [`Automaton::retrieve_into`] for an explicit `context` (see [`Automaton::borders_for`]),
    /// read-only: returns the nodes used, for [`Automaton::mark_used`] or a [`Recency`]. Edges
    /// get the cells of `source`. Continuations are ranked by count, that is by their share of
    /// the border's occurrences.
    pub(crate) fn retrieve_after_into(
        &self,
        builder: &mut TreeBuilder,
        context: &[u32],
        next: u32,
        budget: usize,
        source: Source,
    ) -> Vec<u32> {
        // The last of `borders_for(context, next)`, found directly (see `shortest_border`).
        let shortest = context
            .len()
            .checked_sub(self.min_depth - 1)
            .and_then(|start| self.shortest_border(context[start..].iter().copied(), next));
        match shortest {
            Some(border) => {
                let mut scratch = Scratch::default();
                self.collect_into(builder, border, budget, source, &mut scratch);
                scratch.used
            }
            None => Vec::new(),
        }
    }

    /// Place the continuations below `border` best first until the builder holds `budget`
    /// nodes; leaves the trie nodes used (the border first) in `buffers.used`.
    fn collect_into(
        &self,
        builder: &mut TreeBuilder,
        border: u32,
        budget: usize,
        source: Source,
        buffers: &mut Scratch,
    ) {
        let Scratch {
            used,
            heap,
            candidates: scratch,
        } = buffers;
        used.clear();
        heap.clear();
        used.push(border);
        let keep = budget - 1;
        self.push_children(heap, scratch, border, 0, 1, source, keep);
        while builder.len() < budget {
            let Some(c) = heap.pop() else { break };
            let Some((placed, _)) =
                builder.child_or_insert(c.parent, c.token as i32, budget, c.cell)
            else {
                break;
            };
            used.push(c.node);
            self.push_children(heap, scratch, c.node, placed, c.rel_depth + 1, source, keep);
        }
    }

    /// Push the children of trie node `node` (placed as builder node `parent`) as candidates;
    /// only the best `keep` of them, as no more can ever be placed (see [`push_best`]).
    #[allow(clippy::too_many_arguments)]
    fn push_children(
        &self,
        heap: &mut BinaryHeap<Candidate>,
        scratch: &mut Vec<Candidate>,
        node: u32,
        parent: u32,
        rel_depth: u32,
        source: Source,
        keep: usize,
    ) {
        let (total, depth) = (
            self.nodes[node as usize].count,
            self.nodes[node as usize].depth,
        );
        scratch.clear();
        let mut c = self.nodes[node as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            scratch.push(Candidate {
                count: n.count,
                rel_depth,
                token: n.token,
                parent,
                node: c,
                cell: source.cell(depth as usize, share(n.count, total)),
            });
            c = n.next_sibling;
        }
        push_best_each(heap, scratch, keep);
    }
}

#[cfg(test)]
thread_local! {
    /// Tests switch the pruning of `push_best` off to check that it changes nothing.
    pub(crate) static PRUNE: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Push the `keep` greatest of `candidates` onto `heap` (all of them if there are fewer).
///
/// Used for the children of one placed node, which share their builder parent and carry
/// distinct tokens: each one placed becomes (or merges into) a distinct child of that parent,
/// and a tree of `capacity` nodes gives a node at most `capacity - 1` children; the heap pops
/// siblings in their own order, so with `keep = capacity - 1` the ones left out could never have
/// been placed. The tree is the same as with every child pushed, for far less heap work below
/// nodes with thousands of children (a large shared index).
pub(crate) fn push_best<T: Ord>(heap: &mut BinaryHeap<T>, candidates: &mut Vec<T>, keep: usize) {
    keep_best(candidates, keep);
    heap.extend(candidates.drain(..));
}

/// [`push_best`] pushing one candidate at a time: the heap's layout may differ from `extend`'s
/// (which may rebuild it), so only for types whose order is total over everything a build
/// reads from them (`Candidate`), where the layout cannot change what is popped. Cheaper for
/// the few candidates a trie node has.
fn push_best_each<T: Ord>(heap: &mut BinaryHeap<T>, candidates: &mut Vec<T>, keep: usize) {
    keep_best(candidates, keep);
    for c in candidates.drain(..) {
        heap.push(c);
    }
}

/// Keep only the `keep` greatest of `candidates` (all of them if there are fewer).
fn keep_best<T: Ord>(candidates: &mut Vec<T>, keep: usize) {
    #[cfg(test)]
    if !PRUNE.with(std::cell::Cell::get) {
        return;
    }
    if keep == 0 {
        candidates.clear();
        return;
    }
    if candidates.len() > keep {
        candidates.select_nth_unstable_by(keep - 1, |a, b| b.cmp(a));
        candidates.truncate(keep);
    }
}

/// Hooks for the probability-scored tree builder (`crate::draft`).
impl Automaton {
    /// Calls `f(token, probability, child, cell)` for every child of trie node `node`, where the
    /// probability is the add-one smoothed estimate `count(child) / (count(node) + 1)` that
    /// the child's token follows the node's string, and `cell` the edge's cell in the block of
    /// `source`.
    pub(crate) fn for_each_continuation(
        &self,
        node: u32,
        source: Source,
        mut f: impl FnMut(i32, f32, u32, i32),
    ) {
        let (total, depth) = (
            self.nodes[node as usize].count,
            self.nodes[node as usize].depth,
        );
        let mut c = self.nodes[node as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            #[allow(clippy::cast_precision_loss)]
            let smoothed = n.count as f32 / (total as f32 + 1.0);
            let cell = source.cell(depth as usize, share(n.count, total));
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
            }
        }
        self.push_used(nodes.iter().copied());
    }

    /// Push the evictable ones of `nodes` that were just used (at the newest tick) onto the
    /// LRU queue in node order, so they go to its sorted FIFO rather than its heap.
    fn push_used(&mut self, nodes: impl Iterator<Item = u32>) {
        let mut batch = std::mem::take(&mut self.pinned);
        batch.clear();
        for v in nodes {
            let fresh = self
                .nodes
                .get(v as usize)
                .is_some_and(|n| n.tick == self.tick);
            if !fresh || !self.is_evictable(v) {
                continue;
            }
            if batch.try_reserve(1).is_err() {
                self.push_if_evictable(v); // unsorted, still exact (it lands in the heap)
                continue;
            }
            batch.push(v);
        }
        batch.sort_unstable();
        batch.dedup();
        for &v in &batch {
            self.push_if_evictable(v);
        }
        batch.clear();
        self.pinned = batch;
    }

    /// A [`Recency`] holding `nodes` (just used by a read-only build) with their generations.
    pub(crate) fn recency(&self, nodes: &[u32]) -> Recency {
        Recency {
            nodes: nodes
                .iter()
                .map(|&v| (v, self.nodes[v as usize].generation))
                .collect(),
            epoch: self.epoch,
        }
    }

    /// Record the uses in `recency` (from a read-only build on this automaton) as happening
    /// now, as [`Automaton::retrieve`] does for its own uses. Nodes evicted since are skipped
    /// (a recycled slot has another generation, and `clear` voids every earlier `Recency`), so
    /// applying it late, after other writers, is safe; one from another automaton is harmless
    /// but meaningless (it only reorders LRU recency).
    pub fn touch(&mut self, recency: &Recency) {
        if recency.nodes.is_empty() || recency.epoch != self.epoch {
            return;
        }
        self.tick += 1;
        for &(v, generation) in &recency.nodes {
            let Some(n) = self.nodes.get_mut(v as usize) else {
                continue;
            };
            if n.alive && n.generation == generation {
                n.tick = self.tick;
            }
        }
        self.push_used(recency.nodes.iter().map(|&(v, _)| v));
    }

    /// The last `ngram` tokens of the current sequence (the match state spells them), oldest
    /// first: the context a shared automaton is asked about.
    #[must_use]
    pub fn recent_tokens(&self) -> Vec<u32> {
        self.recent.iter().copied().collect()
    }
}

fn check_token(arg: &'static str, token: i32) -> Result<()> {
    check_tokens(arg, &[token])
}

/// The share of a string's occurrences that a continuation followed.
#[allow(clippy::cast_precision_loss)]
fn share(count: u32, total: u32) -> f32 {
    if total == 0 {
        return 0.0;
    }
    (count as f32 / total as f32).min(1.0)
}
