//! Edge cells: a small, fixed classification of draft-tree edges by where the drafted token came
//! from and what its source knew about it, so that acceptance can be calibrated per cell.
//!
//! Every non-root node of a draft tree carries the cell of the edge from its parent. A caller
//! that counts, per cell, how often a node is accepted when its parent was accepted learns the
//! conditional acceptance probability of each kind of edge; the product of those along a path is
//! the node's estimated acceptance probability, and the best-first builder can grow trees by the
//! calibrated estimates instead of its raw ones (see `crate::draft`).
//!
//! Layout (offsets into one array of [`EDGE_CELLS`] values):
//! - chain edges (a draft model's or prompt lookup's chain), by depth 1..=8;
//! - copy-logit edges with a stored probability, by that probability in tenths;
//! - copy-logit edges without probabilities, by rank 0..=7 in the parent's row;
//! - retrieval edges from the request's own automaton, by the length of the matched context
//!   string (1..=8) and the continuation's share of the string's occurrences (fifths);
//! - shared-retrieval edges, from an automaton shared across requests (past responses, a
//!   corpus), by the same match length and share: a continuation seen in other requests may be
//!   more or less reliable than one seen in this request, so calibration learns them apart;
//! - the scored build's retrieval edges, request's own then shared, by match length and the
//!   continuation's count estimate `count / (parent count + 1)` in tenths: unlike the raw
//!   share, the estimate grows with the evidence (a continuation seen once after a string seen
//!   once is 1/2, seen 9 times after 9 is 9/10), as SuffixDecoding's count ratio does.
//!
//! New blocks are appended, so the offsets of the older ones never move.
#![forbid(unsafe_code)]

const DEPTH_BUCKETS: usize = 8;
const PROB_BUCKETS: usize = 10;
const RANK_BUCKETS: usize = 8;
const MATCH_BUCKETS: usize = 8;
const SHARE_BUCKETS: usize = 5;

const CHAIN: usize = 0;
const LOGITS_PROB: usize = CHAIN + DEPTH_BUCKETS;
const LOGITS_RANK: usize = LOGITS_PROB + PROB_BUCKETS;
const RETRIEVAL: usize = LOGITS_RANK + RANK_BUCKETS;
const SHARED_RETRIEVAL: usize = RETRIEVAL + MATCH_BUCKETS * SHARE_BUCKETS;
const ESTIMATE_BUCKETS: usize = 10;
const RETRIEVAL_ESTIMATE: usize = SHARED_RETRIEVAL + MATCH_BUCKETS * SHARE_BUCKETS;
const SHARED_ESTIMATE: usize = RETRIEVAL_ESTIMATE + MATCH_BUCKETS * ESTIMATE_BUCKETS;

/// Number of edge cells.
pub const EDGE_CELLS: usize = SHARED_ESTIMATE + MATCH_BUCKETS * ESTIMATE_BUCKETS;
/// The cell of the root, which has no edge.
pub const NO_CELL: i32 = -1;

