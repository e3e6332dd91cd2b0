//! Draft trees: `TreeBuilder`, a small merge trie used while drafting, and `DraftTree`, the flat
//! BFS form (tokens, parents, depths) that verification consumes.
#![forbid(unsafe_code)]

use rustc_hash::FxHashSet;

use crate::edge_cells;
use crate::error::{Error, Result, invalid};

const NIL: u32 = u32::MAX;
/// Largest draft tree built (a breadth-1 logits chain would otherwise grow without end).
pub const MAX_TREE_NODES: usize = 1 << 20;

/// Check a node budget (root included) against `1..=MAX_TREE_NODES`.
///
/// # Errors
/// `InvalidArgument` naming `arg` when the budget is outside that range.
pub fn check_budget(arg: &'static str, budget: usize) -> Result<()> {
    if !(1..=MAX_TREE_NODES).contains(&budget) {
        return Err(invalid(
            arg,
            format!("must be in 1..={MAX_TREE_NODES}, got {budget}"),
        ));
    }
    Ok(())
}

/// A draft tree flattened in BFS order: root at index 0, every parent before its children,
/// depths non-decreasing, and distinct tokens among siblings.
///
/// Two buffers (a tree is built once per request and step, so allocations count): `nodes`
/// holds the tokens, the parents, the depths and the edge cells (see `crate::edge_cells`; the
/// root's is `NO_CELL`), `n` of each in that order; `adjacency` the CSR adjacency, `child_start`
/// (`n + 1`) then `children` (`n - 1`): the children of node `u` are
/// `children[child_start[u]..child_start[u + 1]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftTree {
    nodes: Vec<i32>,
    adjacency: Vec<u32>,
}

impl DraftTree {
    /// Validate flat arrays and build a tree from them.
    ///
    /// # Errors
    /// `InvalidArgument` if the arrays are empty, of different lengths or longer than
    /// [`MAX_TREE_NODES`], a token is negative, the parents are not in BFS order, or two
    /// siblings carry the same token; `OutOfMemory` if the tree's buffers cannot be had.
    pub fn from_parents(tokens: Vec<i32>, parents: Vec<i32>) -> Result<Self> {
        if tokens.is_empty() {
            return Err(invalid("tokens", "a draft tree needs at least the root"));
        }
        if tokens.len() != parents.len() {
            return Err(invalid(
                "parents",
                format!(
                    "length {} differs from tokens length {}",
                    parents.len(),
                    tokens.len()
                ),
            ));
        }
        if tokens.len() > MAX_TREE_NODES {
            return Err(invalid(
                "tokens",
                format!(
                    "a draft tree has at most {MAX_TREE_NODES} nodes, got {}",
                    tokens.len()
                ),
            ));
        }
        if let Some(t) = tokens.iter().find(|&&t| t < 0) {
            return Err(invalid(
                "tokens",
                format!("token ids must be >= 0, got {t}"),
            ));
        }
        if parents[0] != -1 {
            return Err(invalid(
                "parents",
                format!("parents[0] must be -1 (the root), got {}", parents[0]),
            ));
        }
        // Every buffer sized by the caller's tree is a fallible allocation (`OutOfMemory`, never
        // an abort).
        let n = tokens.len();
        let what = format!("a draft tree of {n} nodes");
        let mut depths = crate::alloc::filled("tokens", &what, n, 0i32)?;
        let mut seen = FxHashSet::default();
        seen.try_reserve(n).map_err(|_| Error::OutOfMemory {
            what: what.clone(),
            bytes: n.saturating_mul(16),
        })?;
        for i in 1..tokens.len() {
            let p = parents[i];
            if p < 0 || p as usize >= i {
                return Err(invalid(
                    "parents",
                    format!("parents[{i}] = {p}: a parent must come before its child"),
                ));
            }
            depths[i] = depths[p as usize] + 1;
            if depths[i] < depths[i - 1] {
                return Err(invalid(
                    "parents",
                    format!("node {i} breaks BFS order (depth decreases)"),
                ));
            }
            if !seen.insert((p, tokens[i])) {
                return Err(invalid(
                    "tokens",
                    format!("node {p} has two children with token {}", tokens[i]),
                ));
            }
        }
        let cells = edge_cells::structural(&parents, &depths)?;
        let mut nodes = crate::alloc::filled("tokens", &what, 4 * n, 0i32)?;
        for (part, values) in nodes
            .chunks_exact_mut(n)
            .zip([tokens, parents, depths, cells])
        {
            part.copy_from_slice(&values);
        }
        let adjacency = crate::alloc::filled("tokens", &what, 2 * n, 0u32)?;
        Ok(Self::from_valid(nodes, adjacency))
    }

