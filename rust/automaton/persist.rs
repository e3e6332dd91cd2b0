//! Persistence: a versioned, checksummed binary image of an automaton, written atomically.
//!
//! Format version 1, all integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `b"RACERIDX"` |
//! | 8 | 4 | format version (`1`) |
//! | 12 | 4 | flags (`0`; anything else is rejected) |
//! | 16 | 4 | `ngram` |
//! | 20 | 4 | `min_depth` |
//! | 24 | 8 | `capacity` (node budget) |
//! | 32 | 8 | logical clock (`tick`) |
//! | 40 | 4 | node slots, root included (`S`) |
//! | 44 | 4 | live nodes, root excluded (`L`) |
//! | 48 | 4 | free slots (`F = S - 1 - L`) |
//! | 52 | 4 | recent tokens (`R <= ngram`) |
//! | 56 | 4R | the recent tokens, oldest first (the match state spells them) |
//! | | 4F | the free list, in stack order (the next node reuses the last) |
//! | | 25L | the live nodes in increasing slot order: token u32, parent slot u32, failure link slot u32, count u32, last use u64, depth u8 |
//! | | 4 | CRC-32 (zlib's) of every byte before it |
//!
//! Nodes keep their slot numbers and the free list its order because ties are broken by slot
//! (the LRU heap orders equal last uses by slot, the scored build equal scores by trie node):
//! renumbering would change which node is evicted next. The image is compact all the same:
//! `extend` reuses an evicted slot at once, so the free list is empty in practice and the live
//! nodes fill slots `1..=L` (the field keeps the format exact for any slot layout).
//!
//! Failure links are stored (recomputing them costs a random hash lookup per node, about as much
//! as the rest of the load) and verified without one: the stored link `f` of node `v` (token
//! `t`, parent `p`) must be the root at depth 1, and otherwise a live node one level shallower
//! than `v` whose token is `t` and whose parent is the stored link of `p`. By induction on depth, `f` then spells `v`'s
//! string minus its first token (children of a node carry distinct tokens, also checked), so
//! every link is right and the trie suffix-closed. Everything else (goto map, child lists,
//! dependent counters, the LRU heap, the match state) is rebuilt. Node generations restart at
//! zero: no handle survives a load.
//!
//! Loading never trusts the image: the length must match the header, the checksum must match,
//! every count, slot, depth and token must be in range, and every invariant that
//! [`Automaton::check_integrity`] checks is either checked while decoding or holds by
//! construction (`Columns::link` lists which); anything else is `Error::CorruptFile`. Running
//! a check again afterwards would cost more than the load itself, so release builds do not:
//! [`Automaton::check_integrity_linear`] (run after every load in debug builds) about doubles
//! it, and the brute-force `check_integrity` (which the tests run on loaded automata) took
//! 0.93 s per million nodes on 12M nodes, five times the load's 0.18. Every buffer is sized from counts already checked against
//! the image's length, so a damaged header cannot cause a large allocation.
//!
//! Measured on 10M tokens of code-like text (56.5M nodes, 1348 MiB): load 0.32 s and save
//! 0.074 s per million nodes (`benches/bench_index.py`).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Automaton, HASHED_CHILDREN, NIL, Node, ROOT, key};
use crate::crc32::crc32;
use crate::error::{Error, Result, invalid, io_error};

/// First bytes of every image.
pub const MAGIC: [u8; 8] = *b"RACERIDX";
/// Format version written, and the only one read.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 56;
const NODE_LEN: usize = 25;
const CHECKSUM_LEN: usize = 4;

/// Little-endian reader over a byte slice whose length was checked up front.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.data[self.at..self.at + N]);
        self.at += N;
        out
    }

    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    Reader { data, at }.u32()
}

