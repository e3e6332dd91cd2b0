//! A pool of per-request RACER states drafted in one call: every request owns an `Automaton`
//! and a `LogitsTable`, driven exactly as `RacerDrafter` drives its pair (index the prompt on
//! `add`, extend with committed tokens, write copy-logit rows, build one draft tree per step).
//!
//! Determinism: a request's tree depends on that request's state and the call's arguments only.
//! Requests are looked up in a hash map, but no output ever follows the map's iteration order:
//! batch outputs follow the order of the ids given, `ids()` follows insertion order, and
//! errors report the first bad element in argument order. Drafting a batch on several threads
//! splits it into contiguous chunks whose results are concatenated in order, so the thread
//! count never changes a byte of the output.
//!
//! Locking: the map sits behind an `RwLock` (read for every per-request call, write only to
//! insert or remove), each request's state behind its own `Mutex`. A batch call locks one
//! request at a time, so two batches over overlapping ids cannot deadlock.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use crate::alloc;
use crate::automaton::{Automaton, Recency};
use crate::draft::{DraftOptions, build_draft_tree_shared};
use crate::error::{Error, Result, invalid, invalid_at};
use crate::logits_table::LogitsTable;
use crate::tree::{DraftTree, MAX_TREE_NODES};

/// Batches with fewer requests are always drafted on the calling thread.
pub const PARALLEL_MIN_REQUESTS: usize = 8;
/// Drafting work, in node-sized units, that each thread must have before a `propose` batch is
/// split: a request costs `PROPOSE_REQUEST_UNITS + capacity` units. Measured with 4K-token
/// contexts: a tree costs about 2 µs plus 30 ns per node, so a unit is about 30 ns and a
/// thread gets at least about 60 µs of work, a few times the 20-25 µs that starting and
/// joining one costs.
pub const PARALLEL_UNITS_PER_THREAD: usize = 2048;
/// The fixed cost of one request's tree, in node-sized units (about 2 µs).
pub const PROPOSE_REQUEST_UNITS: usize = 64;
/// Tokens each thread must have to index before an `extend` batch is split (about 1.2 µs a
/// token with the automaton at its node budget, so about 115 µs of work).
pub const PARALLEL_TOKENS_PER_THREAD: usize = 96;
/// Most threads a pool may be asked to use.
pub const MAX_THREADS: usize = 1024;
/// Largest SGLang mask built (`bs * n * n` booleans, 256 MiB), so absurd sizes fail cleanly.
pub const MAX_LAYOUT_CELLS: usize = 1 << 28;
/// Longest string id quoted in full in error messages.
const MAX_QUOTED_ID: usize = 48;

/// A request's key: a Python int or str.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestId {
    /// An integer id.
    Int(i64),
    /// A string id.
    Str(String),
}

impl fmt::Display for RequestId {
    /// As Python's `repr` would show it (long strings shortened), for error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Str(s) if s.chars().count() > MAX_QUOTED_ID => {
                let head: String = s.chars().take(MAX_QUOTED_ID).collect();
                write!(f, "'{}...'", head.escape_debug())
            }
            Self::Str(s) => write!(f, "'{}'", s.escape_debug()),
        }
    }
}

impl RequestId {
    /// A copy, its string (a caller's) in a fallible allocation.
    fn try_clone(&self) -> Result<Self> {
        Ok(match self {
            Self::Int(v) => Self::Int(*v),
            Self::Str(s) => {
                let mut copy = String::new();
                copy.try_reserve_exact(s.len())
                    .map_err(|_| alloc::out_of_memory("a request id", s.len()))?;
                copy.push_str(s);
                Self::Str(copy)
            }
        })
    }
}

impl From<i64> for RequestId {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for RequestId {
    fn from(s: &str) -> Self {
        Self::Str(s.to_owned())
    }
}

/// Settings shared by every request of a pool (`RacerDrafter`'s options plus the vocabulary).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolOptions {
    /// Token ids are `0..vocab_size`; the copy-logit tables have one row per id.
    pub vocab_size: usize,
    /// Longest n-gram the automata index.
    pub ngram: usize,
    /// Node budget of each request's automaton (LRU eviction beyond it).
    pub max_nodes: usize,
    /// Ids per copy-logit row (the target's top-k), also the logits tree's root breadth.
    pub breadth: usize,
    /// Shortest context suffix a retrieval border may match.
    pub min_depth: usize,
    /// Depth whose nodes do not halve their children's breadth.
    pub exempt_depth: u32,
    /// Probability-scored trees instead of "retrieval first, then breadth halving".
    pub scored: bool,
    /// Scored trees only: leave out nodes whose estimated path probability is below this.
    pub min_score: f32,
    /// Draft from the automata.
    pub use_retrieval: bool,
    /// Draft from the copy-logit tables.
    pub use_logits: bool,
}