#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
fn cell(index: usize) -> i32 {
    index as i32
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn bucket(value: f32, buckets: usize) -> usize {
    if value.is_nan() || value <= 0.0 {
        return 0;
    }
    ((value * buckets as f32) as usize).min(buckets - 1)
}

/// Cell of a chain edge into a node at `depth` (>= 1).
#[must_use]
pub fn chain(depth: usize) -> i32 {
    cell(CHAIN + depth.clamp(1, DEPTH_BUCKETS) - 1)
}

/// Cell of a copy-logit edge: by the stored probability when there is one, else by `rank`.
#[must_use]
pub fn logits(rank: usize, prob: Option<f32>) -> i32 {
    match prob {
        Some(p) => cell(LOGITS_PROB + bucket(p, PROB_BUCKETS)),
        None => cell(LOGITS_RANK + rank.min(RANK_BUCKETS - 1)),
    }
}

/// Cell of a retrieval edge continuing a matched string of `match_len` tokens with a token that
/// followed `share` of its occurrences.
#[must_use]
pub fn retrieval(match_len: usize, share: f32) -> i32 {
    cell(RETRIEVAL + match_share(match_len, share))
}

/// Cell of a shared-retrieval edge (a continuation found in the automaton shared across
/// requests) continuing a matched string of `match_len` tokens with a token that followed
/// `share` of its occurrences there.
#[must_use]
pub fn shared_retrieval(match_len: usize, share: f32) -> i32 {
    cell(SHARED_RETRIEVAL + match_share(match_len, share))
}

/// The scored build's cell of a retrieval edge: `cell` is the edge's share cell (from
/// [`retrieval`] or [`shared_retrieval`], which give its source and match length) and
/// `estimate` the continuation's count estimate `count / (parent count + 1)`. Any other cell is
/// returned as it is.
#[must_use]
#[allow(clippy::cast_sign_loss)]
pub fn by_estimate(cell: i32, estimate: f32) -> i32 {
    let block = match kind(cell) {
        EdgeKind::Retrieval if (cell as usize) < SHARED_RETRIEVAL => RETRIEVAL_ESTIMATE,
        EdgeKind::SharedRetrieval if (cell as usize) < RETRIEVAL_ESTIMATE => SHARED_ESTIMATE,
        _ => return cell,
    };
    let start = if block == RETRIEVAL_ESTIMATE {
        RETRIEVAL
    } else {
        SHARED_RETRIEVAL
    };
    let m = (cell as usize - start) / SHARE_BUCKETS;
    self::cell(block + m * ESTIMATE_BUCKETS + bucket(estimate, ESTIMATE_BUCKETS))
}

/// Every cell's counterpart for the same edge found in the automaton shared across requests: a
/// request's own retrieval cell (by share or by estimate) maps to the shared cell of the same
/// match length and share (or estimate); every other cell maps to itself.
#[must_use]
pub fn shared_counterparts() -> Vec<i32> {
    (0..EDGE_CELLS)
        .map(|index| {
            let offset = if (RETRIEVAL..SHARED_RETRIEVAL).contains(&index) {
                SHARED_RETRIEVAL - RETRIEVAL
            } else if (RETRIEVAL_ESTIMATE..SHARED_ESTIMATE).contains(&index) {
                SHARED_ESTIMATE - RETRIEVAL_ESTIMATE
            } else {
                0
            };
            cell(index + offset)
        })
        .collect()
}

/// Offset of `(match_len, share)` inside a retrieval block.
fn match_share(match_len: usize, share: f32) -> usize {
    let m = match_len.clamp(1, MATCH_BUCKETS) - 1;
    m * SHARE_BUCKETS + bucket(share, SHARE_BUCKETS)
}

/// The kind of edge a cell describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// The root (no edge).
    Root,
    /// A draft model's or prompt lookup's chain.
    Chain,
    /// A copy-logit table entry.
    Logits,
    /// A continuation from the request's own automaton.
    Retrieval,
    /// A continuation from the automaton shared across requests.
    SharedRetrieval,
}

/// The kind of edge `cell` describes.
#[must_use]
pub fn kind(cell: i32) -> EdgeKind {
    match usize::try_from(cell) {
        Err(_) => EdgeKind::Root,
        Ok(c) if c < LOGITS_PROB => EdgeKind::Chain,
        Ok(c) if c < RETRIEVAL => EdgeKind::Logits,
        Ok(c) if c < SHARED_RETRIEVAL => EdgeKind::Retrieval,
        Ok(c) if c < RETRIEVAL_ESTIMATE => EdgeKind::SharedRetrieval,
        Ok(c) if c < SHARED_ESTIMATE => EdgeKind::Retrieval,
        Ok(_) => EdgeKind::SharedRetrieval,
    }
}

/// A prior acceptance probability per cell: the raw estimate the cell stands for (a bucket's
/// midpoint, `2^-(rank + 1)` for ranks so that siblings sum below 1, 0.5 for chains; the
/// retrieval blocks by their share's or estimate's midpoint), used before any outcome is seen.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn priors() -> Vec<f32> {
    let mut p = vec![0.5f32; EDGE_CELLS];
    for b in 0..PROB_BUCKETS {
        p[LOGITS_PROB + b] = (b as f32 + 0.5) / PROB_BUCKETS as f32;
    }
    for r in 0..RANK_BUCKETS {
        p[LOGITS_RANK + r] = 0.5f32.powi(r as i32 + 1);
    }
    for block in [RETRIEVAL, SHARED_RETRIEVAL] {
        for m in 0..MATCH_BUCKETS {
            for s in 0..SHARE_BUCKETS {
                p[block + m * SHARE_BUCKETS + s] = (s as f32 + 0.5) / SHARE_BUCKETS as f32;
            }
        }
    }
    for block in [RETRIEVAL_ESTIMATE, SHARED_ESTIMATE] {
        for m in 0..MATCH_BUCKETS {
            for e in 0..ESTIMATE_BUCKETS {
                p[block + m * ESTIMATE_BUCKETS + e] = (e as f32 + 0.5) / ESTIMATE_BUCKETS as f32;
            }
        }
    }
    p
}