impl Automaton {
    /// The image of this automaton in the persistence format (see `automaton::persist`).
    ///
    /// # Panics
    /// If the memory for the image cannot be had; [`Automaton::try_to_bytes`] reports that as
    /// an error instead (the bindings' and `save`'s path).
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        self.try_to_bytes()
            .expect("memory for the automaton's image")
    }

    /// [`Automaton::to_bytes`] with a fallible allocation of the image.
    ///
    /// # Errors
    /// `OutOfMemory` if the system cannot provide the image's bytes.
    #[allow(clippy::cast_possible_truncation)] // slots, lengths and depths fit in u32 / u8
    pub fn try_to_bytes(&self) -> Result<Vec<u8>> {
        let slots = self.nodes.len();
        let size =
            HEADER_LEN + 4 * (self.recent.len() + self.free.len()) + NODE_LEN * self.live + 4;
        let mut out: Vec<u8> = buffer("an automaton's image", size, 0)?;
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.ngram as u32).to_le_bytes());
        out.extend_from_slice(&(self.min_depth as u32).to_le_bytes());
        out.extend_from_slice(&(self.capacity as u64).to_le_bytes());
        out.extend_from_slice(&self.tick.to_le_bytes());
        out.extend_from_slice(&(slots as u32).to_le_bytes());
        out.extend_from_slice(&(self.live as u32).to_le_bytes());
        out.extend_from_slice(&(self.free.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.recent.len() as u32).to_le_bytes());
        for &t in &self.recent {
            out.extend_from_slice(&t.to_le_bytes());
        }
        for &v in &self.free {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for n in self.nodes[1..].iter().filter(|n| n.alive) {
            out.extend_from_slice(&n.token.to_le_bytes());
            out.extend_from_slice(&n.parent.to_le_bytes());
            out.extend_from_slice(&n.fail.to_le_bytes());
            out.extend_from_slice(&n.count.to_le_bytes());
            out.extend_from_slice(&n.tick.to_le_bytes());
            out.push(n.depth as u8);
        }
        let checksum = crc32(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        debug_assert_eq!(out.len(), size);
        Ok(out)
    }

    /// Rebuild an automaton from [`Automaton::to_bytes`] output.
    ///
    /// # Errors
    /// `CorruptFile` (naming `data`) if the image is truncated, damaged, of another format or
    /// version, or describes an automaton that breaks an invariant.
    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        decode(data, "data")
    }

    /// Write the image to `path` atomically: into a temporary file in the same folder, synced
    /// to disk, then renamed over `path` (the temporary file is removed on failure).
    ///
    /// # Errors
    /// `Io` if a file operation fails; `InvalidArgument` if `path` names no file.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.try_to_bytes()?)
    }

    /// Read an automaton saved by [`Automaton::save`].
    ///
    /// The header is read first: the image length its counts describe must be the file's (for
    /// a regular file) before anything is allocated for the image, and what is read never
    /// exceeds that length by more than a byte, so neither a damaged header nor a file that
    /// does not end (`/dev/zero`, a pipe) can make the load allocate more than the file holds,
    /// or read forever.
    ///
    /// # Errors
    /// `Io` if the file cannot be read; `CorruptFile` (naming the file) as for
    /// [`Automaton::from_bytes`]; `OutOfMemory` if the system cannot provide the image's bytes.
    pub fn load(path: &Path) -> Result<Self> {
        let source = path.display().to_string();
        let read_error = |e: std::io::Error| io_error(path, &e);
        let mut file = File::open(path).map_err(read_error)?;
        let metadata = file.metadata().map_err(read_error)?;
        let mut data = Vec::new();
        (&mut file)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut data)
            .map_err(read_error)?;
        if data.len() < HEADER_LEN {
            return decode(&data, &source); // too short for an image: says what is wrong
        }
        let described = described_len(&data);
        // A regular file's length is known: the header must describe it. Other files (a pipe,
        // a device) are read up to the described length, and one byte more to see them end.
        let len = if metadata.is_file() {
            metadata.len()
        } else {
            described
        };
        check_header(&data, len, &source)?;
        let rest = usize::try_from(described + 1)
            .ok()
            .and_then(|n| n.checked_sub(data.len()))
            .unwrap_or(usize::MAX);
        data.try_reserve_exact(rest).map_err(|_| {
            out_of_memory(
                "an index file's bytes",
                usize::try_from(described).unwrap_or(usize::MAX),
            )
        })?;
        // Within the reservation (`take` stops at its end): no further allocation.
        file.take(rest as u64)
            .read_to_end(&mut data)
            .map_err(read_error)?;
        decode(&data, &source)
    }
}