impl PoolOptions {
    /// `RacerDrafter`'s defaults for a vocabulary of `vocab_size` ids.
    #[must_use]
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            ngram: 10,
            max_nodes: 10_000,
            breadth: 8,
            min_depth: 2,
            exempt_depth: 1,
            scored: false,
            min_score: 0.0,
            use_retrieval: true,
            use_logits: true,
        }
    }

    /// Check every setting without allocating anything.
    ///
    /// # Errors
    /// `InvalidArgument` naming the setting (as the pool spells it) if one is out of range or
    /// both sources are off.
    pub fn check(&self) -> Result<()> {
        LogitsTable::check_shape(self.vocab_size, self.breadth)
            .map_err(|e| renamed(e, "top_k", "breadth"))?;
        Automaton::check_options(self.ngram, self.max_nodes, self.min_depth)?;
        if !(0.0..=1.0).contains(&self.min_score) {
            return Err(invalid(
                "min_score",
                format!("must be in [0, 1], got {}", self.min_score),
            ));
        }
        if !(self.use_retrieval || self.use_logits) {
            return Err(invalid(
                "use_logits",
                "use_retrieval and use_logits cannot both be False",
            ));
        }
        Ok(())
    }

    fn draft_options(&self, capacity: usize) -> DraftOptions {
        DraftOptions {
            capacity,
            use_retrieval: self.use_retrieval,
            use_logits: self.use_logits,
            exempt_depth: self.exempt_depth,
            scored: self.scored,
            min_score: self.min_score,
        }
    }
}

/// The same error under the pool's name for the argument.
fn renamed(e: Error, from: &str, to: &'static str) -> Error {
    match e {
        Error::InvalidArgument { arg, msg } if arg == from => invalid(to, msg),
        other => other,
    }
}

/// The same error with the request it concerns: `topk_ids ('a'): ...`.
fn about(e: Error, id: &RequestId) -> Error {
    match e {
        Error::InvalidArgument { arg, msg } => invalid_at(format!("{arg} ({id})"), msg),
        other => other,
    }
}

/// One request's drafting state.
#[derive(Debug)]
struct Request {
    /// The request's automaton (a minimal unused one when retrieval is off).
    automaton: Automaton,
    /// The request's copy-logit table; `None` when the copy-logit source is off.
    table: Option<LogitsTable>,
}

impl Request {
    fn memory_bytes(&self) -> usize {
        self.automaton.memory_bytes() + self.table.as_ref().map_or(0, LogitsTable::memory_bytes)
    }
}

#[derive(Debug)]
struct Entry {
    /// Insertion number: `ids()` sorts by it.
    order: u64,
    state: Mutex<Request>,
}

/// The requests by id. Their insertion order (the only order `ids()` reports) is each entry's
/// `order`, so the map is the pool's only container sized by the number of requests, and it
/// grows by fallible reservations.
#[derive(Debug, Default)]
struct Requests {
    map: FxHashMap<RequestId, Entry>,
    next: u64,
}

/// Per-request RACER states, drafted in one call.
#[derive(Debug)]
pub struct DraftPool {
    options: PoolOptions,
    requests: RwLock<Requests>,
    threads: AtomicUsize,
    /// A never-written table for `build_draft_tree` (which reads the vocabulary size from its
    /// table) when the copy-logit source is off, shared by every request.
    no_logits: Option<LogitsTable>,
}

fn check_threads(threads: usize) -> Result<()> {
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(invalid(
            "threads",
            format!("must be in 1..={MAX_THREADS}, got {threads}"),
        ));
    }
    Ok(())
}

impl DraftPool {
    /// An empty pool.
    ///
    /// # Errors
    /// `InvalidArgument` if an option is out of range (see [`PoolOptions::check`]) or
    /// `threads` is outside `1..=MAX_THREADS`.
    pub fn new(options: PoolOptions, threads: usize) -> Result<Self> {
        options.check()?;
        check_threads(threads)?;
        let no_logits = if options.use_logits {
            None
        } else {
            Some(LogitsTable::new(options.vocab_size, 1)?)
        };
        Ok(Self {
            options,
            requests: RwLock::new(Requests::default()),
            threads: AtomicUsize::new(threads),
            no_logits,
        })
    }

    /// The pool's settings.
    #[must_use]
    pub fn options(&self) -> &PoolOptions {
        &self.options
    }

