//! The retrieval index: an Aho-Corasick automaton over the token stream whose trie holds every
//! substring (length <= ngram) of the context, with LRU eviction under a hard node budget.
//!
//! Invariants (checked by `check_integrity`):
//! - the trie is prefix-closed (a node's parent is its string minus the last token) and
//!   suffix-closed (its string minus the first token is a node too), so the failure link of `w`
//!   is always the node of `w[1..]` and adding a node never changes another node's link;
//! - only nodes that nothing depends on (no child, no failure link pointing at them) are
//!   evicted, which keeps both closures, so links stay correct with no rebuild pass;
//! - the match state is the node of the longest context suffix (length <= ngram); its failure
//!   chain enumerates every shorter suffix, which is where `extend` counts and `retrieve` looks.
//!
//! An automaton can also serve as an index shared by many requests (past responses, a corpus):
//! `borders_for` finds the borders for any request's context without a match state, a build
//! only reads it, and the recency of what it used is applied afterwards (`Recency`, `touch`).
//! `save`/`load` and `to_bytes`/`from_bytes` persist it (`persist` documents the format).
#![forbid(unsafe_code)]

mod integrity;
mod lru;
mod persist;
mod retrieve;

pub use persist::{FORMAT_VERSION, MAGIC, write_atomic};
#[cfg(test)]
pub(crate) use retrieve::PRUNE;
use retrieve::Scratch;
pub(crate) use retrieve::push_best;
pub use retrieve::{Recency, Source};

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use self::lru::LruQueue;
use crate::alloc::{grow, hash_map_bytes, out_of_memory};
use crate::error::{Error, Result, invalid};

const NIL: u32 = u32::MAX;
const ROOT: u32 = 0;
/// Longest n-gram accepted; deeper tries buy nothing and cost O(ngram^2) capacity.
pub const MAX_NGRAM: usize = 64;
/// Largest node budget: node indices are `u32` with two values reserved.
pub const MAX_NODES: usize = (NIL - 2) as usize;
/// A node's children are looked up on its child list while they are at most this many, and
/// in the goto map beyond: most nodes have a few children, and scanning those touches nodes
/// that the caller reads next anyway, where a hash lookup, insertion and removal would each
/// touch a random bucket of a large table.
const HASHED_CHILDREN: u32 = 8;

#[derive(Debug, Clone)]
#[repr(align(64))]
struct Node {
    token: u32,
    parent: u32,
    fail: u32,
    depth: u32,
    count: u32,
    first_child: u32,
    next_sibling: u32,
    prev_sibling: u32,
    n_children: u32,
    /// Number of nodes whose failure link points here.
    fail_in: u32,
    /// Logical time of the last use.
    tick: u64,
    /// Bumped on every eviction, so stale handles can be detected.
    generation: u32,
    alive: bool,
    /// The children are in the goto map (set when they outnumber `HASHED_CHILDREN`, cleared
    /// when the last one goes); otherwise they are found on the child list.
    hashed: bool,
}

impl Node {
    fn root() -> Self {
        Self {
            token: NIL,
            parent: NIL,
            fail: ROOT,
            depth: 0,
            count: 0,
            first_child: NIL,
            next_sibling: NIL,
            prev_sibling: NIL,
            n_children: 0,
            fail_in: 0,
            tick: 0,
            generation: 0,
            alive: true,
            hashed: false,
        }
    }
}