/// The image length (in bytes) that the header at the start of `data` describes: the header,
/// the recent tokens, the free list, the live nodes and the checksum. `data` holds at least
/// the header.
fn described_len(data: &[u8]) -> u64 {
    let field = |at: usize| u64::from(u32_at(data, at));
    let (live, free_len, recent_len) = (field(44), field(48), field(52));
    (HEADER_LEN + CHECKSUM_LEN) as u64 + 4 * (recent_len + free_len) + NODE_LEN as u64 * live
}

/// Every check that needs only the header, for an image of `len` bytes that starts with
/// `data` (the whole image, or at least its header): the magic, the version, the minimum
/// length, and the length the header describes.
///
/// # Errors
/// `CorruptFile` naming `source` and what is wrong.
fn check_header(data: &[u8], len: u64, source: &str) -> Result<()> {
    let corrupt = |msg: String| Error::CorruptFile {
        source_name: source.to_string(),
        msg,
    };
    if len == 0 {
        return Err(corrupt("is empty, not an automaton image".into()));
    }
    let head = &data[..data.len().min(MAGIC.len())];
    if head != &MAGIC[..head.len()] {
        return Err(corrupt(format!(
            "is not an automaton image (starts with {head:02x?}, expected {MAGIC:02x?} = \"RACERIDX\")"
        )));
    }
    let minimum = HEADER_LEN + CHECKSUM_LEN;
    if len < 12 {
        return Err(corrupt(format!(
            "is truncated: {len} bytes, shorter than the {minimum}-byte minimum"
        )));
    }
    let version = u32_at(data, 8);
    if version != FORMAT_VERSION {
        let why = if version > FORMAT_VERSION {
            "newer than this racer_rs reads; upgrade racer_rs"
        } else {
            "unknown"
        };
        return Err(corrupt(format!(
            "has format version {version} ({why}); this build reads version {FORMAT_VERSION}"
        )));
    }
    if len < minimum as u64 {
        return Err(corrupt(format!(
            "is truncated: {len} bytes, shorter than the {minimum}-byte minimum"
        )));
    }
    let expected = described_len(data);
    if len != expected {
        let what = if len < expected {
            "is truncated"
        } else {
            "has trailing bytes"
        };
        let field = |at: usize| u32_at(data, at);
        return Err(corrupt(format!(
            "{what}: {len} bytes, but its header describes {expected} \
             ({} nodes, {} free slots, {} recent tokens)",
            field(44),
            field(48),
            field(52)
        )));
    }
    Ok(())
}

