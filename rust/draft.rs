//! RACER's draft tree: an optional draft-model chain, then retrieval paths, then the copy-logit
//! tree, merged in one trie so the budget is charged on distinct nodes. A probability-scored
//! variant picks the nodes with the highest estimated acceptance probability instead.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::automaton::{Automaton, Recency, Source, push_best};
use crate::edge_cells::{self, EDGE_CELLS};
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
/// `min(capacity, available)` nodes and is deterministic. Every node carries its edge cell
/// (`crate::edge_cells`).
///
/// `calibration`, one acceptance probability per edge cell, replaces the scored build's raw
/// edge estimates (copy-logit probabilities, smoothed retrieval frequencies) when given.
///
/// # Errors
/// `InvalidArgument` if `capacity` is outside `1..=MAX_TREE_NODES`, a token is negative or
/// outside the table, or `calibration` does not hold `EDGE_CELLS` probabilities in `[0, 1]`.
pub fn build_draft_tree(
    automaton: &mut Automaton,
    table: &LogitsTable,
    next_token: i32,
    draft_chain: &[i32],
    options: &DraftOptions,
    calibration: Option<&[f32]>,
) -> Result<DraftTree> {
    build_draft_tree_shared(
        automaton,
        None,
        table,
        next_token,
        draft_chain,
        options,
        calibration,
    )
    .map(|(tree, _)| tree)
}

/// [`build_draft_tree`] with a second retrieval source: `shared`, an automaton read by every
/// request (past responses, a corpus). Its borders are found for the request's context, the
/// recent tokens of `automaton` (at most its `ngram`), so `shared` needs no match state and is
/// only read: never extended, its state untouched. Its edges get the shared-retrieval cells.
///
/// - Halving build: the request's retrieval first, then the shared continuations (ranked by
///   count, i.e. by their share of the border's occurrences) fill up to `capacity`, then the
///   logits tree.
/// - Scored build: shared continuations enter the same best-first heap with their own smoothed
///   probabilities (or their cells' calibration).
///
/// Paths spelling the same tokens merge (a node keeps the cell of its first source). With no
/// `shared`, or an empty one, the tree is the one [`build_draft_tree`] builds.
///
/// Returns the tree and the shared nodes it used, for `shared.touch` to refresh their LRU
/// recency (the only change drafting makes to `shared`; a caller holding `shared` behind a
/// read-write lock applies it under the write lock, after the build released the read lock).
///
/// # Errors
/// As [`build_draft_tree`].
pub fn build_draft_tree_shared(
    automaton: &mut Automaton,
    shared: Option<&Automaton>,
    table: &LogitsTable,
    next_token: i32,
    draft_chain: &[i32],
    options: &DraftOptions,
    calibration: Option<&[f32]>,
) -> Result<(DraftTree, Recency)> {
    check_budget("capacity", options.capacity)?;
    if let Some(c) = calibration {
        check_calibration(c)?;
    }
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
    let shared = shared.filter(|_| options.use_retrieval);
    let context = shared
        .map(|_| automaton.recent_tokens())
        .unwrap_or_default();
    let next = next_token as u32;
    let mut builder = TreeBuilder::with_capacity(next_token, options.capacity);
    builder.insert_path(draft_chain, options.capacity);
    if options.scored {
        let shared_used =
            ScoredBuild::new(automaton, shared, &context, table, options, calibration)
                .run(&mut builder, next);
        let recency = shared.map(|s| s.recency(&shared_used)).unwrap_or_default();
        return Ok((within_vocabulary(builder.finish(), vocab)?, recency));
    }
    let mut recency = Recency::default();
    if options.use_retrieval {
        automaton.retrieve_into(&mut builder, next, options.capacity);
        if let Some(s) = shared {
            let used = s.retrieve_after_into(
                &mut builder,
                &context,
                next,
                options.capacity,
                Source::Shared,
            );
            recency = s.recency(&used);
        }
    }
    if options.use_logits {
        table.expand_into(&mut builder, options.capacity, options.exempt_depth);
    }
    Ok((within_vocabulary(builder.finish(), vocab)?, recency))
}

