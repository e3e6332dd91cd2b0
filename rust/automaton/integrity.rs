//! Verification of every invariant of the automaton: by brute force (slow; used by tests), or
//! in linear time (run on every loaded image).
#![forbid(unsafe_code)]

use rustc_hash::FxHashSet;

use super::{Automaton, HASHED_CHILDREN, NIL, ROOT, key};
use crate::error::{Error, Result};

/// How `check` verifies failure links.
#[derive(Clone, Copy)]
enum FailLinks {
    /// Recompute every link from the node's spelling.
    BruteForce,
    /// Check every link against its parent's.
    Inductive,
}

fn fail(msg: String) -> Result<()> {
    Err(Error::Integrity(msg))
}

impl Automaton {
    /// The token string of node `v`, root first.
    fn spell(&self, mut v: u32) -> Vec<u32> {
        let mut s = Vec::new();
        while v != ROOT {
            s.push(self.nodes[v as usize].token);
            v = self.nodes[v as usize].parent;
        }
        s.reverse();
        s
    }

    /// Check parent/child links, counts, failure links (against a brute-force recomputation),
    /// the LRU heap, the node budget and the match state.
    ///
    /// # Errors
    /// `Integrity` naming the first broken invariant.
    pub fn check_integrity(&self) -> Result<()> {
        self.check(FailLinks::BruteForce)
    }

    /// [`Automaton::check_integrity`] in time linear in the nodes: the same checks, except that
    /// failure links are checked by induction on depth instead of by brute force. With every
    /// parent link and depth checked, `fail(w)` must be the node of `w[1..]`, which is `ROOT`
    /// at depth 1 and otherwise the child of `fail(parent(w))` labelled `w`'s token; if that
    /// child is missing the trie is not suffix-closed. Checking each node against its parent's
    /// (checked) link proves every link by induction; it also proves suffix closure, which the
    /// brute-force check only implies for links it finds right, so this check is never laxer.
    ///
    /// # Errors
    /// `Integrity` naming the first broken invariant.
    pub fn check_integrity_linear(&self) -> Result<()> {
        self.check(FailLinks::Inductive)
    }