/// Aho-Corasick automaton over token ids with a hard node budget.
#[derive(Debug, Clone)]
pub struct Automaton {
    ngram: usize,
    capacity: usize,
    min_depth: usize,
    nodes: Vec<Node>,
    /// Goto function of the nodes with many children (`Node::hashed`):
    /// `(parent << 32) | token` -> child.
    goto: FxHashMap<u64, u32>,
    free: Vec<u32>,
    live: usize,
    /// Min-heap of evictable nodes by last use (lazy deletion).
    lru: LruQueue,
    tick: u64,
    state: u32,
    state_generation: u32,
    /// The last `ngram` tokens of the current sequence.
    recent: VecDeque<u32>,
    /// Nodes that the running `extend` step still needs; never evicted.
    pinned: Vec<u32>,
    /// The least last use of a pinned node when it was pinned (ticks only grow): an LRU entry
    /// older than this cannot be a pinned node, so only newer ones are looked up in `pinned`.
    pinned_since: u64,
    /// Bumped by `clear`, which recycles every slot with generation 0: a `Recency` taken before
    /// is then ignored.
    epoch: u32,
    chain: Vec<u32>,
    /// An LRU entry was dropped because the heap could not grow (out of memory): the heap is
    /// rebuilt before an eviction finds no victim.
    lru_lost: bool,
    /// Buffers of the request's own retrieval builds.
    scratch: Scratch,
}

fn key(parent: u32, token: u32) -> u64 {
    (u64::from(parent) << 32) | u64::from(token)
}

impl Automaton {
    /// Check the settings [`Automaton::new`] takes without allocating anything.
    ///
    /// # Errors
    /// As [`Automaton::new`].
    pub fn check_options(ngram: usize, capacity: usize, min_depth: usize) -> Result<()> {
        if !(2..=MAX_NGRAM).contains(&ngram) {
            return Err(invalid(
                "ngram",
                format!("must be in 2..={MAX_NGRAM}, got {ngram}"),
            ));
        }
        let window = ngram * (ngram + 1) / 2;
        if capacity < window {
            return Err(invalid(
                "max_nodes",
                format!(
                    "must be >= ngram * (ngram + 1) / 2 = {window} (every substring of one window must fit), got {capacity}"
                ),
            ));
        }
        if capacity > MAX_NODES {
            return Err(invalid(
                "max_nodes",
                format!("must be <= {MAX_NODES}, got {capacity}"),
            ));
        }
        if !(1..=ngram).contains(&min_depth) {
            return Err(invalid(
                "min_depth",
                format!("must be in 1..={ngram}, got {min_depth}"),
            ));
        }
        Ok(())
    }

    /// An empty automaton.
    ///
    /// # Errors
    /// `InvalidArgument` if `ngram` is outside `2..=64`, `capacity` cannot hold every substring
    /// of one window (`ngram * (ngram + 1) / 2`), or `min_depth` is outside `1..=ngram`.
    pub fn new(ngram: usize, capacity: usize, min_depth: usize) -> Result<Self> {
        Self::check_options(ngram, capacity, min_depth)?;
        // Nothing is reserved for the node budget: every container grows with what it holds,
        // fallibly (`reserve_step`), so an empty automaton costs a few hundred bytes.
        let what = "an automaton";
        let mut nodes = Vec::new();
        grow(&mut nodes, 1, what)?;
        nodes.push(Node::root());
        let mut recent = VecDeque::new();
        recent
            .try_reserve_exact(ngram)
            .map_err(|_| out_of_memory(what, 4 * ngram))?;
        let (mut pinned, mut chain) = (Vec::new(), Vec::new());
        grow(&mut pinned, 2 * ngram + 2, what)?;
        grow(&mut chain, ngram + 1, what)?;
        Ok(Self {
            ngram,
            capacity,
            min_depth,
            nodes,
            goto: FxHashMap::default(),
            free: Vec::new(),
            live: 0,
            lru: LruQueue::default(),
            tick: 0,
            state: ROOT,
            state_generation: 0,
            recent,
            pinned,
            pinned_since: 0,
            chain,
            epoch: 0,
            lru_lost: false,
            scratch: Scratch::default(),
        })
    }

    /// Longest substring length indexed.
    #[must_use]
    pub fn ngram(&self) -> usize {
        self.ngram
    }

    /// Hard node budget (root excluded).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Minimum depth of a retrieval border.
    #[must_use]
    pub fn min_depth(&self) -> usize {
        self.min_depth
    }

    /// Live nodes, root excluded.
    #[must_use]
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when nothing is indexed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Depth of the match state: the length of the longest indexed suffix of the context.
    #[must_use]
    pub fn match_length(&self) -> usize {
        self.nodes[self.state as usize].depth as usize
    }

