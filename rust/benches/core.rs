//! The core's per-call costs on a code stream, decode-like: every step commits 3 tokens
//! (`Automaton::extend`) and drafts one 16-node tree (`build_draft_tree`, retrieval and
//! copy-logit rows), the workload `benches/bench_suffix_core.py` puts beside SuffixDecoding.
//!
//! The stream: the texts of data/code_completion.jsonl (the Python side's stream, without its
//! tokenizer), split into identifiers, numbers, runs of spaces and single other characters,
//! each distinct piece one token id (in order of first use); the first 60K tokens.
//! Deterministic.
//!
//! Run: `cargo bench --no-default-features --bench core` (criterion; `-- extend` for one).
//! `cargo bench --no-default-features --bench core -- --once [setup|extend|steps]` runs the
//! stream once without criterion, for `valgrind --tool=callgrind` instruction counts (see
//! `once`; `benches/callgrind_core.sh` runs the three and prints instructions per call).

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use racer_rs::{Automaton, DraftOptions, LogitsTable, build_draft_tree};

const STREAM_TOKENS: usize = 60_000;
const PROMPT: usize = 512;
const STEP: usize = 3;
const CAPACITY: usize = 16;
const TOP_K: usize = 8;

/// The first `STREAM_TOKENS` tokens of data/code_completion.jsonl's texts (see the module
/// comment), cycled if short.
fn code_stream() -> Vec<i32> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/code_completion.jsonl");
    let text = std::fs::read_to_string(&path).expect("read data/code_completion.jsonl");
    let texts: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            row["turns"][0].as_str().expect("a text").to_owned()
        })
        .collect();
    let same_class = |a: char, b: char| {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        (word(a) && word(b)) || (a == ' ' && b == ' ')
    };
    let mut ids: HashMap<String, i32> = HashMap::new();
    let mut stream = Vec::with_capacity(STREAM_TOKENS);
    loop {
        for text in &texts {
            let mut chars = text.chars().peekable();
            while let Some(c) = chars.next() {
                let mut piece = String::from(c);
                while let Some(&d) = chars.peek() {
                    if !same_class(c, d) {
                        break;
                    }
                    piece.push(d);
                    chars.next();
                }
                let next = ids.len() as i32;
                stream.push(*ids.entry(piece).or_insert(next));
                if stream.len() == STREAM_TOKENS {
                    return stream;
                }
            }
        }
    }
}

/// Each token's most frequent followers as its copy-logit row (a stand-in for the target's
/// top-k that needs no model), with a rank prior for probabilities.
fn bigram_table(stream: &[i32]) -> LogitsTable {
    let vocab = *stream.iter().max().expect("a stream") as usize + 1;
    let mut followers: HashMap<i32, HashMap<i32, u32>> = HashMap::new();
    for w in stream.windows(2) {
        *followers.entry(w[0]).or_default().entry(w[1]).or_default() += 1;
    }
    let mut tokens: Vec<i32> = followers.keys().copied().collect();
    tokens.sort_unstable();
    let mut rows = Vec::with_capacity(tokens.len() * TOP_K);
    for t in &tokens {
        let mut top: Vec<(u32, i32)> = followers[t].iter().map(|(&b, &c)| (c, b)).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        rows.extend((0..TOP_K).map(|j| top[j.min(top.len() - 1)].1));
    }
    let mut table = LogitsTable::new(vocab, TOP_K).expect("a table");
    table.update(&tokens, &rows, TOP_K).expect("rows");
    table
}

/// A request after its prompt, with the cursor at the first step.
struct Run<'a> {
    stream: &'a [i32],
    automaton: Automaton,
    at: usize,
}

impl<'a> Run<'a> {
    fn new(stream: &'a [i32]) -> Self {
        let mut automaton = Automaton::new(10, 10_000, 2).expect("an automaton");
        automaton.extend(&stream[..PROMPT]).expect("the prompt");
        Self {
            stream,
            automaton,
            at: PROMPT,
        }
    }

    /// Commit the next step's tokens (starting over after the stream's end).
    fn extend(&mut self) {
        if self.at + STEP + 1 >= self.stream.len() {
            *self = Self::new(self.stream);
        }
        let chunk = &self.stream[self.at..self.at + STEP];
        self.automaton.extend(black_box(chunk)).expect("extend");
        self.at += STEP;
    }

    /// Draft from the current context, rooted at the token that follows it.
    fn draft(&mut self, table: &LogitsTable, options: &DraftOptions) -> usize {
        let root = self.stream[self.at];
        let tree =
            build_draft_tree(&mut self.automaton, table, root, &[], options, None).expect("a tree");
        black_box(tree).len()
    }
}

fn options(use_logits: bool) -> DraftOptions {
    DraftOptions {
        capacity: CAPACITY,
        use_logits,
        ..DraftOptions::default()
    }
}

/// Time `iters` steps, counting only the draft (`draft`) or only the extend.
fn timed_steps(
    run: &mut Run<'_>,
    table: &LogitsTable,
    iters: u64,
    draft: Option<&DraftOptions>,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        match draft {
            Some(options) => {
                run.extend();
                let start = Instant::now();
                run.draft(table, options);
                total += start.elapsed();
            }
            None => {
                let start = Instant::now();
                run.extend();
                total += start.elapsed();
                run.draft(table, &options(true));
            }
        }
    }
    total
}

/// One pass over the stream without criterion, for instruction counts: `setup` builds the
/// stream, the table and the request only; `extend` also commits every step; `steps` also
/// drafts after each. Differences between the three, divided by the steps, give each call's
/// instructions.
fn once(stream: &[i32], table: &LogitsTable, what: &str) {
    let mut run = Run::new(stream);
    let (mut steps, mut nodes) = (0usize, 0usize);
    // A digest of every tree and of the final index, so two builds can be shown to draft the
    // very same trees (FNV-1a).
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |x: i64| {
        digest = (digest ^ x as u64).wrapping_mul(0x100_0000_01b3);
    };
    while what != "setup" && run.at + STEP + 1 < stream.len() {
        run.extend();
        if what == "steps" {
            let root = run.stream[run.at];
            let tree = build_draft_tree(&mut run.automaton, table, root, &[], &options(true), None)
                .expect("a tree");
            nodes += tree.len() - 1;
            tree.tokens().iter().for_each(|&t| mix(i64::from(t)));
            tree.parents().iter().for_each(|&p| mix(i64::from(p)));
        }
        steps += 1;
    }
    run.automaton
        .to_bytes()
        .iter()
        .for_each(|&b| mix(i64::from(b)));
    println!(
        "{what}: {steps} steps of {STEP} tokens, {:.2} drafted nodes per tree, digest {digest:016x}",
        nodes as f64 / steps.max(1) as f64
    );
}

fn main() {
    let stream = code_stream();
    let table = bigram_table(&stream);
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--once") {
        once(
            &stream,
            &table,
            args.get(at + 1).map_or("steps", String::as_str),
        );
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("code_stream_60k");
    group.throughput(Throughput::Elements(STEP as u64));
    let mut run = Run::new(&stream);
    group.bench_function("extend_3_tokens", |b| {
        b.iter_custom(|iters| timed_steps(&mut run, &table, iters, None));
    });
    group.throughput(Throughput::Elements(1));
    for (name, use_logits) in [("draft_16_retrieval", false), ("draft_16_full", true)] {
        let mut run = Run::new(&stream);
        let o = options(use_logits);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| timed_steps(&mut run, &table, iters, Some(&o)));
        });
    }
    group.finish();
    c.final_summary();
}