    /// Most threads a batch call uses (the calling thread included).
    #[must_use]
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Relaxed)
    }

    /// Set the most threads a batch call uses.
    ///
    /// # Errors
    /// `InvalidArgument` if `threads` is outside `1..=MAX_THREADS`.
    pub fn set_threads(&self, threads: usize) -> Result<()> {
        check_threads(threads)?;
        self.threads.store(threads, Ordering::Relaxed);
        Ok(())
    }

    /// Number of requests.
    #[must_use]
    pub fn len(&self) -> usize {
        self.requests.read().map.len()
    }

    /// True when the pool holds no request.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `id` is in the pool.
    #[must_use]
    pub fn contains(&self, id: &RequestId) -> bool {
        self.requests.read().map.contains_key(id)
    }

    /// The request ids in insertion order.
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the list.
    pub fn ids(&self) -> Result<Vec<RequestId>> {
        let requests = self.requests.read();
        let mut ordered = alloc::collect(
            requests.map.iter().map(|(id, e)| (e.order, id)),
            "the pool's request ids",
        )?;
        ordered.sort_unstable_by_key(|&(order, _)| order);
        alloc::try_collect(
            ordered.into_iter().map(|(_, id)| id.try_clone()),
            "the pool's request ids",
        )
    }

    /// Approximate heap memory in bytes: every request's automaton and copy-logit table (as
    /// their `memory_bytes` count them), the shared stand-in table, and the map's entries.
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        let requests = self.requests.read();
        let states: usize = requests
            .map
            .values()
            .map(|e| e.state.lock().memory_bytes())
            .sum();
        let id_heap: usize = requests
            .map
            .keys()
            .map(|id| match id {
                RequestId::Str(s) => s.capacity(),
                RequestId::Int(_) => 0,
            })
            .sum();
        states
            + id_heap
            + alloc::hash_map_bytes(
                requests.map.capacity(),
                size_of::<RequestId>() + size_of::<Entry>(),
            )
            + self.no_logits.as_ref().map_or(0, LogitsTable::memory_bytes)
    }

    /// Remove every request, releasing the map's memory too.
    pub fn clear(&self) {
        let mut requests = self.requests.write();
        let next = requests.next;
        *requests = Requests {
            next,
            ..Requests::default()
        };
    }

    fn check_tokens(&self, arg: impl FnOnce() -> String, tokens: &[i32]) -> Result<()> {
        let vocab = self.options.vocab_size;
        match tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            Some(t) => Err(invalid_at(
                arg(),
                format!("token {t} is outside 0..{vocab}"),
            )),
            None => Ok(()),
        }
    }

    /// A fresh state for a request whose prompt is `prompt` (already checked).
    fn new_request(&self, prompt: &[i32]) -> Result<Request> {
        let o = &self.options;
        let automaton = if o.use_retrieval {
            let mut a = Automaton::new(o.ngram, o.max_nodes, o.min_depth)?;
            a.new_sequence();
            a.extend(prompt)?;
            a
        } else {
            // Never extended or read; `build_draft_tree` only needs something to borrow.
            Automaton::new(2, 3, 1)?
        };
        let table = if o.use_logits {
            Some(LogitsTable::new(o.vocab_size, o.breadth)?)
        } else {
            None
        };
        Ok(Request { automaton, table })
    }

    /// Start request `id`: a new automaton indexing `prompt` and an empty copy-logit table
    /// (`RacerDrafter.begin` without prompt top-k; write those with
    /// [`update_topk`](Self::update_topk)).
    ///
    /// # Errors
    /// `InvalidArgument` if `id` is already in the pool or a prompt token is outside the
    /// vocabulary; the pool is unchanged then.
    pub fn add(&self, id: RequestId, prompt: &[i32]) -> Result<()> {
        let already = || invalid_at(format!("id ({id})"), "already in the pool");
        self.check_tokens(|| format!("prompt_ids ({id})"), prompt)?;
        if self.contains(&id) {
            return Err(already());
        }
        // Built outside the write lock, so other requests keep drafting meanwhile.
        let state = self.new_request(prompt).map_err(|e| about(e, &id))?;
        let mut requests = self.requests.write();
        if requests.map.contains_key(&id) {
            return Err(already()); // added by another thread meanwhile
        }
        requests.map.try_reserve(1).map_err(|_| {
            // Growing means doubling: the table for twice the requests.
            let entry = size_of::<RequestId>() + size_of::<Entry>();
            let grown = alloc::hash_map_bytes(2 * requests.map.capacity().max(4), entry);
            alloc::out_of_memory("the pool's request map", grown)
        })?;
        let order = requests.next;
        requests.next += 1;
        requests.map.insert(
            id,
            Entry {
                order,
                state: Mutex::new(state),
            },
        );
        Ok(())
    }

    /// Forget request `id`.
    ///
    /// # Errors
    /// `InvalidArgument` if `id` is not in the pool.
    pub fn remove(&self, id: &RequestId) -> Result<()> {
        let mut requests = self.requests.write();
        if requests.map.remove(id).is_none() {
            return Err(invalid_at(format!("id ({id})"), "unknown request id"));
        }
        Ok(())
    }

    /// The entries of `ids`, in order.
    ///
    /// # Errors
    /// `InvalidArgument` naming the first element (in argument order) that is empty, a
    /// duplicate of an earlier one, or unknown.
    fn resolve<'r>(requests: &'r Requests, ids: &[RequestId]) -> Result<Vec<&'r Entry>> {
        if ids.is_empty() {
            return Err(invalid("ids", "the batch is empty"));
        }
        // Repeats are found by entry (an address hashes faster than a string id): every id
        // before `i` is known, so an id that repeats one of them is known too and is reported
        // as a repeat, as an unknown one cannot repeat a known one. A small batch is scanned.
        const SCANNED: usize = 16;
        let what = "the batch's requests";
        let mut seen: FxHashMap<*const Entry, usize> = FxHashMap::default();
        if ids.len() > SCANNED {
            seen.try_reserve(ids.len())
                .map_err(|_| alloc::out_of_memory(what, ids.len().saturating_mul(24)))?;
        }
        let mut entries: Vec<&Entry> = alloc::with_capacity(ids.len(), what)?;
        for (i, id) in ids.iter().enumerate() {
            let entry = requests
                .map
                .get(id)
                .ok_or_else(|| invalid_at(format!("ids[{i}] ({id})"), "unknown request id"))?;
            let first = if ids.len() > SCANNED {
                seen.insert(std::ptr::from_ref(entry), i)
            } else {
                entries.iter().position(|&e| std::ptr::eq(e, entry))
            };
            if let Some(first) = first {
                return Err(invalid_at(
                    format!("ids[{i}] ({id})"),
                    format!("duplicate request id (also ids[{first}])"),
                ));
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Threads to use for a batch of `n` requests holding `work` units (nodes or tokens),
    /// `per_thread` of them at least per thread. Never more than asked for or than requests.
    fn workers(&self, n: usize, work: usize, per_thread: usize) -> usize {
        if n < PARALLEL_MIN_REQUESTS {
            return 1;
        }
        self.threads().min(n).min(work / per_thread).max(1)
    }

    /// Append committed tokens to each request's context: `tokens[i]` to request `ids[i]`
    /// (ignored when retrieval is off, as `RacerDrafter.observe` does).
    ///
    /// # Errors
    /// `InvalidArgument` if the batch is empty, an id is unknown or repeated, `tokens` does not
    /// hold one slice per id, or a token is outside the vocabulary; no request changes then.
    pub fn extend(&self, ids: &[RequestId], tokens: &[&[i32]]) -> Result<()> {
        let requests = self.requests.read();
        let entries = Self::resolve(&requests, ids)?;
        if tokens.len() != ids.len() {
            return Err(invalid(
                "tokens",
                format!(
                    "expected one token array per id ({}), got {}",
                    ids.len(),
                    tokens.len()
                ),
            ));
        }
        for (i, (id, t)) in ids.iter().zip(tokens).enumerate() {
            self.check_tokens(|| format!("tokens[{i}] ({id})"), t)?;
        }
        if !self.options.use_retrieval {
            return Ok(());
        }
        let total: usize = tokens.iter().map(|t| t.len()).sum();
        let workers = self.workers(ids.len(), total, PARALLEL_TOKENS_PER_THREAD);
        let jobs = alloc::collect(
            entries.into_iter().zip(tokens.iter().copied()),
            "the batch's jobs",
        )?;
        let done = map_batch(&jobs, workers, &|&(entry, t): &(&Entry, &[i32])| {
            entry.state.lock().automaton.extend(t)
        })?;
        done.into_iter()
            .zip(ids)
            .try_for_each(|(r, id)| r.map_err(|e| about(e, id)))
    }

    /// Write copy-logit rows of request `id`, as `LogitsTable::update_with_probs` does: for
    /// `i` in order, row `tokens[i]` := `topk_ids[i*k..(i+1)*k]` (`k` must be the pool's
    /// breadth). Checked, then ignored, when the copy-logit source is off.
    ///
    /// # Errors
    /// `InvalidArgument` if `id` is unknown, the shapes disagree, an id is outside the
    /// vocabulary or a probability outside `[0, 1]`; nothing is written then.
    pub fn update_topk(
        &self,
        id: &RequestId,
        tokens: &[i32],
        topk_ids: &[i32],
        k: usize,
        topk_probs: Option<&[f32]>,
    ) -> Result<()> {
        let requests = self.requests.read();
        let entry = requests
            .map
            .get(id)
            .ok_or_else(|| invalid_at(format!("id ({id})"), "unknown request id"))?;
        let o = &self.options;
        LogitsTable::check_update(o.vocab_size, o.breadth, tokens, topk_ids, k, topk_probs)
            .map_err(|e| about(e, id))?;
        let mut state = entry.state.lock();
        if let Some(table) = state.table.as_mut() {
            table
                .update_with_probs(tokens, topk_ids, k, topk_probs)
                .map_err(|e| about(e, id))?;
        }
        Ok(())
    }

    /// Write copy-logit rows of several requests in one call: request `ids[i]` gets the next
    /// `lengths[i]` rows of `tokens` (with their `topk_ids` rows of `k` ids and, if given,
    /// probabilities), written as `update_topk` writes them. Everything is checked before
    /// anything is written.
    ///
    /// # Errors
    /// `InvalidArgument` if the batch is empty, an id is unknown or repeated, the lengths do not
    /// hold one entry per id or add up to `tokens.len()`, the shapes disagree, an id is outside
    /// the vocabulary or a probability outside `[0, 1]` (the message names the request);
    /// nothing is written then.
    pub fn update_topk_many(
        &self,
        ids: &[RequestId],
        tokens: &[i32],
        topk_ids: &[i32],
        k: usize,
        topk_probs: Option<&[f32]>,
        lengths: &[i64],
    ) -> Result<()> {
        let requests = self.requests.read();
        let entries = Self::resolve(&requests, ids)?;
        let parts = split_ragged(tokens, lengths, ids)?;
        let o = &self.options;
        if k != o.breadth || topk_ids.len() != tokens.len() * k {
            // The whole batch's shapes (each request's slice is checked below).
            LogitsTable::check_update(o.vocab_size, o.breadth, tokens, topk_ids, k, None)?;
        }
        if topk_probs.is_some_and(|p| p.len() != topk_ids.len()) {
            return Err(invalid(
                "topk_probs",
                format!(
                    "expected {} probabilities, one per id in topk_ids",
                    topk_ids.len()
                ),
            ));
        }
        let mut rows = alloc::with_capacity(ids.len(), "the requests' rows")?;
        let mut start = 0usize;
        for (id, part) in ids.iter().zip(&parts) {
            let span = start * k..(start + part.len()) * k;
            let probs = topk_probs.map(|p| &p[span.clone()]);
            LogitsTable::check_update(
                o.vocab_size,
                o.breadth,
                part,
                &topk_ids[span.clone()],
                k,
                probs,
            )
            .map_err(|e| about(e, id))?;
            rows.push((span, probs));
            start += part.len();
        }
        for ((entry, part), (span, probs)) in entries.into_iter().zip(&parts).zip(rows) {
            let mut state = entry.state.lock();
            if let Some(table) = state.table.as_mut() {
                table.update_with_probs(part, &topk_ids[span], k, probs)?;
            }
        }
        Ok(())
    }

    /// One draft tree per request: request `ids[i]`'s tree is rooted at `last_tokens[i]` and
    /// holds at most `capacities[i]` nodes, built exactly as `build_draft_tree` builds it from
    /// that request's automaton and table with the pool's options. Refreshes the LRU recency of
    /// the automaton nodes used (as `build_draft_tree` does) and nothing else.
    ///
    /// # Errors
    /// `InvalidArgument` if the batch is empty, an id is unknown or repeated, `last_tokens` or
    /// `capacities` do not hold one entry per id, a token is outside the vocabulary, a capacity
    /// is outside `1..=MAX_TREE_NODES`, or `calibration` is not `EDGE_CELLS` probabilities in
    /// `[0, 1]`; no request changes then.
    pub fn propose(
        &self,
        ids: &[RequestId],
        last_tokens: &[i32],
        capacities: &[usize],
        calibration: Option<&[f32]>,
    ) -> Result<BatchDraft> {
        self.propose_shared(ids, last_tokens, capacities, calibration, None)
            .map(|(batch, _)| batch)
    }

    /// Per request, its automaton's longest-match chain ([`Automaton::chain`]) rooted at
    /// `last_tokens[i]`, at most `max_len` tokens after the root (a one-path tree; the root
    /// alone where nothing matches). Refreshes the LRU recency of the automaton nodes used.
    ///
    /// # Errors
    /// `InvalidArgument` if the batch is empty, an id is unknown or repeated, `last_tokens`
    /// does not hold one entry per id, a token is outside the vocabulary, or `max_len` is above
    /// `MAX_TREE_NODES - 1`; no request changes then.
    pub fn retrieval_chains(
        &self,
        ids: &[RequestId],
        last_tokens: &[i32],
        max_len: usize,
    ) -> Result<BatchDraft> {
        let chain = |entry: &Entry, next: i32| {
            let tree = entry.state.lock().automaton.chain(next, max_len)?;
            Ok((tree, Recency::default()))
        };
        Ok(self.chains_by(ids, last_tokens, max_len, &chain)?.0)
    }

    /// Per request, the longest-match chain of `shared` (an automaton of other requests'
    /// responses) after the request's latest tokens, rooted at `last_tokens[i]`: what
    /// [`Automaton::chain_after`] gives for that context, its edges in the shared-retrieval
    /// cells. `shared` is only read; per request, the nodes used come back for `shared.touch`.
    ///
    /// # Errors
    /// As [`DraftPool::retrieval_chains`].
    pub fn shared_chains(
        &self,
        ids: &[RequestId],
        last_tokens: &[i32],
        max_len: usize,
        shared: &Automaton,
    ) -> Result<(BatchDraft, Vec<Recency>)> {
        let chain = |entry: &Entry, next: i32| {
            let recent = entry.state.lock().automaton.recent_tokens();
            #[allow(clippy::cast_sign_loss)] // chains_by checked it is a token id
            Ok(shared.shared_chain(&recent, next as u32, max_len))
        };
        self.chains_by(ids, last_tokens, max_len, &chain)
    }

    /// One chain per request, `chain(entry, last_tokens[i])`, over the pool's workers, with
    /// the recency each one used.
    fn chains_by(
        &self,
        ids: &[RequestId],
        last_tokens: &[i32],
        max_len: usize,
        chain: &ChainOf<'_>,
    ) -> Result<(BatchDraft, Vec<Recency>)> {
        let requests = self.requests.read();
        let entries = Self::resolve(&requests, ids)?;
        one_entry_per_id(ids, "last_tokens", last_tokens.len())?;
        for (i, id) in ids.iter().enumerate() {
            self.check_tokens(|| format!("last_tokens[{i}] ({id})"), &last_tokens[i..=i])?;
        }
        crate::tree::check_budget("max_len + 1", max_len.saturating_add(1))?;
        let jobs = alloc::collect(
            entries.into_iter().zip(last_tokens.iter().copied()),
            "the batch's jobs",
        )?;
        let work = ids
            .len()
            .saturating_mul(PROPOSE_REQUEST_UNITS.saturating_add(max_len));
        let workers = self.workers(ids.len(), work, PARALLEL_UNITS_PER_THREAD);
        let chains = map_batch(&jobs, workers, &|&(entry, next): &(&Entry, i32)| {
            chain(entry, next)
        })?;
        let built = alloc::try_collect(
            chains
                .into_iter()
                .zip(ids)
                .map(|(r, id)| r.map_err(|e| about(e, id))),
            "the batch's chains",
        )?;
        let (trees, recency): (Vec<_>, Vec<_>) = built.into_iter().unzip();
        Ok((BatchDraft::try_new(trees)?, recency))
    }

    /// [`DraftPool::propose`] with a second retrieval source read by every request: `shared`,
    /// an automaton of other requests' responses (see [`build_draft_tree_shared`]). Returns the
    /// trees and, per request, the shared nodes its tree used, for `shared.touch` (the only
    /// change drafting makes to `shared`).
    ///
    /// # Errors
    /// As [`DraftPool::propose`].
    pub fn propose_shared(
        &self,
        ids: &[RequestId],
        last_tokens: &[i32],
        capacities: &[usize],
        calibration: Option<&[f32]>,
        shared: Option<&Automaton>,
    ) -> Result<(BatchDraft, Vec<Recency>)> {
        let requests = self.requests.read();
        let entries = Self::resolve(&requests, ids)?;
        one_entry_per_id(ids, "last_tokens", last_tokens.len())?;
        one_entry_per_id(ids, "capacity", capacities.len())?;
        for (i, id) in ids.iter().enumerate() {
            self.check_tokens(|| format!("last_tokens[{i}] ({id})"), &last_tokens[i..=i])?;
            if !(1..=MAX_TREE_NODES).contains(&capacities[i]) {
                return Err(invalid_at(
                    format!("capacity[{i}] ({id})"),
                    format!("must be in 1..={MAX_TREE_NODES}, got {}", capacities[i]),
                ));
            }
        }
        if let Some(c) = calibration {
            crate::draft::check_calibration(c)?;
        }
        let jobs = alloc::collect(
            entries
                .into_iter()
                .zip(last_tokens.iter().copied())
                .zip(capacities.iter().copied())
                .map(|((e, t), c)| (e, t, c)),
            "the batch's jobs",
        )?;
        let work = capacities.iter().fold(0usize, |a, &c| {
            a.saturating_add(PROPOSE_REQUEST_UNITS.saturating_add(c))
        });
        let workers = self.workers(ids.len(), work, PARALLEL_UNITS_PER_THREAD);
        let trees = map_batch(&jobs, workers, &|&(entry, next, capacity): &(
            &Entry,
            i32,
            usize,
        )| {
            let mut guard = entry.state.lock();
            let Request { automaton, table } = &mut *guard;
            let table = match (table.as_ref(), self.no_logits.as_ref()) {
                (Some(t), _) | (None, Some(t)) => t,
                (None, None) => {
                    return Err(Error::Integrity("a request has no table".into()));
                }
            };
            let options = self.options.draft_options(capacity);
            build_draft_tree_shared(automaton, shared, table, next, &[], &options, calibration)
        })?;
        let built = alloc::try_collect(
            trees
                .into_iter()
                .zip(ids)
                .map(|(r, id)| r.map_err(|e| about(e, id))),
            "the batch's trees",
        )?;
        let (trees, recency): (Vec<_>, Vec<_>) = built.into_iter().unzip();
        Ok((BatchDraft::try_new(trees)?, recency))
    }
}

/// How [`DraftPool::chains_by`] drafts one request's chain from its entry and root, with the
/// recency of the nodes it used.
type ChainOf<'a> = dyn Fn(&Entry, i32) -> Result<(DraftTree, Recency)> + Sync + 'a;

/// `InvalidArgument` naming `arg` unless it holds `len == ids.len()` entries, one per id.
fn one_entry_per_id(ids: &[RequestId], arg: &'static str, len: usize) -> Result<()> {
    if len == ids.len() {
        return Ok(());
    }
    Err(invalid(
        arg,
        format!("expected one entry per id ({}), got {len}", ids.len()),
    ))
}

/// Split a flat token array into one slice per request (`lengths[i]` tokens each, in order).
///
/// # Errors
/// `InvalidArgument` if a length is negative or the lengths do not add up to `tokens.len()`.
pub fn split_ragged<'t>(
    tokens: &'t [i32],
    lengths: &[i64],
    ids: &[RequestId],
) -> Result<Vec<&'t [i32]>> {
    if lengths.len() != ids.len() {
        return Err(invalid(
            "lengths",
            format!(
                "expected one length per id ({}), got {}",
                ids.len(),
                lengths.len()
            ),
        ));
    }
    let mut out = alloc::with_capacity(lengths.len(), "the requests' token slices")?;
    let mut start = 0usize;
    for (i, (&n, id)) in lengths.iter().zip(ids).enumerate() {
        let n = usize::try_from(n).map_err(|_| {
            invalid_at(
                format!("lengths[{i}] ({id})"),
                format!("must be >= 0, got {n}"),
            )
        })?;
        let end = start
            .checked_add(n)
            .filter(|&e| e <= tokens.len())
            .ok_or_else(|| {
                invalid_at(
                    format!("lengths[{i}] ({id})"),
                    format!(
                        "the lengths so far exceed the {} tokens given",
                        tokens.len()
                    ),
                )
            })?;
        out.push(&tokens[start..end]);
        start = end;
    }
    if start != tokens.len() {
        return Err(invalid(
            "lengths",
            format!("add up to {start}, but {} tokens were given", tokens.len()),
        ));
    }
    Ok(out)
}