    fn check(&self, links: FailLinks) -> Result<()> {
        let alive: Vec<u32> = (1..self.nodes.len() as u32)
            .filter(|&v| self.nodes[v as usize].alive)
            .collect();
        if alive.len() != self.live {
            return fail(format!(
                "live count {} but {} nodes alive",
                self.live,
                alive.len()
            ));
        }
        if self.live > self.capacity {
            return fail(format!(
                "{} nodes exceed the capacity {}",
                self.live, self.capacity
            ));
        }
        let hashed = alive
            .iter()
            .filter(|&&v| self.nodes[self.nodes[v as usize].parent as usize].hashed)
            .count();
        if self.goto.len() != hashed {
            return fail(format!(
                "goto has {} entries for {hashed} children of hashed nodes",
                self.goto.len(),
            ));
        }
        let mut n_children = vec![0u32; self.nodes.len()];
        let mut fail_in = vec![0u32; self.nodes.len()];
        for &v in &alive {
            let n = &self.nodes[v as usize];
            let p = &self.nodes[n.parent as usize];
            if !p.alive || p.depth + 1 != n.depth || n.depth as usize > self.ngram {
                return fail(format!(
                    "node {v}: bad parent {} or depth {}",
                    n.parent, n.depth
                ));
            }
            let entry = self.goto.get(&key(n.parent, n.token));
            if p.hashed && entry != Some(&v) {
                return fail(format!("node {v}: goto entry missing"));
            }
            if !p.hashed && entry.is_some() {
                return fail(format!(
                    "node {v}: goto entry for a node whose parent is not hashed"
                ));
            }
            if n.count == 0 || (n.parent != ROOT && p.count < n.count) {
                return fail(format!(
                    "node {v}: count {} vs parent count {}",
                    n.count, p.count
                ));
            }
            let expected = match links {
                FailLinks::BruteForce => self.brute_force_fail(&self.spell(v)),
                FailLinks::Inductive => self.inductive_fail(v),
            };
            if expected == NIL {
                return fail(format!(
                    "node {v}: the node of its string minus the first token is missing \
                     (the trie is not suffix-closed)"
                ));
            }
            if n.fail != expected {
                return fail(format!(
                    "node {v}: failure link {} but brute force gives {expected}",
                    n.fail
                ));
            }
            if n.fail != ROOT && self.nodes[n.fail as usize].count < n.count {
                return fail(format!("node {v}: count exceeds its suffix's count"));
            }
            n_children[n.parent as usize] += 1;
            fail_in[n.fail as usize] += 1;
        }
        for &v in &alive {
            let n = &self.nodes[v as usize];
            if n.n_children != n_children[v as usize] || n.fail_in != fail_in[v as usize] {
                return fail(format!("node {v}: dependent counters out of date"));
            }
        }
        let mut tokens = Vec::new();
        for &u in alive.iter().chain(&[ROOT]) {
            let (mut c, mut prev, mut seen) = (self.nodes[u as usize].first_child, NIL, 0);
            tokens.clear();
            while c != NIL {
                let n = &self.nodes[c as usize];
                if !n.alive || n.parent != u || n.prev_sibling != prev || seen > self.live {
                    return fail(format!("node {u}: broken child list at {c}"));
                }
                tokens.push(n.token);
                (prev, c, seen) = (c, n.next_sibling, seen + 1);
            }
            let hashed = self.nodes[u as usize].hashed;
            if hashed && seen == 0 {
                return fail(format!("node {u}: hashed without children"));
            }
            if !hashed && seen > HASHED_CHILDREN as usize {
                return fail(format!("node {u}: {seen} children and not hashed"));
            }
            // A hashed node's children map to themselves (checked above), so their tokens are
            // distinct; the others' are compared here.
            tokens.sort_unstable();
            if !hashed && tokens.windows(2).any(|w| w[0] == w[1]) {
                return fail(format!("node {u}: two children share a token"));
            }
            if u != ROOT && seen != n_children[u as usize] as usize {
                return fail(format!(
                    "node {u}: child list has {seen} of {} children",
                    n_children[u as usize]
                ));
            }
        }
        let entries: FxHashSet<(u64, u32)> = self.lru.iter().collect();
        for &v in &alive {
            let n = &self.nodes[v as usize];
            if self.is_evictable(v) && !self.lru_lost && !entries.contains(&(n.tick, v)) {
                return fail(format!("evictable node {v} is missing from the LRU heap"));
            }
        }
        self.check_state()
    }

    /// The node of `w[1..]` for the string `w` of `v`, from its parent's failure link (`NIL` if
    /// that node is missing); assumes the parent's link is right (checked in turn).
    fn inductive_fail(&self, v: u32) -> u32 {
        let n = &self.nodes[v as usize];
        if n.depth == 1 {
            return ROOT;
        }
        let parent_fail = self.nodes[n.parent as usize].fail;
        self.child(parent_fail, n.token).unwrap_or(NIL)
    }

    /// The longest proper suffix of `s` present in the trie.
    fn brute_force_fail(&self, s: &[u32]) -> u32 {
        (1..s.len())
            .find_map(|start| self.find(&s[start..]))
            .unwrap_or(ROOT)
    }

    fn check_state(&self) -> Result<()> {
        let n = &self.nodes[self.state as usize];
        if !n.alive || n.generation != self.state_generation {
            return fail("the match state points at a recycled node".into());
        }
        let recent: Vec<u32> = self.recent.iter().copied().collect();
        let spelled = self.spell(self.state);
        if spelled.len() != recent.len() || spelled != recent {
            return fail(format!(
                "the match state spells {spelled:?}, the context ends with {recent:?}"
            ));
        }
        Ok(())
    }
}