/// `tree`, unless retrieval put a token outside `0..vocab` in it: automata take any
/// non-negative id, so an automaton filled with another tokenizer's ids (a shared index most
/// often) would otherwise hand the engine ids its embedding does not have.
///
/// # Errors
/// `InvalidArgument` naming the automaton the token came from (`shared` or `automaton`).
fn within_vocabulary(tree: DraftTree, vocab: usize) -> Result<DraftTree> {
    let Some(node) = tree.tokens().iter().position(|&t| t as usize >= vocab) else {
        return Ok(tree);
    };
    let from_shared = edge_cells::kind(tree.cells()[node]) == edge_cells::EdgeKind::SharedRetrieval;
    Err(invalid(
        if from_shared { "shared" } else { "automaton" },
        format!(
            "drafted token {} is outside the vocabulary 0..{vocab}: the automaton holds another \
             tokenizer's ids",
            tree.tokens()[node]
        ),
    ))
}

/// Where a scored candidate comes from (the last tie-break, after its trie node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Origin {
    Logits,
    Local,
    Shared,
}

/// Check a calibration: one acceptance probability in `[0, 1]` per edge cell.
///
/// # Errors
/// `InvalidArgument` naming `calibration` otherwise.
pub(crate) fn check_calibration(c: &[f32]) -> Result<()> {
    if c.len() != EDGE_CELLS {
        return Err(invalid(
            "calibration",
            format!(
                "needs {EDGE_CELLS} probabilities (one per edge cell), got {}",
                c.len()
            ),
        ));
    }
    if let Some(p) = c.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(invalid(
            "calibration",
            format!("probabilities must be in [0, 1], got {p}"),
        ));
    }
    Ok(())
}

/// A node waiting to be placed, with its estimated path probability.
#[derive(Debug, Clone, Copy)]
struct Scored {
    score: f32,
    token: i32,
    parent: u32,
    /// The trie node it came from, or `u32::MAX` for a copy-logit candidate.
    trie: u32,
    origin: Origin,
    cell: i32,
}

impl PartialEq for Scored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Scored {}

impl Ord for Scored {
    /// Higher score first; ties go to the smaller token, parent and trie node, then to the
    /// request's automaton before the shared one (deterministic).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.token.cmp(&self.token))
            .then(other.parent.cmp(&self.parent))
            .then(other.trie.cmp(&self.trie))
            .then(other.origin.cmp(&self.origin))
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
    shared: Option<&'a Automaton>,
    context: &'a [u32],
    table: &'a LogitsTable,
    options: &'a DraftOptions,
    calibration: Option<&'a [f32]>,
    heap: BinaryHeap<Scored>,
    logits_expanded: Vec<bool>,
    used: Vec<u32>,
    shared_used: Vec<u32>,
    scratch: Vec<Scored>,
}