/// Cells whose acceptance must not fall as their raw estimate rises: `groups[c]` names the
/// group of cell `c` (-1: none). Within a group, cells are in ascending order of the estimate
/// they stand for (copy-logit probability buckets; each retrieval block's share or estimate
/// buckets at one match length), so a calibration can keep each group non-decreasing.
#[must_use]
pub fn monotone_groups() -> Vec<i32> {
    let mut groups = vec![-1; EDGE_CELLS];
    let mut next = 0;
    let mut group = |start: usize, len: usize, groups: &mut Vec<i32>| {
        groups[start..start + len].fill(next);
        next += 1;
    };
    group(LOGITS_PROB, PROB_BUCKETS, &mut groups);
    for block in [RETRIEVAL, SHARED_RETRIEVAL] {
        for m in 0..MATCH_BUCKETS {
            group(block + m * SHARE_BUCKETS, SHARE_BUCKETS, &mut groups);
        }
    }
    for block in [RETRIEVAL_ESTIMATE, SHARED_ESTIMATE] {
        for m in 0..MATCH_BUCKETS {
            group(block + m * ESTIMATE_BUCKETS, ESTIMATE_BUCKETS, &mut groups);
        }
    }
    groups
}

/// Default cells of a tree that no drafter classified: a chain gets chain cells by depth,
/// any other tree copy-logit rank cells by each node's index among its siblings.
///
/// # Errors
/// `OutOfMemory` if the system cannot provide the cells (a caller's tree is sized by its input).
pub fn structural(parents: &[i32], depths: &[i32]) -> crate::error::Result<Vec<i32>> {
    let n = parents.len();
    let is_chain = parents
        .iter()
        .enumerate()
        .skip(1)
        .all(|(i, &p)| p + 1 == cell(i));
    let what = format!("the edge cells of a tree of {n} nodes");
    let mut cells = crate::alloc::filled("parents", &what, n, NO_CELL)?;
    let mut seen_children = crate::alloc::filled("parents", &what, n, 0usize)?;
    for i in 1..n {
        #[allow(clippy::cast_sign_loss)]
        let (p, d) = (parents[i] as usize, depths[i] as usize);
        cells[i] = if is_chain {
            chain(d)
        } else {
            logits(seen_children[p], None)
        };
        seen_children[p] += 1;
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {

    #[test]
    fn own_retrieval_cells_map_to_their_shared_counterparts() {
        let map = shared_counterparts();
        assert_eq!(map.len(), EDGE_CELLS);
        for m in 1..=MATCH_BUCKETS {
            for share in [0.1, 0.5, 0.9] {
                let own = retrieval(m, share);
                let shared = shared_retrieval(m, share);
                assert_eq!(map[own as usize], shared);
                assert_eq!(map[shared as usize], shared);
                for estimate in [0.05, 0.55, 0.95] {
                    assert_eq!(
                        map[by_estimate(own, estimate) as usize],
                        by_estimate(shared, estimate)
                    );
                }
            }
        }
        for depth in 1..=DEPTH_BUCKETS {
            assert_eq!(map[chain(depth) as usize], chain(depth));
        }
        assert_eq!(map[logits(3, None) as usize], logits(3, None));
        assert_eq!(map[logits(0, Some(0.7)) as usize], logits(0, Some(0.7)));
    }

    use super::*;

    #[test]
    fn cells_are_distinct_and_in_range() {
        let mut all = Vec::new();
        all.extend((1..=8).map(chain));
        all.extend((0..10).map(|b| logits(0, Some((b as f32 + 0.5) / 10.0))));
        all.extend((0..8).map(|r| logits(r, None)));
        for m in 1..=8 {
            all.extend((0..5).map(|s| retrieval(m, (s as f32 + 0.5) / 5.0)));
        }
        for m in 1..=8 {
            all.extend((0..5).map(|s| shared_retrieval(m, (s as f32 + 0.5) / 5.0)));
        }
        for m in 1..=8 {
            for e in 0..10 {
                let estimate = (e as f32 + 0.5) / 10.0;
                all.push(by_estimate(retrieval(m, 0.5), estimate));
                all.push(by_estimate(shared_retrieval(m, 0.5), estimate));
            }
        }
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), EDGE_CELLS);
        assert_eq!(EDGE_CELLS, 266);
        assert_eq!(all.iter().copied().max(), Some(EDGE_CELLS as i32 - 1));
        assert_eq!(priors().len(), EDGE_CELLS);
        assert_eq!(chain(30), chain(8));
        assert_eq!(logits(0, Some(1.0)), logits(0, Some(0.95)));
        assert_eq!(retrieval(0, 0.0), retrieval(1, 0.1));
        assert_eq!(shared_retrieval(0, 0.0), shared_retrieval(1, 0.1));
        assert_eq!(shared_retrieval(30, 1.0), 105);
        assert_eq!(
            by_estimate(shared_retrieval(30, 0.0), 1.0),
            EDGE_CELLS as i32 - 1
        );
    }

    #[test]
    fn estimate_cells_keep_source_and_match_length_and_rise_with_the_estimate() {
        let p = priors();
        let groups = monotone_groups();
        for m in 1..=8 {
            for (share_cell, k) in [
                (retrieval(m, 0.3), EdgeKind::Retrieval),
                (shared_retrieval(m, 0.9), EdgeKind::SharedRetrieval),
            ] {
                let cells: Vec<i32> = (0..=20)
                    .map(|i| by_estimate(share_cell, i as f32 / 20.0))
                    .collect();
                assert!(cells.iter().all(|&c| kind(c) == k));
                assert!(cells.windows(2).all(|w| w[0] <= w[1]));
                assert!(
                    cells
                        .windows(2)
                        .all(|w| p[w[0] as usize] <= p[w[1] as usize])
                );
                let g = groups[cells[0] as usize];
                assert!(g >= 0 && cells.iter().all(|&c| groups[c as usize] == g));
                // Another match length is another group.
                let other = by_estimate(retrieval(m % 8 + 1, 0.3), 0.5);
                assert_ne!(groups[other as usize], groups[cells[10] as usize]);
            }
        }
        assert_eq!(by_estimate(chain(2), 0.9), chain(2));
        assert_eq!(by_estimate(logits(1, None), 0.9), logits(1, None));
        let estimate_cell = by_estimate(retrieval(3, 0.3), 0.5);
        assert_eq!(by_estimate(estimate_cell, 0.9), estimate_cell);
        assert_eq!(groups[chain(1) as usize], -1);
        assert_eq!(groups[logits(0, None) as usize], -1);
    }

    #[test]
    fn the_shared_block_follows_the_older_ones_and_mirrors_retrieval() {
        // The older blocks keep their offsets (66 cells before the shared block).
        assert_eq!(retrieval(8, 1.0), 65);
        assert_eq!(shared_retrieval(1, 0.0), 66);
        let p = priors();
        for m in 1..=8 {
            for s in 0..5 {
                let share = (s as f32 + 0.5) / 5.0;
                let (local, shared) = (retrieval(m, share), shared_retrieval(m, share));
                assert_eq!(kind(local), EdgeKind::Retrieval);
                assert_eq!(kind(shared), EdgeKind::SharedRetrieval);
                assert_eq!(shared - local, 40);
                assert_eq!(p[shared as usize], p[local as usize]);
            }
        }
        assert_eq!(kind(NO_CELL), EdgeKind::Root);
        assert_eq!(kind(chain(1)), EdgeKind::Chain);
        assert_eq!(kind(logits(7, None)), EdgeKind::Logits);
    }

    #[test]
    fn structural_cells_tell_chains_from_trees() {
        assert_eq!(
            structural(&[-1, 0, 1], &[0, 1, 2]).unwrap(),
            vec![NO_CELL, chain(1), chain(2)]
        );
        let tree = structural(&[-1, 0, 0, 1], &[0, 1, 1, 2]).unwrap();
        assert_eq!(
            tree,
            vec![NO_CELL, logits(0, None), logits(1, None), logits(0, None)]
        );
    }
}