    /// [`DraftTree::from_parents`] with the edge cells given (`NO_CELL` at the root).
    ///
    /// # Errors
    /// As `from_parents`, and `InvalidArgument` if `cells` has another length, the root's cell
    /// is not `NO_CELL`, or another cell is outside `0..EDGE_CELLS`.
    pub fn with_cells(tokens: Vec<i32>, parents: Vec<i32>, cells: Vec<i32>) -> Result<Self> {
        let mut tree = Self::from_parents(tokens, parents)?;
        if cells.len() != tree.len() {
            return Err(invalid(
                "cells",
                format!(
                    "length {} differs from tokens length {}",
                    cells.len(),
                    tree.len()
                ),
            ));
        }
        if cells[0] != edge_cells::NO_CELL {
            return Err(invalid("cells", "the root's cell must be -1"));
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        if let Some(c) = cells[1..]
            .iter()
            .find(|&&c| c < 0 || c >= edge_cells::EDGE_CELLS as i32)
        {
            return Err(invalid(
                "cells",
                format!("cell {c} is outside 0..{}", edge_cells::EDGE_CELLS),
            ));
        }
        let n = tree.len();
        tree.nodes[3 * n..].copy_from_slice(&cells);
        Ok(tree)
    }

    /// A chain: `tokens[0]` is the root and every next token is the child of the previous one.
    ///
    /// # Errors
    /// `InvalidArgument` if `tokens` is empty, longer than [`MAX_TREE_NODES`] or holds a negative id.
    pub fn chain(tokens: &[i32]) -> Result<Self> {
        check_budget("tokens", tokens.len().max(1))?;
        let parents = (0..tokens.len() as i32).map(|i| i - 1).collect();
        Self::from_parents(tokens.to_vec(), parents)
    }

    /// A tree from checked arrays (`nodes` as the tree holds them); `adjacency` (`2n` zeros) is
    /// the caller's buffer, so that `from_parents` can allocate it fallibly.
    fn from_valid(nodes: Vec<i32>, mut adjacency: Vec<u32>) -> Self {
        let n = nodes.len() / 4;
        let (child_start, children) = adjacency.split_at_mut(n + 1);
        let parents = &nodes[n..2 * n];
        for &p in &parents[1..] {
            child_start[p as usize + 1] += 1;
        }
        for i in 0..n {
            child_start[i + 1] += child_start[i];
        }
        // `child_start[p]` serves as `p`'s write cursor (no second buffer); afterwards each
        // entry holds the next node's start, so shift them back by one.
        for (i, &p) in parents.iter().enumerate().skip(1) {
            children[child_start[p as usize] as usize] = i as u32;
            child_start[p as usize] += 1;
        }
        child_start.copy_within(0..n, 1);
        child_start[0] = 0;
        Self { nodes, adjacency }
    }

    /// Number of nodes, root included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len() / 4
    }

    /// Edge cell of every node (`NO_CELL` for the root).
    #[must_use]
    pub fn cells(&self) -> &[i32] {
        &self.nodes[3 * self.len()..]
    }

