//! The copy-logit table: for every token id, the target's top-k next tokens saved at the most
//! recent occurrence of that token, and the breadth-halving logits tree grown from it.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::alloc::{grow, hash_map_bytes, out_of_memory};
use crate::edge_cells;
use crate::error::{Result, invalid};
use crate::tree::{DraftTree, TreeBuilder, check_budget};

/// Largest table accepted (1 GiB of ids), so absurd sizes fail cleanly instead of aborting.
const MAX_CELLS: usize = 1 << 28;

/// A sparse `vocab_size x top_k` table of token ids: only the rows written are stored, packed
/// in the order they were first written, so memory follows the rows held, not the vocabulary.
#[derive(Debug, Clone)]
pub struct LogitsTable {
    vocab_size: usize,
    top_k: usize,
    /// Token -> its row's slot in the packed arrays, with `MEASURED` set when the row's
    /// probabilities were given (rather than the rank prior): one look-up answers both.
    slots: FxHashMap<u32, u32>,
    /// `top_k` ids per slot.
    ids: Vec<i32>,
    /// Probability of each stored id under the target (a rank prior when none was given).
    probs: Vec<f32>,
    /// Rows held (slots `0..rows`).
    rows: usize,
}

/// The flag of a slot whose probabilities were given; slots are below `MAX_CELLS` (2**28).
const MEASURED: u32 = 1 << 31;

fn check_token(vocab_size: usize, arg: &'static str, t: i32) -> Result<usize> {
    if t < 0 || t as usize >= vocab_size {
        return Err(invalid(
            arg,
            format!("token {t} is outside 0..{vocab_size}"),
        ));
    }
    Ok(t as usize)
}

/// Probability assumed for rank `j` when the caller gives ids without probabilities.
fn rank_prior(j: usize) -> f32 {
    0.5f32.powi(i32::try_from(j + 1).unwrap_or(i32::MAX))
}

impl LogitsTable {
    /// An empty table.
    ///
    /// # Errors
    /// `InvalidArgument` if `vocab_size` or `top_k` is below 1 or absurdly large.
    pub fn new(vocab_size: usize, top_k: usize) -> Result<Self> {
        Self::check_shape(vocab_size, top_k)?;
        Ok(Self {
            vocab_size,
            top_k,
            slots: FxHashMap::default(),
            ids: Vec::new(),
            probs: Vec::new(),
            rows: 0,
        })
    }

    /// Check the shape [`LogitsTable::new`] takes without allocating anything; returns the
    /// number of cells (`vocab_size * top_k`).
    ///
    /// # Errors
    /// As [`LogitsTable::new`].
    pub fn check_shape(vocab_size: usize, top_k: usize) -> Result<usize> {
        if vocab_size < 1 || vocab_size > i32::MAX as usize {
            return Err(invalid(
                "vocab_size",
                format!("must be in 1..=2**31-1, got {vocab_size}"),
            ));
        }
        if !(1..=1024).contains(&top_k) {
            return Err(invalid(
                "top_k",
                format!("must be in 1..=1024, got {top_k}"),
            ));
        }
        vocab_size
            .checked_mul(top_k)
            .filter(|&c| c <= MAX_CELLS)
            .ok_or_else(|| {
                invalid(
                    "vocab_size",
                    format!(
                        "vocab_size * top_k = {vocab_size} * {top_k} cells; at most {MAX_CELLS} (2**28)"
                    ),
                )
            })
    }

    /// Number of token ids the table covers.
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids stored per row.
    #[must_use]
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Rows written at least once.
    #[must_use]
    pub fn rows_written(&self) -> usize {
        self.slots.len()
    }