/// `f` over every job, on up to `workers` threads (the calling thread included); results in
/// job order whatever the thread count. Jobs are split into contiguous chunks, one per thread;
/// a chunk whose thread cannot be started runs on the calling thread. Every buffer of results
/// is a fallible allocation: the output is reserved for every job up front, so appending the
/// threads' chunks to it allocates nothing.
///
/// # Errors
/// `Integrity` if a worker thread panicked; `OutOfMemory` if a results buffer cannot be had.
fn map_batch<J: Sync, T: Send>(
    jobs: &[J],
    workers: usize,
    f: &(impl Fn(&J) -> T + Sync),
) -> Result<Vec<T>> {
    const WHAT: &str = "the batch's results";
    if workers <= 1 || jobs.len() <= 1 {
        return alloc::collect(jobs.iter().map(f), WHAT);
    }
    let mut out = alloc::with_capacity(jobs.len(), WHAT)?;
    let chunk = jobs.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let mut chunks = jobs.chunks(chunk);
        let first = chunks.next().unwrap_or(&[]);
        // At most `MAX_THREADS` handles: not sized by the batch.
        let spawned: Vec<_> = chunks
            .map(|c| {
                let handle = std::thread::Builder::new()
                    .name("racer-pool".into())
                    .spawn_scoped(scope, move || alloc::collect(c.iter().map(f), WHAT));
                (c, handle)
            })
            .collect();
        out.extend(first.iter().map(f));
        // Every thread is joined before returning (an unjoined one that panicked would make
        // the scope panic).
        let (mut panicked, mut failed) = (false, None);
        for (c, handle) in spawned {
            match handle {
                Ok(h) => match h.join() {
                    Ok(Ok(part)) => out.extend(part),
                    Ok(Err(e)) => failed = failed.or(Some(e)),
                    Err(_) => panicked = true,
                },
                Err(_) => out.extend(c.iter().map(f)),
            }
        }
        if panicked {
            return Err(Error::Integrity("a drafting thread panicked".into()));
        }
        failed.map_or(Ok(out), Err)
    })
}