    /// Always false: a tree has at least its root.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Token of every node.
    #[must_use]
    pub fn tokens(&self) -> &[i32] {
        &self.nodes[..self.len()]
    }

    /// Parent of every node (`-1` for the root).
    #[must_use]
    pub fn parents(&self) -> &[i32] {
        let n = self.len();
        &self.nodes[n..2 * n]
    }

    /// Depth of every node (root 0).
    #[must_use]
    pub fn depths(&self) -> &[i32] {
        let n = self.len();
        &self.nodes[2 * n..3 * n]
    }

    /// Depth of the deepest node.
    #[must_use]
    pub fn max_depth(&self) -> usize {
        *self.depths().last().unwrap_or(&0) as usize
    }

    /// Children of node `u`, in index order.
    #[must_use]
    pub fn children(&self, u: usize) -> &[u32] {
        let (child_start, children) = self.adjacency.split_at(self.len() + 1);
        &children[child_start[u] as usize..child_start[u + 1] as usize]
    }

    /// Row-major `n x n` ancestor-or-self mask.
    ///
    /// # Errors
    /// `InvalidArgument` when `n * n` exceeds [`crate::alloc::MAX_ELEMENTS`] (trees of more than
    /// 16,384 nodes), `OutOfMemory` when the system cannot provide it.
    pub fn attention_mask(&self) -> Result<Vec<bool>> {
        let n = self.len();
        let what = format!("the attention mask of a {n}-node tree ({n} x {n})");
        let mut mask = crate::alloc::filled("attention_mask", &what, n.saturating_mul(n), false)?;
        mask[0] = true;
        let parents = self.parents();
        for i in 1..n {
            let p = parents[i] as usize;
            let (done, rest) = mask.split_at_mut(i * n);
            rest[..n].copy_from_slice(&done[p * n..p * n + n]);
            rest[i] = true;
        }
        Ok(mask)
    }

    /// Root-to-leaf node indices, one row per leaf (BFS order), padded with `-1`.
    /// Returns `(data, rows, cols)` with `cols = max_depth + 1`.
    ///
    /// # Errors
    /// As [`DraftTree::attention_mask`], for `leaves * cols` elements.
    pub fn leaf_paths(&self) -> Result<(Vec<i32>, usize, usize)> {
        let cols = self.max_depth() + 1;
        let leaves: Vec<usize> = (0..self.len())
            .filter(|&u| self.children(u).is_empty())
            .collect();
        let what = format!(
            "the leaf paths of a tree ({} leaves x {cols})",
            leaves.len()
        );
        let mut data = crate::alloc::filled(
            "leaf_paths",
            &what,
            leaves.len().saturating_mul(cols),
            -1i32,
        )?;
        let (parents, depths) = (self.parents(), self.depths());
        for (row, &leaf) in leaves.iter().enumerate() {
            let mut u = leaf as i32;
            while u >= 0 {
                data[row * cols + depths[u as usize] as usize] = u;
                u = parents[u as usize];
            }
        }
        Ok((data, leaves.len(), cols))
    }

    /// Greedy walk: from the root, follow the child whose token equals the parent's prediction.
    /// Returns the accepted node indices (starting with 0) and the prediction at the last one.
    ///
    /// # Errors
    /// `InvalidArgument` if `predicted` does not have one entry per node.
    pub fn greedy_accept(&self, predicted: &[i32]) -> Result<(Vec<u32>, i32)> {
        if predicted.len() != self.len() {
            return Err(invalid(
                "predicted",
                format!(
                    "expected one token per node ({}), got {}",
                    self.len(),
                    predicted.len()
                ),
            ));
        }
        let mut path = vec![0u32];
        let mut u = 0usize;
        while let Some(&c) = self
            .children(u)
            .iter()
            .find(|&&c| self.tokens()[c as usize] == predicted[u])
        {
            path.push(c);
            u = c as usize;
        }
        Ok((path, predicted[u]))
    }
}