impl<'a> ScoredBuild<'a> {
    fn new(
        automaton: &'a mut Automaton,
        shared: Option<&'a Automaton>,
        context: &'a [u32],
        table: &'a LogitsTable,
        options: &'a DraftOptions,
        calibration: Option<&'a [f32]>,
    ) -> Self {
        Self {
            automaton,
            shared,
            context,
            table,
            options,
            calibration,
            heap: BinaryHeap::new(),
            logits_expanded: Vec::new(),
            used: Vec::new(),
            shared_used: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Grow the tree; marks the request automaton's used nodes and returns the shared ones.
    fn run(mut self, builder: &mut TreeBuilder, next: u32) -> Vec<u32> {
        // Nodes already there (root and draft chain) are certain as far as drafting goes.
        for node in 0..builder.len() as u32 {
            self.push_logits(builder, node, 1.0);
        }
        if self.options.use_retrieval {
            for border in self.automaton.borders(next) {
                self.used.push(border);
                self.push_trie(Origin::Local, border, 0, 1.0);
            }
            if let Some(shared) = self.shared {
                for border in shared.borders_for(self.context, next) {
                    self.shared_used.push(border);
                    self.push_trie(Origin::Shared, border, 0, 1.0);
                }
            }
        }
        while builder.len() < self.options.capacity {
            let Some(c) = self.heap.pop() else { break };
            if c.score < self.options.min_score {
                break; // the heap is best first: nothing left scores higher
            }
            let Some((node, _)) =
                builder.child_or_insert(c.parent, c.token, self.options.capacity, c.cell)
            else {
                break;
            };
            self.push_logits(builder, node, c.score);
            match c.origin {
                Origin::Logits => {}
                Origin::Local => self.used.push(c.trie),
                Origin::Shared => self.shared_used.push(c.trie),
            }
            if c.origin != Origin::Logits {
                self.push_trie(c.origin, c.trie, node, c.score);
            }
        }
        self.automaton.mark_used(&self.used);
        self.shared_used
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
        let Some((ids, probs, measured)) = self.table.row_entry(token) else {
            return;
        };
        for (j, (&t, &p)) in ids.iter().zip(probs).enumerate() {
            let cell = edge_cells::logits(j, measured.then_some(p));
            self.heap.push(Scored {
                score: score * self.edge(cell, p),
                token: t,
                parent: node,
                trie: u32::MAX,
                origin: Origin::Logits,
                cell,
            });
        }
    }

    fn push_trie(&mut self, origin: Origin, trie: u32, parent: u32, score: f32) {
        let calibration = self.calibration;
        let (automaton, source): (&Automaton, Source) = match (origin, self.shared) {
            (Origin::Shared, Some(shared)) => (shared, Source::Shared),
            _ => (&*self.automaton, Source::Local),
        };
        let scratch = &mut self.scratch;
        scratch.clear();
        automaton.for_each_continuation(trie, source, |token, p, child, share_cell| {
            // `p` is the count estimate `count / (parent count + 1)`: its cell (by match
            // length and estimate) is what a calibration learns.
            let cell = edge_cells::by_estimate(share_cell, p);
            scratch.push(Scored {
                score: score * calibration.map_or(p, |c| c[cell as usize]),
                token,
                parent,
                trie: child,
                origin,
                cell,
            });
        });
        // Siblings placed under one builder node: at most `capacity - 1` can ever be placed.
        push_best(&mut self.heap, scratch, self.options.capacity - 1);
    }

    /// The edge's acceptance estimate: calibrated by cell when a calibration is given.
    fn edge(&self, cell: i32, raw: f32) -> f32 {
        self.calibration.map_or(raw, |c| c[cell as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge_cells::{EdgeKind, kind};

    /// An automaton that has seen `1 2 3 4 5` twice, and a table whose every row is written.
    fn sources() -> (Automaton, LogitsTable) {
        let mut a = Automaton::new(6, 1000, 2).unwrap();
        a.extend(&[1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 8, 1]).unwrap();
        let mut t = LogitsTable::new(50, 4).unwrap();
        let tokens: Vec<i32> = (0..50).collect();
        let ids: Vec<i32> = (0..50)
            .flat_map(|r| (0..4).map(move |j| (r * 4 + j + 20) % 50))
            .collect();
        let probs: Vec<f32> = (0..50).flat_map(|_| [0.4, 0.3, 0.2, 0.1]).collect();
        t.update_with_probs(&tokens, &ids, 4, Some(&probs)).unwrap();
        (a, t)
    }

    #[test]
    fn every_node_carries_the_cell_of_its_source() {
        let context = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 5, 8, 1];
        let (mut a, t) = sources();
        for scored in [false, true] {
            let options = DraftOptions {
                capacity: 24,
                scored,
                ..Default::default()
            };
            let tree = build_draft_tree(&mut a, &t, 2, &[7, 7], &options, None).unwrap();
            let (cells, parents, tokens) = (tree.cells(), tree.parents(), tree.tokens());
            assert_eq!(kind(cells[0]), EdgeKind::Root);
            let path = |mut i: usize| {
                let mut p = vec![tokens[i]];
                while i != 0 {
                    i = parents[i] as usize;
                    p.insert(0, tokens[i]);
                }
                p
            };
            let mut kinds = Vec::new();
            for i in 1..tree.len() {
                let parent_row = t.row(tokens[parents[i] as usize]).unwrap();
                match kind(cells[i]) {
                    EdgeKind::Chain => assert_eq!(path(i), vec![2, 7, 7][..path(i).len()].to_vec()),
                    EdgeKind::Logits => assert!(parent_row.contains(&tokens[i]), "node {i}"),
                    EdgeKind::Retrieval => {
                        let p = path(i);
                        assert!(
                            context.windows(p.len()).any(|w| w == p.as_slice()),
                            "node {i}: {p:?}"
                        );
                    }
                    EdgeKind::SharedRetrieval => panic!("node {i}: no shared automaton was given"),
                    EdgeKind::Root => panic!("node {i} has no cell"),
                }
                kinds.push(kind(cells[i]));
            }
            for k in [EdgeKind::Chain, EdgeKind::Logits, EdgeKind::Retrieval] {
                assert!(kinds.contains(&k), "{k:?} missing (scored: {scored})");
            }
        }
    }

    #[test]
    fn calibration_steers_the_scored_tree_between_sources() {
        let (mut a, t) = sources();
        let options = DraftOptions {
            capacity: 4,
            scored: true,
            ..Default::default()
        };
        let calibrated = |retrieval: f32, logits: f32| -> Vec<f32> {
            (0..EDGE_CELLS as i32)
                .map(|c| match kind(c) {
                    EdgeKind::Retrieval => retrieval,
                    _ => logits,
                })
                .collect()
        };
        let trust_retrieval = calibrated(0.95, 0.05);
        let tree = build_draft_tree(&mut a, &t, 2, &[], &options, Some(&trust_retrieval)).unwrap();
        assert_eq!(tree.tokens(), &[2, 3, 4, 5]); // the retrieved continuation as one chain
        let trust_logits = calibrated(0.05, 0.95);
        let tree = build_draft_tree(&mut a, &t, 2, &[], &options, Some(&trust_logits)).unwrap();
        assert!(
            tree.cells()[1..]
                .iter()
                .all(|&c| kind(c) == EdgeKind::Logits)
        );
        let wrong = vec![0.5; EDGE_CELLS - 1];
        assert!(build_draft_tree(&mut a, &t, 2, &[], &options, Some(&wrong)).is_err());
        let out_of_range = vec![1.5; EDGE_CELLS];
        assert!(build_draft_tree(&mut a, &t, 2, &[], &options, Some(&out_of_range)).is_err());
    }

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
                None,
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
            let tree = build_draft_tree(&mut a, &t, 2, &[], &options, None).unwrap();
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
            None,
        )
        .unwrap();
        assert_eq!(chain.tokens(), &[2, 9, 9]);
    }

    /// Token path from the root to every node of `tree`.
    fn paths(tree: &DraftTree) -> Vec<Vec<i32>> {
        let mut out: Vec<Vec<i32>> = Vec::with_capacity(tree.len());
        for i in 0..tree.len() {
            let p = tree.parents()[i];
            let mut path = if p < 0 {
                vec![]
            } else {
                out[p as usize].clone()
            };
            path.push(tree.tokens()[i]);
            out.push(path);
        }
        out
    }

    /// Whether `path` followed a suffix (1..=ngram - 1 tokens, within `ngram` in all) of
    /// `context` in one of `corpus`'s sequences.
    fn occurred_after(corpus: &[Vec<i32>], context: &[i32], path: &[i32], ngram: usize) -> bool {
        (1..=context.len().min(ngram.saturating_sub(path.len()))).any(|k| {
            let mut s = context[context.len() - k..].to_vec();
            s.extend_from_slice(path);
            corpus
                .iter()
                .any(|seq| seq.windows(s.len()).any(|w| w == s.as_slice()))
        })
    }

    #[test]
    fn shared_continuations_merge_into_both_builds_with_their_own_cells() {
        let (mut a, t) = sources();
        let corpus = vec![vec![4, 1, 2, 6, 7, 8], vec![3, 1, 2, 6, 9]];
        let mut shared = Automaton::new(6, 1000, 2).unwrap();
        for seq in &corpus {
            shared.extend(seq).unwrap();
            shared.new_sequence();
        }
        let context: Vec<i32> = a.recent_tokens().iter().map(|&x| x as i32).collect();
        for scored in [false, true] {
            let options = DraftOptions {
                capacity: 40,
                scored,
                ..Default::default()
            };
            let (tree, recency) =
                build_draft_tree_shared(&mut a, Some(&shared), &t, 2, &[], &options, None).unwrap();
            assert!(!recency.is_empty());
            let paths = paths(&tree);
            let mut n_shared = 0;
            for (path, &cell) in paths.iter().zip(tree.cells()).skip(1) {
                if kind(cell) == EdgeKind::SharedRetrieval {
                    assert!(occurred_after(&corpus, &context, path, 6), "{path:?}");
                    n_shared += 1;
                }
            }
            // "1 2" then 6 (7 8 | 9) appears only in the shared corpus.
            assert!(n_shared >= 2, "scored: {scored}");
            assert!(paths.contains(&vec![2, 6, 7, 8]) || scored);
            let before = shared.to_bytes();
            shared.touch(&recency);
            let after = shared.to_bytes();
            assert_eq!(before.len(), after.len());
            assert_ne!(before, after); // recency only: same size, same counts
            shared.check_integrity().unwrap();
        }
    }

    #[test]
    fn an_empty_or_absent_shared_automaton_changes_nothing() {
        let empty = Automaton::new(6, 1000, 2).unwrap();
        for scored in [false, true] {
            let options = DraftOptions {
                capacity: 30,
                scored,
                ..Default::default()
            };
            let (mut a, t) = sources();
            let (mut b, _) = sources();
            let plain = build_draft_tree(&mut a, &t, 2, &[7], &options, None).unwrap();
            let (merged, recency) =
                build_draft_tree_shared(&mut b, Some(&empty), &t, 2, &[7], &options, None).unwrap();
            assert_eq!(plain, merged);
            assert!(recency.is_empty());
            assert_eq!(a.to_bytes(), b.to_bytes());
        }
    }

    #[test]
    fn keeping_only_the_best_children_changes_no_tree() {
        use crate::automaton::PRUNE;
        let mut seed = 5u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as i32
        };
        // A wide alphabet: nodes with dozens of children, more than small trees can hold.
        let stream: Vec<i32> = (0..4000).map(|_| next() % 60).collect();
        let mut local = Automaton::new(4, 100_000, 1).unwrap();
        local.extend(&stream[..2000]).unwrap();
        let mut shared = Automaton::new(5, 3000, 2).unwrap();
        shared.extend(&stream[2000..]).unwrap();
        shared.new_sequence();
        let (_, t) = sources();
        let mut t60 = LogitsTable::new(60, 3).unwrap();
        let rows: Vec<i32> = (0..60).collect();
        let ids: Vec<i32> = (0..180).map(|i| (i * 7 + 1) % 60).collect();
        t60.update(&rows, &ids, 3).unwrap();
        drop(t);
        for capacity in [1, 2, 3, 5, 8, 13, 40] {
            for scored in [false, true] {
                for with_shared in [false, true] {
                    let options = DraftOptions {
                        capacity,
                        scored,
                        ..Default::default()
                    };
                    let root = next() % 60;
                    let shared = with_shared.then_some(&shared);
                    let run = |prune: bool| {
                        PRUNE.with(|p| p.set(prune));
                        let mut a = local.clone();
                        let (tree, recency) = build_draft_tree_shared(
                            &mut a,
                            shared,
                            &t60,
                            root,
                            &[],
                            &options,
                            None,
                        )
                        .unwrap();
                        let retrieved = a.retrieve(root, capacity).unwrap();
                        (tree, recency, retrieved, a.to_bytes())
                    };
                    let (pruned, full) = (run(true), run(false));
                    PRUNE.with(|p| p.set(true));
                    assert_eq!(pruned, full, "capacity {capacity}, scored {scored}");
                }
            }
        }
    }
}