    /// Heap memory held, in bytes (the containers' capacities): about `top_k * 8 + 12` bytes
    /// per row written, nothing for the rows never written.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        hash_map_bytes(self.slots.capacity(), size_of::<(u32, u32)>())
            + self.ids.capacity() * size_of::<i32>()
            + self.probs.capacity() * size_of::<f32>()
    }

    /// The slot of `token`'s row and whether its probabilities were given, if it was written
    /// (and is in range).
    fn slot(&self, token: i32) -> Option<(usize, bool)> {
        let t = u32::try_from(token).ok()?;
        self.slots
            .get(&t)
            .map(|&s| ((s & !MEASURED) as usize, s & MEASURED != 0))
    }

    /// Room for `rows` more rows, so an update that starts cannot fail halfway.
    fn reserve_rows(&mut self, rows: usize) -> Result<()> {
        let what = "the copy-logit table's rows";
        let cells = rows.saturating_mul(self.top_k);
        grow(&mut self.ids, cells, what)?;
        grow(&mut self.probs, cells, what)?;
        self.slots
            .try_reserve(rows)
            .map_err(|_| out_of_memory(what, rows * size_of::<(u32, u32)>()))
    }

    fn check_token(&self, arg: &'static str, t: i32) -> Result<usize> {
        check_token(self.vocab_size, arg, t)
    }

    /// For i in order, row `tokens[i]` := `topk_ids[i*k..(i+1)*k]`; the last write wins.
    /// Nothing is written unless every input is valid.
    ///
    /// # Errors
    /// `InvalidArgument` on a shape mismatch or an id outside the vocabulary.
    pub fn update(&mut self, tokens: &[i32], topk_ids: &[i32], k: usize) -> Result<()> {
        self.update_with_probs(tokens, topk_ids, k, None)
    }

    /// Like [`update`](Self::update), also storing the probability of every id
    /// (`topk_probs`, same shape as `topk_ids`, values in `[0, 1]`), which the probability-scored
    /// tree uses. Without probabilities, rank `j` is assumed to have probability `2^-(j+1)`.
    ///
    /// # Errors
    /// `InvalidArgument` on a shape mismatch, an id outside the vocabulary or a probability
    /// outside `[0, 1]`; nothing is written then.
    pub fn update_with_probs(
        &mut self,
        tokens: &[i32],
        topk_ids: &[i32],
        k: usize,
        topk_probs: Option<&[f32]>,
    ) -> Result<()> {
        Self::check_update(self.vocab_size, self.top_k, tokens, topk_ids, k, topk_probs)?;
        let new_rows = tokens
            .iter()
            .filter(|&&t| !self.slots.contains_key(&(t as u32)))
            .count();
        self.reserve_rows(new_rows)?;
        let flag = if topk_probs.is_some() { MEASURED } else { 0 };
        for (i, &t) in tokens.iter().enumerate() {
            let next = self.rows as u32;
            let entry = self.slots.entry(t as u32).or_insert(next);
            *entry = (*entry & !MEASURED) | flag;
            let slot = (*entry & !MEASURED) as usize;
            if slot == self.rows {
                self.ids.resize(self.ids.len() + k, 0);
                self.probs.resize(self.probs.len() + k, 0.0);
                self.rows += 1;
            }
            self.ids[slot * k..(slot + 1) * k].copy_from_slice(&topk_ids[i * k..(i + 1) * k]);
            let cells = &mut self.probs[slot * k..(slot + 1) * k];
            match topk_probs {
                Some(probs) => cells.copy_from_slice(&probs[i * k..(i + 1) * k]),
                None => cells
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, p)| *p = rank_prior(j)),
            }
        }
        Ok(())
    }

    /// Check the inputs of [`update_with_probs`](Self::update_with_probs) for a table of this
    /// shape without writing anything.
    ///
    /// # Errors
    /// As [`update_with_probs`](Self::update_with_probs).
    pub fn check_update(
        vocab_size: usize,
        top_k: usize,
        tokens: &[i32],
        topk_ids: &[i32],
        k: usize,
        topk_probs: Option<&[f32]>,
    ) -> Result<()> {
        if k != top_k {
            return Err(invalid(
                "topk_ids",
                format!("expected {top_k} columns, got {k}"),
            ));
        }
        if topk_ids.len() != tokens.len() * k {
            return Err(invalid(
                "topk_ids",
                format!(
                    "expected {} rows to match tokens, got {}",
                    tokens.len(),
                    topk_ids.len() / k.max(1)
                ),
            ));
        }
        for &t in tokens {
            check_token(vocab_size, "tokens", t)?;
        }
        for &t in topk_ids {
            check_token(vocab_size, "topk_ids", t)?;
        }
        if let Some(probs) = topk_probs {
            if probs.len() != topk_ids.len() {
                return Err(invalid("topk_probs", "must have the shape of topk_ids"));
            }
            if let Some(p) = probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
                return Err(invalid(
                    "topk_probs",
                    format!("probabilities must be in [0, 1], got {p}"),
                ));
            }
        }
        Ok(())
    }

    /// The stored ids of `token`, or `None` if its row was never written (or it is out of range).
    #[must_use]
    pub fn row(&self, token: i32) -> Option<&[i32]> {
        let (s, _) = self.slot(token)?;
        Some(&self.ids[s * self.top_k..(s + 1) * self.top_k])
    }

    /// The stored probabilities of `token`'s ids, or `None` if its row was never written.
    #[must_use]
    pub fn row_probs(&self, token: i32) -> Option<&[f32]> {
        let (s, _) = self.slot(token)?;
        Some(&self.probs[s * self.top_k..(s + 1) * self.top_k])
    }

    /// The probabilities given for `token`'s ids, or `None` if its row was never written or was
    /// written without probabilities.
    #[must_use]
    pub fn measured_probs(&self, token: i32) -> Option<&[f32]> {
        let (s, measured) = self.slot(token)?;
        measured.then(|| &self.probs[s * self.top_k..(s + 1) * self.top_k])
    }

    /// The stored ids and probabilities of `token`'s row and whether the probabilities were
    /// given (one lookup for what `row`, `row_probs` and `measured_probs` answer).
    #[must_use]
    pub fn row_entry(&self, token: i32) -> Option<(&[i32], &[f32], bool)> {
        let (s, measured) = self.slot(token)?;
        let cells = s * self.top_k..(s + 1) * self.top_k;
        Some((&self.ids[cells.clone()], &self.probs[cells], measured))
    }

    /// Forget every row, releasing their memory.
    pub fn clear(&mut self) {
        self.slots = FxHashMap::default();
        self.ids = Vec::new();
        self.probs = Vec::new();
        self.rows = 0;
    }

    /// The breadth-halving logits tree of at most `budget` nodes rooted at `root`.
    ///
    /// # Errors
    /// `InvalidArgument` if `root` is out of range or `budget` outside `1..=MAX_TREE_NODES`.
    pub fn expand(&self, root: i32, budget: usize, exempt_depth: u32) -> Result<DraftTree> {
        self.check_token("root", root)?;
        check_budget("budget", budget)?;
        let mut b = TreeBuilder::new(root);
        self.expand_into(&mut b, budget, exempt_depth);
        Ok(b.finish())
    }

    /// Grow the logits tree from the builder's root, merging with nodes already there, until
    /// the builder holds `budget` nodes. Child `j` of a node at depth `d` with breadth `b` gets
    /// breadth `max(1, b >> (j + [d != exempt_depth]))`; the root has breadth `top_k`.
    pub fn expand_into(&self, builder: &mut TreeBuilder, budget: usize, exempt_depth: u32) {
        // Room for the whole tree up front (nodes are numbered below `budget`; capped, as the
        // budget is a limit, not a size), so the buffers do not grow node by node.
        let room = budget.clamp(builder.len(), 4096.max(builder.len()));
        let mut queued = vec![false; room];
        let mut queue = VecDeque::with_capacity(room);
        queue.push_back((0u32, self.top_k));
        queued[0] = true;
        while let Some((u, breadth)) = queue.pop_front() {
            if builder.len() >= budget {
                break;
            }
            let Some((row, probs, measured)) = self.row_entry(builder.token(u)) else {
                continue;
            };
            let probs = measured.then_some(probs);
            let shift0 = usize::from(builder.depth(u) != exempt_depth);
            for (j, &token) in row.iter().enumerate().take(breadth) {
                let child_breadth = (breadth >> (j + shift0).min(63)).max(1);
                let cell = edge_cells::logits(j, probs.map(|p| p[j]));
                let Some((c, _)) = builder.child_or_insert(u, token, budget, cell) else {
                    return;
                };
                let c = c as usize;
                if c >= queued.len() {
                    queued.resize(c + 1, false);
                }
                if !queued[c] {
                    queued[c] = true;
                    queue.push_back((c as u32, child_breadth));
                }
            }
        }
    }

    /// Fill a static tree template: node `i` is rank `ranks[i]` of its template parent's row.
    /// Nodes below an unwritten row are dropped with their descendants; a node that repeats a
    /// sibling's token is merged into it.
    ///
    /// # Errors
    /// `InvalidArgument` if the template is not a tree in parent-first order or a rank is
    /// outside `0..top_k`.
    pub fn expand_static(&self, root: i32, parents: &[i32], ranks: &[i32]) -> Result<DraftTree> {
        self.check_token("root", root)?;
        if parents.is_empty() || parents[0] != -1 {
            return Err(invalid(
                "parents",
                "the template must start with the root (parent -1)",
            ));
        }
        if parents.len() != ranks.len() {
            return Err(invalid("ranks", "must have one entry per template node"));
        }
        for i in 1..parents.len() {
            if parents[i] < 0 || parents[i] as usize >= i {
                return Err(invalid(
                    "parents",
                    format!("parents[{i}] must be in 0..{i}"),
                ));
            }
            if ranks[i] < 0 || ranks[i] as usize >= self.top_k {
                return Err(invalid(
                    "ranks",
                    format!("ranks[{i}] must be in 0..{}", self.top_k),
                ));
            }
        }
        let mut b = TreeBuilder::new(root);
        let mut placed: Vec<Option<u32>> = vec![None; parents.len()];
        placed[0] = Some(0);
        for i in 1..parents.len() {
            let Some(p) = placed[parents[i] as usize] else {
                continue;
            };
            let Some(row) = self.row(b.token(p)) else {
                continue;
            };
            let rank = ranks[i] as usize;
            let cell = edge_cells::logits(rank, self.measured_probs(b.token(p)).map(|q| q[rank]));
            placed[i] = b
                .child_or_insert(p, row[rank], usize::MAX, cell)
                .map(|(c, _)| c);
        }
        Ok(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_table(vocab: usize, k: usize) -> LogitsTable {
        // Every row holds k distinct tokens that never repeat an ancestor in a short walk.
        let mut t = LogitsTable::new(vocab, k).unwrap();
        let tokens: Vec<i32> = (0..vocab as i32).collect();
        let ids: Vec<i32> = (0..vocab)
            .flat_map(|r| (0..k).map(move |j| ((r * k + j + 1) % vocab) as i32))
            .collect();
        t.update(&tokens, &ids, k).unwrap();
        t
    }

    fn level_sizes(t: &DraftTree) -> Vec<usize> {
        let mut sizes = vec![0; t.max_depth() + 1];
        for &d in t.depths() {
            sizes[d as usize] += 1;
        }
        sizes
    }

    #[test]
    fn shapes_match_the_reference_rule() {
        let t = full_table(100_000, 8);
        assert_eq!(level_sizes(&t.expand(0, 16, 1).unwrap()), vec![1, 8, 7]);
        assert_eq!(
            level_sizes(&t.expand(0, 32, 1).unwrap()),
            vec![1, 8, 12, 11]
        );
        assert_eq!(
            level_sizes(&t.expand(0, 64, 1).unwrap()),
            vec![1, 8, 12, 17, 18, 8]
        );
        assert_eq!(
            level_sizes(&t.expand(0, 96, 1).unwrap()),
            vec![1, 8, 12, 17, 18, 18, 18, 4]
        );
        assert_eq!(
            level_sizes(&t.expand(0, 64, 0).unwrap()),
            vec![1, 8, 19, 24, 12]
        );
    }

    #[test]
    fn unseen_rows_have_no_children() {
        let t = LogitsTable::new(10, 4).unwrap();
        assert_eq!(t.expand(3, 64, 1).unwrap().len(), 1);
    }

    #[test]
    fn memory_follows_the_rows_written() {
        let mut t = LogitsTable::new(152_000, 8).unwrap();
        assert_eq!(t.memory_bytes(), 0);
        let tokens: Vec<i32> = (0..1000).map(|i| i * 151).collect();
        let ids: Vec<i32> = (0..8000).collect();
        t.update(&tokens, &ids, 8).unwrap();
        t.update(&tokens[..10], &ids[..80], 8).unwrap(); // rewrites cost nothing more
        assert_eq!(t.rows_written(), 1000);
        let bytes = t.memory_bytes();
        assert!(
            (1000 * (8 * 8 + 9)..4 * 1000 * (8 * 8 + 9)).contains(&bytes),
            "{bytes}"
        );
        assert_eq!(t.row(151 * 7).unwrap(), &ids[56..64]);
        assert!(t.row(1).is_none() && t.row(-1).is_none() && t.row(1 << 30).is_none());
        t.clear();
        assert_eq!((t.rows_written(), t.memory_bytes()), (0, 0));
    }

    #[test]
    fn failed_update_writes_nothing() {
        let mut t = LogitsTable::new(10, 2).unwrap();
        assert!(t.update(&[1, 2], &[3, 4, 5, 99], 2).is_err());
        assert!(t.row(1).is_none());
        assert_eq!(t.rows_written(), 0);
    }
}