/// A merge trie for building draft trees: paths that spell the same tokens share nodes, so
/// `len()` is the number of distinct nodes (root included) and budgets are charged after merging.
#[derive(Debug, Clone)]
pub struct TreeBuilder {
    /// One record per node (a single allocation per build, not one per field).
    nodes: Vec<BuilderNode>,
}

#[derive(Debug, Clone, Copy)]
struct BuilderNode {
    token: i32,
    depth: u32,
    cell: i32,
    first_child: u32,
    last_child: u32,
    next_sibling: u32,
}

impl TreeBuilder {
    /// A builder holding only the root.
    #[must_use]
    pub fn new(root: i32) -> Self {
        Self::with_capacity(root, 1)
    }

    /// A builder holding only the root, with room for `nodes` nodes (capped at 4096: a hint,
    /// not a limit).
    #[must_use]
    pub fn with_capacity(root: i32, nodes: usize) -> Self {
        let mut all = Vec::with_capacity(nodes.clamp(1, 4096));
        all.push(BuilderNode {
            token: root,
            depth: 0,
            cell: edge_cells::NO_CELL,
            first_child: NIL,
            last_child: NIL,
            next_sibling: NIL,
        });
        Self { nodes: all }
    }

    /// Distinct nodes, root included.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the builder holds at least the root.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Token of node `u`.
    #[must_use]
    pub fn token(&self, u: u32) -> i32 {
        self.nodes[u as usize].token
    }

    /// Depth of node `u`.
    #[must_use]
    pub fn depth(&self, u: u32) -> u32 {
        self.nodes[u as usize].depth
    }

    /// The child of `parent` labelled `token`, if any.
    #[must_use]
    pub fn find_child(&self, parent: u32, token: i32) -> Option<u32> {
        let mut c = self.nodes[parent as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            if n.token == token {
                return Some(c);
            }
            c = n.next_sibling;
        }
        None
    }

    /// The child of `parent` labelled `token`, created (with edge cell `cell`) if missing and the
    /// tree holds fewer than `budget` nodes. Returns `(node, created)`, or `None` when the budget
    /// is exhausted. A node reached again keeps the cell it was created with.
    pub fn child_or_insert(
        &mut self,
        parent: u32,
        token: i32,
        budget: usize,
        cell: i32,
    ) -> Option<(u32, bool)> {
        if let Some(c) = self.find_child(parent, token) {
            return Some((c, false));
        }
        if self.len() >= budget {
            return None;
        }
        let c = self.nodes.len() as u32;
        let p = &mut self.nodes[parent as usize];
        let (depth, last) = (p.depth + 1, p.last_child);
        p.last_child = c;
        if last == NIL {
            p.first_child = c;
        } else {
            self.nodes[last as usize].next_sibling = c;
        }
        self.nodes.push(BuilderNode {
            token,
            depth,
            cell,
            first_child: NIL,
            last_child: NIL,
            next_sibling: NIL,
        });
        Some((c, true))
    }

    /// Insert the chain `path` below the root, merging with existing nodes, until `budget`
    /// nodes exist.
    pub fn insert_path(&mut self, path: &[i32], budget: usize) {
        let mut u = 0u32;
        for (depth, &t) in path.iter().enumerate() {
            match self.child_or_insert(u, t, budget, edge_cells::chain(depth + 1)) {
                Some((c, _)) => u = c,
                None => return,
            }
        }
    }