fn decode(data: &[u8], source: &str) -> Result<Automaton> {
    let corrupt = |msg: String| Error::CorruptFile {
        source_name: source.to_string(),
        msg,
    };
    let len = data.len();
    check_header(data, len as u64, source)?;
    let mut r = Reader { data, at: 12 };
    let flags = r.u32();
    let ngram = r.u32();
    let min_depth = r.u32();
    let capacity = r.u64();
    let tick = r.u64();
    let slots = r.u32();
    let live = r.u32();
    let free_len = r.u32();
    let recent_len = r.u32();
    let stored = u32_at(data, len - CHECKSUM_LEN);
    let computed = crc32(&data[..len - CHECKSUM_LEN]);
    if stored != computed {
        return Err(corrupt(format!(
            "is damaged: checksum {computed:08x} differs from the stored {stored:08x}"
        )));
    }
    // From here on the bytes are what some writer wrote; they are still checked, so a buggy
    // or hostile writer gets an error, never a panic or a wrong index.
    if flags != 0 {
        return Err(corrupt(format!("has unknown flags {flags:#x}")));
    }
    let capacity = usize::try_from(capacity).unwrap_or(usize::MAX);
    let mut a = Automaton::new(ngram as usize, capacity, min_depth as usize)
        .map_err(|e| corrupt(format!("has a bad configuration: {e}")))?;
    if recent_len as usize > a.ngram {
        return Err(corrupt(format!(
            "holds {recent_len} recent tokens, more than ngram = {ngram}"
        )));
    }
    if u64::from(slots) != 1 + u64::from(live) + u64::from(free_len) {
        return Err(corrupt(format!(
            "has {slots} node slots for 1 root, {live} live nodes and {free_len} free slots"
        )));
    }
    if live as usize > a.capacity || slots as usize > a.capacity + 1 {
        return Err(corrupt(format!(
            "has {live} live nodes in {slots} slots, beyond the node budget {}",
            a.capacity
        )));
    }
    a.tick = tick;
    let recent: Vec<u32> = (0..recent_len).map(|_| r.u32()).collect();
    if let Some(t) = recent.iter().find(|&&t| t > i32::MAX as u32) {
        return Err(corrupt(format!("holds a recent token {t} beyond int32")));
    }
    let mut c = Columns::new(slots as usize, live as usize)?;
    a.free = buffer("an automaton's free slots", free_len as usize, 0)?;
    a.free.clear();
    // The node table, reserved now: `link` fills it without allocating (and reserves the
    // goto map once it knows how many entries it holds).
    a.nodes
        .try_reserve_exact((slots as usize).saturating_sub(a.nodes.len()))
        .map_err(|_| out_of_memory("an automaton's nodes", slots as usize * size_of::<Node>()))?;
    for _ in 0..free_len {
        let v = r.u32();
        if v == ROOT || v >= slots || c.depth[v as usize] == DEAD {
            return Err(corrupt(format!(
                "has a bad or repeated free slot {v} (slots 1..{slots})"
            )));
        }
        c.depth[v as usize] = DEAD;
        a.free.push(v);
    }
    c.read_nodes(&mut r, a.ngram, tick).map_err(&corrupt)?;
    debug_assert_eq!(r.at, len - CHECKSUM_LEN);
    c.link(&mut a, corrupt)?;
    a.live = live as usize;
    a.recent = VecDeque::with_capacity(a.ngram + 1);
    a.recent.extend(recent.iter().copied());
    a.state = a.find(&recent).ok_or_else(|| {
        corrupt(format!(
            "has recent tokens {recent:?} that spell no node (the match state is lost)"
        ))
    })?;
    a.state_generation = a.nodes[a.state as usize].generation;
    a.rebuild_lru();
    // `link` checked or built every invariant `check_integrity` checks (see `Columns::link`);
    // re-deriving them all again costs as much as the load, so only debug builds (and the
    // tests, with the brute-force check) do.
    debug_assert_eq!(a.check_integrity_linear(), Ok(()));
    Ok(a)
}

/// Depth of a free slot while decoding (no live node is this deep).
const DEAD: u8 = u8::MAX;

/// A zeroed buffer of `len` elements for decoding or encoding an image: a fallible allocation
/// (an `OutOfMemory` error, never an abort) like `crate::alloc::filled`, without its element
/// cap: an image's counts are already bounded by its own length, and a large index is valid.
fn buffer<T: Clone>(what: &str, len: usize, value: T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| out_of_memory(what, len.saturating_mul(size_of::<T>())))?;
    v.resize(len, value);
    Ok(v)
}

fn out_of_memory(what: &str, bytes: usize) -> Error {
    Error::OutOfMemory {
        what: what.to_string(),
        bytes,
    }
}

/// The decoded nodes, one compact array per field (indexed by slot), so that the random
/// accesses of linking hit small arrays rather than whole nodes; and the linking's own arrays,
/// allocated (fallibly) with them.
struct Columns {
    token: Vec<u32>,
    parent: Vec<u32>,
    fail: Vec<u32>,
    count: Vec<u32>,
    last_use: Vec<u64>,
    depth: Vec<u8>,
    n_children: Vec<u32>,
    fail_in: Vec<u32>,
    first_child: Vec<u32>,
    next_sibling: Vec<u32>,
    prev_sibling: Vec<u32>,
    /// Room for one goto entry per live node (see `insert_in_bucket_order`).
    sorted: Vec<(u64, u32)>,
}

impl Columns {
    fn new(slots: usize, live: usize) -> Result<Self> {
        const WHAT: &str = "an automaton image's decoding buffers";
        let mut parent = buffer(WHAT, slots, 0u32)?;
        parent[0] = NIL;
        let mut sorted = buffer(WHAT, live, (0u64, 0u32))?;
        sorted.clear();
        Ok(Self {
            token: buffer(WHAT, slots, NIL)?,
            parent,
            fail: buffer(WHAT, slots, ROOT)?,
            count: buffer(WHAT, slots, 0)?,
            last_use: buffer(WHAT, slots, 0)?,
            depth: buffer(WHAT, slots, 0)?,
            n_children: buffer(WHAT, slots, 0)?,
            fail_in: buffer(WHAT, slots, 0)?,
            first_child: buffer(WHAT, slots, NIL)?,
            next_sibling: buffer(WHAT, slots, NIL)?,
            prev_sibling: buffer(WHAT, slots, NIL)?,
            sorted,
        })
    }