    /// Heap memory held, in bytes: the capacity of every container (what was allocated, not
    /// only what is in use).
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * size_of::<Node>()
            + hash_map_bytes(self.goto.capacity(), size_of::<(u64, u32)>())
            + self.lru.memory_bytes()
            + self.scratch.memory_bytes()
            + (self.free.capacity()
                + self.recent.capacity()
                + self.pinned.capacity()
                + self.chain.capacity())
                * size_of::<u32>()
    }

    /// Append tokens to the context. Every substring of length `1..=ngram` that ends at a new
    /// token is counted at once. Costs `O(ngram)` hash lookups per token.
    ///
    /// # Errors
    /// `InvalidArgument` if a token is negative; nothing is appended then.
    pub fn extend(&mut self, tokens: &[i32]) -> Result<()> {
        check_tokens("tokens", tokens)?;
        self.extend_checked(tokens)
    }

    /// [`Self::extend`] of tokens already checked to be non-negative.
    fn extend_checked(&mut self, tokens: &[i32]) -> Result<()> {
        for &t in tokens {
            self.extend_one(t as u32)?;
        }
        Ok(())
    }

    /// Room for the nodes one `extend_one` step can add (a node and a free slot per chain
    /// node), so a step that starts cannot fail halfway (the goto map's room is reserved by
    /// `reserve_goto` before the step changes anything; the LRU queue drops an entry it has no
    /// memory for and is rebuilt later, see `push_if_evictable`).
    fn reserve_step(&mut self, steps: usize) -> Result<()> {
        // Almost always there is room already: checked inline, the growth path out of line.
        let spare = |len: usize, capacity: usize| capacity - len >= steps;
        if (self.free.len() >= steps || spare(self.nodes.len(), self.nodes.capacity()))
            && spare(self.free.len(), self.free.capacity())
        {
            return Ok(());
        }
        self.grow_step(steps)
    }

    #[cold]
    #[inline(never)]
    fn grow_step(&mut self, steps: usize) -> Result<()> {
        let what = "the automaton's nodes";
        if self.free.len() < steps {
            grow(&mut self.nodes, steps, what)?;
        }
        grow(&mut self.free, steps, what)
    }

    /// Room in the goto map for a child of each of `parents`: its own entry if the parent is
    /// hashed, all the parent's children if it would pass `HASHED_CHILDREN`. Evictions meanwhile
    /// only lower that (and removals never take room from the map), so the inserts that follow
    /// never allocate.
    fn reserve_goto(&mut self, parents: std::ops::Range<usize>) -> Result<()> {
        let spare = self.goto.capacity() - self.goto.len();
        if spare >= parents.len() * (HASHED_CHILDREN as usize + 1) {
            return Ok(()); // room for the most there can be: no need to count
        }
        let entries: usize = self.chain[parents]
            .iter()
            .map(|&p| {
                let n = &self.nodes[p as usize];
                match n.n_children + 1 {
                    _ if n.hashed => 1,
                    c if c > HASHED_CHILDREN => c as usize,
                    _ => 0,
                }
            })
            .sum();
        if spare >= entries {
            return Ok(());
        }
        self.goto.try_reserve(entries).map_err(|_| {
            out_of_memory(
                "the automaton's goto map",
                entries * size_of::<(u64, u32)>(),
            )
        })
    }

    fn extend_one(&mut self, x: u32) -> Result<()> {
        self.ensure_state();
        self.reserve_step(self.ngram)?;
        // The failure chain of the state lists every context suffix, deepest first; suffixes of
        // length `ngram` cannot grow, so they are skipped.
        self.chain.clear();
        let mut u = self.state;
        let mut since = u64::MAX;
        loop {
            let node = &self.nodes[u as usize];
            if (node.depth as usize) < self.ngram {
                self.chain.push(u);
            }
            if u == ROOT {
                break;
            }
            // The root is never evicted, so its last use does not matter.
            since = since.min(node.tick);
            u = node.fail;
        }
        self.pinned_since = since;
        self.pinned.clear();
        self.pinned.extend_from_slice(&self.chain);
        // Suffix closure: if `s + x` is a node, so is `s' + x` for every suffix `s'` of `s`, and
        // the failure chain of the first lists the others. So the links are looked up deepest
        // first only until one exists; the shallower nodes are its failure chain, no hashing.
        let n = self.chain.len();
        let (found, hit) = (0..n)
            .find_map(|i| self.child(self.chain[i], x).map(|v| (i, v)))
            .unwrap_or((n, ROOT));
        // Nothing was changed so far; from here on nothing can fail.
        self.reserve_goto(0..found)?;
        self.tick += 1;
        let mut v = hit;
        for _ in found..n {
            let node = &mut self.nodes[v as usize];
            node.count = node.count.saturating_add(1);
            node.tick = self.tick;
            self.pinned.push(v);
            v = node.fail;
        }
        // The missing ones, shallowest first, each failing to the one just below it.
        let mut shorter = hit;
        for i in (0..found).rev() {
            let v = self.create(self.chain[i], x, shorter)?;
            let node = &mut self.nodes[v as usize];
            node.count = node.count.saturating_add(1);
            self.pinned.push(v);
            shorter = v;
        }
        self.state = shorter;
        self.state_generation = self.nodes[shorter as usize].generation;
        if self.recent.len() == self.ngram {
            self.recent.pop_front();
        }
        self.recent.push_back(x);
        // Only the new chain was touched; record the ones nothing depends on as LRU candidates.
        // That is the new state at most: every other node of the chain is the failure link of
        // the next deeper one.
        debug_assert!(
            self.pinned[self.chain.len()..]
                .iter()
                .all(|&v| v == shorter || !self.is_evictable(v))
        );
        self.push_if_evictable(shorter);
        self.pinned.clear();
        if self.lru.len() > 2 * self.live + 4096 {
            self.rebuild_lru();
        }
        Ok(())
    }

    /// Allocate the child of `parent` labelled `token` whose failure link is `fail`.
    fn create(&mut self, parent: u32, token: u32, fail: u32) -> Result<u32> {
        if self.live >= self.capacity {
            self.evict_one()?;
        }
        let depth = self.nodes[parent as usize].depth + 1;
        let first = self.nodes[parent as usize].first_child;
        let node = Node {
            token,
            parent,
            fail,
            depth,
            count: 0,
            first_child: NIL,
            next_sibling: first,
            prev_sibling: NIL,
            n_children: 0,
            fail_in: 0,
            tick: self.tick,
            generation: 0,
            alive: true,
            hashed: false,
        };
        let v = if let Some(v) = self.free.pop() {
            let generation = self.nodes[v as usize].generation;
            self.nodes[v as usize] = Node { generation, ..node };
            v
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        };
        if first != NIL {
            self.nodes[first as usize].prev_sibling = v;
        }
        let p = &mut self.nodes[parent as usize];
        p.first_child = v;
        p.n_children += 1;
        if p.hashed {
            self.goto.insert(key(parent, token), v);
        } else if p.n_children > HASHED_CHILDREN {
            p.hashed = true;
            self.hash_children(parent);
        }
        self.nodes[fail as usize].fail_in += 1;
        self.live += 1;
        Ok(v)
    }

    /// Put every child of `u` into the goto map (room was reserved by `reserve_goto`).
    fn hash_children(&mut self, u: u32) {
        let mut c = self.nodes[u as usize].first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            self.goto.insert(key(u, n.token), c);
            c = n.next_sibling;
        }
    }

    /// The child of `u` labelled `token`, if any.
    #[inline]
    fn child(&self, u: u32, token: u32) -> Option<u32> {
        let n = &self.nodes[u as usize];
        if n.hashed {
            return self.goto.get(&key(u, token)).copied();
        }
        let mut c = n.first_child;
        while c != NIL {
            let n = &self.nodes[c as usize];
            if n.token == token {
                return Some(c);
            }
            c = n.next_sibling;
        }
        None
    }

    fn is_evictable(&self, v: u32) -> bool {
        let n = &self.nodes[v as usize];
        v != ROOT && n.alive && n.n_children == 0 && n.fail_in == 0
    }

    fn push_if_evictable(&mut self, v: u32) {
        if self.is_evictable(v) {
            // When the queue cannot grow, the entry is dropped and the queue rebuilt before it
            // is needed, never an abort.
            if !self.lru.push(self.nodes[v as usize].tick, v) {
                self.lru_lost = true;
            }
        }
    }

    fn rebuild_lru(&mut self) {
        let mut entries = Vec::new();
        if entries.try_reserve_exact(self.live).is_err() {
            self.lru.clear();
            self.lru_lost = true;
            return;
        }
        entries.extend(
            (1..self.nodes.len() as u32)
                .filter(|&v| self.is_evictable(v))
                .map(|v| (self.nodes[v as usize].tick, v)),
        );
        self.lru_lost = !self.lru.rebuild(entries);
    }

    /// Evict the least recently used node that nothing depends on and `extend` does not need.
    fn evict_one(&mut self) -> Result<()> {
        let mut victim = self.pop_victim();
        if victim.is_none() && self.lru_lost {
            self.rebuild_lru();
            victim = self.pop_victim();
        }
        let v = victim
            .ok_or_else(|| Error::Integrity("no evictable node under the node budget".into()))?;
        self.remove(v);
        Ok(())
    }

    /// Pop the least recently used node that can be evicted now, if any.
    fn pop_victim(&mut self) -> Option<u32> {
        loop {
            let (tick, v) = self.lru.pop()?;
            if self.is_victim(tick, v) {
                // Pinned nodes were used in this step or the one before: older entries need
                // no look-up.
                if tick >= self.pinned_since && self.pinned.contains(&v) {
                    return self.pop_victim_after_pinned(tick, v);
                }
                return Some(v);
            }
        }
    }

    /// Whether the LRU entry `(tick, v)` is current: a stale one was used again since (a newer
    /// entry exists) or is no longer evictable. A recycled slot never matches an old entry's
    /// tick, as nodes are only evicted in a later step than their last use.
    #[inline]
    fn is_victim(&self, tick: u64, v: u32) -> bool {
        self.is_evictable(v) && self.nodes[v as usize].tick == tick
    }

    /// [`Automaton::pop_victim`] once it popped the pinned `(tick, v)`: pinned entries are
    /// set aside until a victim is found, then put back.
    #[cold]
    #[inline(never)]
    fn pop_victim_after_pinned(&mut self, tick: u64, v: u32) -> Option<u32> {
        let mut skipped = vec![(tick, v)];
        let victim = loop {
            let Some((tick, v)) = self.lru.pop() else {
                break None;
            };
            if !self.is_victim(tick, v) {
                continue;
            }
            if tick >= self.pinned_since && self.pinned.contains(&v) {
                skipped.push((tick, v));
                continue;
            }
            break Some(v);
        };
        for (tick, v) in skipped {
            self.lru_lost |= !self.lru.push(tick, v);
        }
        victim
    }

    fn remove(&mut self, v: u32) {
        let Node {
            token,
            parent,
            fail,
            next_sibling,
            prev_sibling,
            ..
        } = self.nodes[v as usize];
        let p = &mut self.nodes[parent as usize];
        if p.hashed {
            self.goto.remove(&key(parent, token));
            p.hashed = p.n_children > 1;
        }
        if prev_sibling == NIL {
            self.nodes[parent as usize].first_child = next_sibling;
        } else {
            self.nodes[prev_sibling as usize].next_sibling = next_sibling;
        }
        if next_sibling != NIL {
            self.nodes[next_sibling as usize].prev_sibling = prev_sibling;
        }
        self.nodes[parent as usize].n_children -= 1;
        self.nodes[fail as usize].fail_in -= 1;
        let n = &mut self.nodes[v as usize];
        n.alive = false;
        n.generation = n.generation.wrapping_add(1);
        self.free.push(v);
        self.live -= 1;
        // Its parent and its failure target may now be free of dependents.
        self.push_if_evictable(parent);
        self.push_if_evictable(fail);
    }

    /// Re-derive the match state from the recent tokens if its node was recycled.
    fn ensure_state(&mut self) {
        let n = &self.nodes[self.state as usize];
        if n.alive && n.generation == self.state_generation {
            return;
        }
        self.relocate_state();
    }

    /// The match state from the recent tokens: the node of their longest indexed suffix.
    fn relocate_state(&mut self) {
        self.state = (0..self.recent.len())
            .find_map(|start| (self.recent.range(start..)).try_fold(ROOT, |u, &t| self.child(u, t)))
            .unwrap_or(ROOT);
        self.state_generation = self.nodes[self.state as usize].generation;
    }

    /// The node spelling `pattern`, if present.
    fn find(&self, pattern: &[u32]) -> Option<u32> {
        pattern.iter().try_fold(ROOT, |u, &t| self.child(u, t))
    }

    /// Append `tokens` to the sequence whose last tokens are `lead`, in place of the current
    /// one: every substring of length `1..=ngram` of `lead + tokens` that ends at a token of
    /// `tokens` is counted, none that ends in `lead`, as far as `lead`'s own substrings are
    /// indexed (the trie is prefix-closed: they are when the sequence was fed from its start,
    /// less what was evicted since). Many sequences can so be extended in turns (a shared index
    /// fed by running requests, each passing its own last `ngram - 1` tokens), counting what
    /// extending each one on its own would. The sequence continued afterwards is
    /// `lead + tokens`.
    ///
    /// # Errors
    /// `InvalidArgument` if a token of `lead` or `tokens` is negative; nothing changes then.
    pub fn extend_after(&mut self, lead: &[i32], tokens: &[i32]) -> Result<()> {
        check_tokens("lead", lead)?;
        check_tokens("tokens", tokens)?;
        self.recent.clear();
        let tail = &lead[lead.len().saturating_sub(self.ngram)..];
        self.recent.extend(tail.iter().map(|&t| t as u32));
        self.relocate_state();
        self.extend_checked(tokens)
    }

    /// Start a new request: later substrings never span this boundary; the index is kept.
    pub fn new_sequence(&mut self) {
        self.state = ROOT;
        self.state_generation = 0;
        self.recent.clear();
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        // Memory follows what is held: the containers are released, not only emptied.
        self.nodes.truncate(1);
        self.nodes.shrink_to_fit();
        self.nodes[0] = Node::root();
        self.goto = FxHashMap::default();
        self.free = Vec::new();
        self.lru = LruQueue::default();
        self.scratch = Scratch::default();
        self.lru_lost = false;
        self.live = 0;
        self.epoch = self.epoch.wrapping_add(1);
        self.new_sequence();
    }

    /// Occurrences of `pattern` in the context: exact unless one of its nodes was evicted,
    /// never above the truth.
    ///
    /// # Errors
    /// `InvalidArgument` if the pattern is empty, longer than `ngram`, or holds a negative id.
    pub fn count(&self, pattern: &[i32]) -> Result<u64> {
        if pattern.is_empty() || pattern.len() > self.ngram {
            return Err(invalid(
                "pattern",
                format!(
                    "length must be in 1..={}, got {}",
                    self.ngram,
                    pattern.len()
                ),
            ));
        }
        check_tokens("pattern", pattern)?;
        let p: Vec<u32> = pattern.iter().map(|&t| t as u32).collect();
        Ok(self
            .find(&p)
            .map_or(0, |v| u64::from(self.nodes[v as usize].count)))
    }
}

/// `InvalidArgument` naming `arg` at the first negative token id.
fn check_tokens(arg: &'static str, tokens: &[i32]) -> Result<()> {
    match tokens.iter().find(|&&t| t < 0) {
        Some(t) => Err(invalid(arg, format!("token ids must be >= 0, got {t}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