    /// Flatten into BFS order (children in insertion order, which is deterministic).
    #[must_use]
    pub fn finish(&self) -> DraftTree {
        let n = self.len();
        let mut nodes = vec![0i32; 4 * n];
        let mut adjacency = vec![0u32; 2 * n];
        let (tokens, rest) = nodes.split_at_mut(n);
        let (parents, rest) = rest.split_at_mut(n);
        let (depths, cells) = rest.split_at_mut(n);
        // BFS order puts each node's children side by side, so the CSR adjacency comes for
        // free: `children[k]` is node `k + 1`. Until then that part holds the BFS order
        // (`order[k]` the builder node at position `k + 1`).
        let (child_start, order) = adjacency.split_at_mut(n + 1);
        let mut placed = 0;
        for at in 0..n {
            let u = if at == 0 { 0 } else { order[at - 1] };
            let node = &self.nodes[u as usize];
            tokens[at] = node.token;
            #[allow(clippy::cast_possible_wrap)] // depths are below MAX_TREE_NODES
            let depth = node.depth as i32;
            depths[at] = depth;
            cells[at] = node.cell;
            child_start[at] = placed as u32;
            let mut c = node.first_child;
            while c != NIL {
                order[placed] = c;
                placed += 1;
                #[allow(clippy::cast_possible_wrap)]
                let parent = at as i32;
                parents[placed] = parent;
                c = self.nodes[c as usize].next_sibling;
            }
        }
        parents[0] = -1;
        child_start[n] = n as u32 - 1;
        for (k, slot) in order.iter_mut().enumerate() {
            *slot = k as u32 + 1;
        }
        DraftTree { nodes, adjacency }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_merges_paths_and_flattens_bfs() {
        let mut b = TreeBuilder::new(7);
        b.insert_path(&[1, 2, 3], 64);
        b.insert_path(&[1, 2, 4], 64);
        b.insert_path(&[5], 64);
        assert_eq!(b.len(), 6);
        let t = b.finish();
        assert_eq!(t.tokens(), &[7, 1, 5, 2, 3, 4]);
        assert_eq!(t.parents(), &[-1, 0, 0, 1, 3, 3]);
        assert_eq!(t.depths(), &[0, 1, 1, 2, 3, 3]);
    }

    #[test]
    fn finish_equals_the_tree_rebuilt_from_its_arrays() {
        let mut seed = 11u64;
        for _ in 0..200 {
            let mut b = TreeBuilder::with_capacity(0, 4);
            for _ in 0..12 {
                let path: Vec<i32> = (0..4)
                    .map(|_| {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        (seed >> 61) as i32
                    })
                    .collect();
                b.insert_path(&path, 30);
            }
            let t = b.finish();
            let rebuilt = DraftTree::with_cells(
                t.tokens().to_vec(),
                t.parents().to_vec(),
                t.cells().to_vec(),
            )
            .unwrap();
            assert_eq!(t, rebuilt);
        }
    }

    #[test]
    fn budget_counts_distinct_nodes() {
        let mut b = TreeBuilder::new(0);
        b.insert_path(&[1, 2, 3], 3);
        b.insert_path(&[1, 9], 3);
        assert_eq!(b.len(), 3);
    }

    #[test]
    fn mask_and_accept() {
        let t = DraftTree::from_parents(vec![7, 1, 5, 2], vec![-1, 0, 0, 1]).unwrap();
        let m = t.attention_mask().unwrap();
        assert_eq!(&m[12..16], &[true, true, false, true]);
        let (path, bonus) = t.greedy_accept(&[1, 2, 0, 8]).unwrap();
        assert_eq!(path, vec![0, 1, 3]);
        assert_eq!(bonus, 8);
        let (paths, rows, cols) = t.leaf_paths().unwrap();
        assert_eq!((rows, cols), (2, 3));
        assert_eq!(paths, vec![0, 2, -1, 0, 1, 3]);
    }

    #[test]
    fn rejects_bad_trees() {
        assert!(DraftTree::from_parents(vec![], vec![]).is_err());
        assert!(DraftTree::from_parents(vec![1, 2], vec![-1, 1]).is_err());
        assert!(DraftTree::from_parents(vec![1, 2, 2], vec![-1, 0, 0]).is_err());
        assert!(DraftTree::from_parents(vec![1, 2, 3, 4], vec![-1, 0, 1, 0]).is_err());
        assert!(DraftTree::from_parents(vec![1, -2], vec![-1, 0]).is_err());
    }
}