/// The draft trees of one batch, in the order of the ids given, with flat views and the
/// layouts verification engines take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDraft {
    trees: Vec<DraftTree>,
    /// `offsets[i]..offsets[i + 1]` are request `i`'s nodes in the flat arrays.
    offsets: Vec<usize>,
}

impl BatchDraft {
    /// A batch of trees.
    ///
    /// # Panics
    /// If the memory for the offsets cannot be had; [`BatchDraft::try_new`] reports that as an
    /// error instead (the pool's path).
    #[must_use]
    pub fn new(trees: Vec<DraftTree>) -> Self {
        Self::try_new(trees).expect("memory for the batch's offsets")
    }

    /// [`BatchDraft::new`] with a fallible allocation of the offsets.
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the offsets.
    pub fn try_new(trees: Vec<DraftTree>) -> Result<Self> {
        let mut offsets = alloc::with_capacity(trees.len() + 1, "the batch's offsets")?;
        offsets.push(0);
        for t in &trees {
            offsets.push(offsets[offsets.len() - 1] + t.len());
        }
        Ok(Self { trees, offsets })
    }

    /// Number of requests.
    #[must_use]
    pub fn len(&self) -> usize {
        self.trees.len()
    }

    /// True for a batch of no request.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }

    /// Every request's tree, in batch order.
    #[must_use]
    pub fn trees(&self) -> &[DraftTree] {
        &self.trees
    }