    fn slots(&self) -> usize {
        self.depth.len()
    }

    /// Read one record per slot that is not free, checking each field's range.
    fn read_nodes(
        &mut self,
        r: &mut Reader<'_>,
        ngram: usize,
        tick: u64,
    ) -> std::result::Result<(), String> {
        let (slots, max_depth) = (self.slots(), ngram as u32);
        for v in 1..slots {
            if self.depth[v] == DEAD {
                continue;
            }
            let (token, parent, fail, count, last_use, depth) =
                (r.u32(), r.u32(), r.u32(), r.u32(), r.u64(), r.u8());
            let bad = if token > i32::MAX as u32 {
                Some(format!("token {token} beyond int32"))
            } else if parent as usize >= slots || parent as usize == v {
                Some(format!("parent slot {parent}"))
            } else if fail as usize >= slots || fail as usize == v {
                Some(format!("failure link slot {fail}"))
            } else if count == 0 {
                Some("count 0".to_string())
            } else if last_use > tick {
                Some(format!("last use {last_use} after the clock {tick}"))
            } else if !(1..=max_depth).contains(&u32::from(depth)) {
                Some(format!("depth {depth} outside 1..={max_depth}"))
            } else {
                None
            };
            if let Some(what) = bad {
                return Err(format!("has a bad node in slot {v}: {what}"));
            }
            self.token[v] = token;
            self.parent[v] = parent;
            self.fail[v] = fail;
            self.count[v] = count;
            self.last_use[v] = last_use;
            self.depth[v] = depth;
        }
        Ok(())
    }

    /// Build `a`'s nodes and goto map, checking every invariant of `check_integrity` that does
    /// not hold by construction; returns what is wrong otherwise.
    ///
    /// Checked: each node's parent is live and one level up (so parent links are acyclic and
    /// depths right), no two children of a node share a token, each failure link is the node of
    /// the string minus its first token (see the module doc; this also proves the trie
    /// suffix-closed), and counts never exceed the prefix's or the suffix's. Built, so right by
    /// construction: the goto map (one entry per live node), the child lists and the dependent
    /// counters. The caller checks the budget and rebuilds the match state and the LRU heap.
    fn link(self, a: &mut Automaton, corrupt: impl Fn(String) -> Error) -> Result<()> {
        let slots = self.slots();
        let Self {
            token,
            parent,
            fail,
            count,
            last_use,
            depth,
            mut n_children,
            mut fail_in,
            mut first_child,
            mut next_sibling,
            mut prev_sibling,
            sorted,
        } = self;
        let live = (1..slots).filter(|&v| depth[v] != DEAD);
        for v in live.clone() {
            let (p, f) = (parent[v] as usize, fail[v] as usize);
            if depth[p] == DEAD || u32::from(depth[p]) + 1 != u32::from(depth[v]) {
                return Err(corrupt(format!(
                    "node {v} (depth {}) hangs below slot {p}, which is free or at depth {}",
                    depth[v], depth[p]
                )));
            }
            let suffix = if depth[v] == 1 {
                f == 0
            } else {
                depth[f] != DEAD
                    && depth[f] + 1 == depth[v]
                    && token[f] == token[v]
                    && parent[f] == fail[p]
            };
            if !suffix {
                return Err(corrupt(format!(
                    "node {v} (depth {}): its failure link {f} is not the node of its string \
                     minus the first token",
                    depth[v]
                )));
            }
            if (p != 0 && count[p] < count[v]) || (f != 0 && count[f] < count[v]) {
                return Err(corrupt(format!(
                    "node {v}: count {} exceeds its prefix's ({}) or its suffix's ({})",
                    count[v], count[p], count[f]
                )));
            }
            n_children[p] += 1;
            fail_in[f] += 1;
        }
        // Only the children of nodes with many go into the goto map (see `Node::hashed`).
        let hashed = |p: usize| n_children[p] > HASHED_CHILDREN;
        let entries = live.clone().filter(|&v| hashed(parent[v] as usize)).count();
        a.goto.try_reserve(entries).map_err(|_| {
            out_of_memory("an automaton's goto map", entries * size_of::<(u64, u32)>())
        })?;
        insert_in_bucket_order(
            a,
            live.clone()
                .filter(|&v| hashed(parent[v] as usize))
                .map(|v| (key(parent[v], token[v]), v as u32)),
            sorted,
        )
        .map_err(&corrupt)?;
        for v in live {
            let p = parent[v] as usize;
            let first = first_child[p];
            if !hashed(p) {
                // The goto map did not see these: no two children of a node share a token.
                let mut c = first;
                while c != NIL {
                    if token[c as usize] == token[v] {
                        return Err(corrupt(two_children(p as u32, token[v])));
                    }
                    c = next_sibling[c as usize];
                }
            }
            next_sibling[v] = first;
            if first != NIL {
                prev_sibling[first as usize] = v as u32;
            }
            first_child[p] = v as u32;
        }
        // Within the capacity `decode` reserved: no allocation.
        a.nodes.clear();
        a.nodes.extend((0..slots).map(|v| Node {
            token: token[v],
            parent: parent[v],
            fail: if v == 0 { ROOT } else { fail[v] },
            depth: if depth[v] == DEAD {
                0
            } else {
                u32::from(depth[v])
            },
            count: count[v],
            first_child: first_child[v],
            next_sibling: next_sibling[v],
            prev_sibling: prev_sibling[v],
            n_children: n_children[v],
            fail_in: fail_in[v],
            tick: last_use[v],
            generation: 0,
            alive: depth[v] != DEAD,
            hashed: n_children[v] > HASHED_CHILDREN,
        }));
        Ok(())
    }
}