    /// Node offsets into the flat arrays (`len() + 1` entries, starting at 0).
    #[must_use]
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    fn flat(&self, part: impl Fn(&DraftTree) -> &[i32]) -> Result<Vec<i32>> {
        let mut out = alloc::with_capacity(self.offsets[self.trees.len()], "the batch's nodes")?;
        for t in &self.trees {
            // Within the reservation (the offsets add up every tree's length).
            out.extend_from_slice(part(t));
        }
        Ok(out)
    }

    /// Every node's token, request after request.
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the array.
    pub fn tokens(&self) -> Result<Vec<i32>> {
        self.flat(DraftTree::tokens)
    }

    /// Every node's parent as an index local to its request (`-1` at each root).
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the array.
    pub fn parents(&self) -> Result<Vec<i32>> {
        self.flat(DraftTree::parents)
    }

    /// Every node's edge cell (`-1` at each root).
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the array.
    pub fn cells(&self) -> Result<Vec<i32>> {
        self.flat(DraftTree::cells)
    }

    /// SGLang's n-gram layout with `n` nodes per request: `tokens[b * n + i]` and the
    /// row-major mask `mask[(b * n + i) * n + j]`, true iff node `j` is node `i` or one of its
    /// ancestors. Node 0 is the root (the last verified token) and nodes follow BFS order, so
    /// a parent always comes before its children; a tree bigger than `n` keeps its first `n`
    /// BFS nodes (a connected prefix), a smaller one is padded with token-0 children of the
    /// root.
    ///
    /// # Errors
    /// `InvalidArgument` if `n` is 0 or the mask would exceed `MAX_LAYOUT_CELLS`;
    /// `OutOfMemory` if the system cannot provide the arrays.
    pub fn sglang(&self, n: usize) -> Result<(Vec<i64>, Vec<bool>)> {
        let bs = self.trees.len();
        if n == 0 {
            return Err(invalid("n", "must be >= 1, got 0"));
        }
        let cells = n
            .checked_mul(n)
            .and_then(|c| c.checked_mul(bs))
            .filter(|&c| c <= MAX_LAYOUT_CELLS)
            .ok_or_else(|| {
                invalid(
                    "n",
                    format!(
                        "a batch of {bs} with n = {n} needs a mask of bs * n * n elements, over the limit of {MAX_LAYOUT_CELLS}"
                    ),
                )
            })?;
        let mut tokens = alloc::filled("n", "the layout's tokens", bs * n, 0i64)?;
        let mut mask = alloc::filled("n", "the layout's mask", cells, false)?;
        for (b, tree) in self.trees.iter().enumerate() {
            let m = tree.len().min(n);
            let rows = &mut mask[b * n * n..(b + 1) * n * n];
            for (slot, &t) in tokens[b * n..b * n + m].iter_mut().zip(tree.tokens()) {
                *slot = i64::from(t);
            }
            rows[0] = true;
            for i in 1..n {
                // The parent's row is above row i (a parent precedes its child), so copy it.
                let p = if i < m { tree.parents()[i] as usize } else { 0 };
                let (done, rest) = rows.split_at_mut(i * n);
                rest[..n].copy_from_slice(&done[p * n..(p + 1) * n]);
                rest[i] = true;
            }
        }
        Ok((tokens, mask))
    }