/// Insert the goto entries of a fresh map in the order of their home buckets (a counting sort
/// on the bucket index's top bits), so consecutive inserts touch neighbouring memory instead of
/// random places in a table far larger than the caches: several times faster for millions of
/// nodes. Only speed depends on the order (and on the map putting a hash's home bucket at its
/// low bits); fails if two entries share a key (two children of a node with the same token).
fn insert_in_bucket_order(
    a: &mut Automaton,
    entries: impl Iterator<Item = (u64, u32)> + Clone,
    mut sorted: Vec<(u64, u32)>,
) -> std::result::Result<(), String> {
    use std::hash::BuildHasher;
    const GROUP_BITS: u32 = 12;
    let hasher = *a.goto.hasher();
    // The table's bucket count: a power of two of which the capacity is 7/8.
    let buckets = (a.goto.capacity() / 7 * 8).next_power_of_two().max(1);
    let shift = buckets.trailing_zeros().saturating_sub(GROUP_BITS);
    #[allow(clippy::cast_possible_truncation)] // only the low bits are used
    let group = |k: u64| (hasher.hash_one(k) as usize & (buckets - 1)) >> shift;
    let mut start = vec![0usize; (1 << GROUP_BITS) + 1];
    for (k, _) in entries.clone() {
        start[group(k) + 1] += 1;
    }
    for g in 1..start.len() {
        start[g] += start[g - 1];
    }
    // Within the capacity `Columns::new` reserved (one entry per live node): no allocation.
    sorted.resize(start[1 << GROUP_BITS], (0, 0));
    for (k, v) in entries {
        let at = &mut start[group(k)];
        sorted[*at] = (k, v);
        *at += 1;
    }
    for (k, v) in sorted {
        if a.goto.insert(k, v).is_some() {
            return Err(two_children((k >> 32) as u32, k as u32));
        }
    }
    Ok(())
}

fn two_children(slot: u32, token: u32) -> String {
    format!("slot {slot} has two children labelled {token}")
}

/// Write `bytes` to `path` atomically: a temporary file in the same folder, written, synced
/// and renamed over `path`; the temporary file is removed if any step fails.
///
/// # Errors
/// `Io` naming `path` (not the temporary file) if a step fails; `InvalidArgument` if `path`
/// names no file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let Some(name) = path.file_name() else {
        return Err(invalid("path", format!("{} names no file", path.display())));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_error(path, &e))?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, &e))
        .and_then(|()| {
            drop(file);
            fs::rename(&tmp, path).map_err(|e| io_error(path, &e))
        });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
        return written;
    }
    // Make the rename itself durable (best effort: not every platform can sync a folder).
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