    /// Per request, the tokens after the root along its best root-to-leaf path, at most `k`
    /// of them (those nearest the root). The best path ends at the deepest leaf, ties going to
    /// the smallest node index (BFS order): in BFS order that is the first node of the
    /// greatest depth.
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the lists.
    pub fn chains(&self, k: usize) -> Result<Vec<Vec<i32>>> {
        alloc::try_collect(
            self.trees.iter().map(|tree| {
                let mut path = best_path(tree);
                path.truncate(k);
                Ok(path.into_iter().map(|u| tree.tokens()[u]).collect())
            }),
            "the batch's chains",
        )
    }

    /// [`BatchDraft::chains`] as a table: `(tokens, cells)`, each `bs * k` row-major, request
    /// `b`'s chain at `b * k..`, the token and the edge cell of each node, `-1` past its end.
    ///
    /// # Errors
    /// `InvalidArgument` if `bs * k` exceeds `MAX_LAYOUT_CELLS`; `OutOfMemory` if the system
    /// cannot provide the arrays.
    pub fn chain_table(&self, k: usize) -> Result<(Vec<i32>, Vec<i32>)> {
        let bs = self.trees.len();
        let size = bs
            .checked_mul(k)
            .filter(|&c| c <= MAX_LAYOUT_CELLS)
            .ok_or_else(|| {
                invalid(
                    "k",
                    format!(
                        "a batch of {bs} with k = {k} is over the limit of {MAX_LAYOUT_CELLS} cells"
                    ),
                )
            })?;
        let mut tokens = alloc::filled("k", "the chains' tokens", size, -1i32)?;
        let mut cells = alloc::filled("k", "the chains' cells", size, -1i32)?;
        for (b, tree) in self.trees.iter().enumerate() {
            for (j, u) in best_path(tree).into_iter().take(k).enumerate() {
                tokens[b * k + j] = tree.tokens()[u];
                cells[b * k + j] = tree.cells()[u];
            }
        }
        Ok((tokens, cells))
    }
}

/// The nodes after the root along `tree`'s deepest root-to-leaf path, root side first: the
/// first node of the greatest depth in BFS order is its leaf.
fn best_path(tree: &DraftTree) -> Vec<usize> {
    let depths = tree.depths();
    let deepest = depths.last().copied().unwrap_or(0);
    let leaf = depths.partition_point(|&d| d < deepest);
    // At most a tree's depth (below `MAX_TREE_NODES`): not sized by the batch.
    let mut path = Vec::with_capacity(deepest as usize);
    let mut u = leaf;
    while u > 0 {
        path.push(u);
        u = tree.parents()[u] as usize;
    }
    path.reverse();
    path
}

#[cfg(test)]
mod tests;
