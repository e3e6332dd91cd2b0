//! Unit tests of the draft pool: per-request equivalence with independent (automaton, table)
//! pairs, thread-count independence, atomic failures, and the layouts.

use super::*;
use crate::draft::build_draft_tree;
use crate::edge_cells::EDGE_CELLS;

/// A small deterministic generator (no dependency needed for unit tests).
fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*seed >> 33) as u32
}

/// A code-like stream: chunks of a small alphabet repeated with mutations.
fn stream(seed: &mut u64, len: usize, vocab: u32) -> Vec<i32> {
    let chunks: Vec<Vec<i32>> = (0..6)
        .map(|_| (0..12).map(|_| (lcg(seed) % vocab) as i32).collect())
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let mut c = chunks[lcg(seed) as usize % chunks.len()].clone();
        if lcg(seed) % 3 == 0 {
            let at = lcg(seed) as usize % c.len();
            c[at] = (lcg(seed) % vocab) as i32;
        }
        out.extend(c);
    }
    out.truncate(len);
    out
}

fn options(vocab: usize, scored: bool) -> PoolOptions {
    PoolOptions {
        ngram: 5,
        max_nodes: 60,
        breadth: 3,
        scored,
        ..PoolOptions::new(vocab)
    }
}

/// The state a `RacerDrafter` would hold for one request.
struct Reference {
    automaton: Automaton,
    table: LogitsTable,
}

impl Reference {
    fn new(o: &PoolOptions, prompt: &[i32]) -> Self {
        let mut automaton = Automaton::new(o.ngram, o.max_nodes, o.min_depth).unwrap();
        automaton.new_sequence();
        automaton.extend(prompt).unwrap();
        Self {
            automaton,
            table: LogitsTable::new(o.vocab_size, o.breadth).unwrap(),
        }
    }

    fn propose(
        &mut self,
        o: &PoolOptions,
        next: i32,
        capacity: usize,
        cal: Option<&[f32]>,
    ) -> DraftTree {
        let options = o.draft_options(capacity);
        build_draft_tree(&mut self.automaton, &self.table, next, &[], &options, cal).unwrap()
    }
}

fn topk_rows(seed: &mut u64, n: usize, k: usize, vocab: u32) -> (Vec<i32>, Vec<i32>, Vec<f32>) {
    let tokens = (0..n).map(|_| (lcg(seed) % vocab) as i32).collect();
    let ids = (0..n * k).map(|_| (lcg(seed) % vocab) as i32).collect();
    let probs = (0..n * k).map(|j| 1.0 / (2 + j % k) as f32).collect();
    (tokens, ids, probs)
}

#[test]
fn pool_trees_equal_independent_per_request_pairs() {
    let vocab = 20u32;
    for scored in [false, true] {
        let o = options(vocab as usize, scored);
        let pool = DraftPool::new(o, 1).unwrap();
        let mut refs: Vec<Option<Reference>> = (0..5).map(|_| None).collect();
        let id = |r: usize| -> RequestId {
            if r % 2 == 0 {
                RequestId::Int(r as i64)
            } else {
                RequestId::Str(format!("req-{r}"))
            }
        };
        let mut seed = 11 + u64::from(scored);
        let cal: Vec<f32> = (0..EDGE_CELLS)
            .map(|c| 0.1 + 0.8 * (c % 7) as f32 / 7.0)
            .collect();
        for step in 0..300 {
            let r = lcg(&mut seed) as usize % refs.len();
            match lcg(&mut seed) % 6 {
                0 if refs[r].is_none() => {
                    let prompt = stream(&mut seed, 40, vocab);
                    pool.add(id(r), &prompt).unwrap();
                    refs[r] = Some(Reference::new(&o, &prompt));
                }
                1 if refs[r].is_some() && step % 7 == 0 => {
                    pool.remove(&id(r)).unwrap();
                    refs[r] = None;
                }
                2 if refs[r].is_some() => {
                    let (t, ids, probs) = topk_rows(&mut seed, 4, 3, vocab);
                    let p = (lcg(&mut seed) % 2 == 0).then_some(probs.as_slice());
                    pool.update_topk(&id(r), &t, &ids, 3, p).unwrap();
                    let table = &mut refs[r].as_mut().unwrap().table;
                    table.update_with_probs(&t, &ids, 3, p).unwrap();
                }
                _ => {
                    let live: Vec<usize> = (0..refs.len()).filter(|&i| refs[i].is_some()).collect();
                    if live.is_empty() {
                        continue;
                    }
                    let ids: Vec<RequestId> = live.iter().map(|&i| id(i)).collect();
                    let committed: Vec<Vec<i32>> =
                        live.iter().map(|_| stream(&mut seed, 3, vocab)).collect();
                    let slices: Vec<&[i32]> = committed.iter().map(Vec::as_slice).collect();
                    pool.extend(&ids, &slices).unwrap();
                    let next: Vec<i32> = live
                        .iter()
                        .map(|_| (lcg(&mut seed) % vocab) as i32)
                        .collect();
                    let caps: Vec<usize> = live
                        .iter()
                        .map(|_| 1 + lcg(&mut seed) as usize % 24)
                        .collect();
                    let c = (step % 3 == 0).then_some(cal.as_slice());
                    let batch = pool.propose(&ids, &next, &caps, c).unwrap();
                    for (j, &i) in live.iter().enumerate() {
                        let rf = refs[i].as_mut().unwrap();
                        rf.automaton.extend(&committed[j]).unwrap();
                        let want = rf.propose(&o, next[j], caps[j], c);
                        assert_eq!(batch.trees()[j], want, "step {step}, request {i}");
                    }
                }
            }
        }
        let live = refs.iter().filter(|r| r.is_some()).count();
        assert_eq!(pool.len(), live);
    }
}

fn filled_pool(threads: usize, requests: usize) -> (DraftPool, Vec<RequestId>) {
    let pool = DraftPool::new(options(50, false), threads).unwrap();
    let mut seed = 5;
    let ids: Vec<RequestId> = (0..requests)
        .map(|i| RequestId::Int(i as i64 * 7))
        .collect();
    for id in &ids {
        pool.add(id.clone(), &stream(&mut seed, 300, 50)).unwrap();
        let (t, k, p) = topk_rows(&mut seed, 30, 3, 50);
        pool.update_topk(id, &t, &k, 3, Some(&p)).unwrap();
    }
    (pool, ids)
}

#[test]
fn thread_count_never_changes_a_tree() {
    let n = 4 * PARALLEL_MIN_REQUESTS + 1;
    let mut outputs = Vec::new();
    for threads in [1, 2, 3, 8, 64] {
        let (pool, ids) = filled_pool(threads, n);
        let mut seed = 9;
        let mut all = Vec::new();
        for _ in 0..5 {
            let big: Vec<Vec<i32>> = ids.iter().map(|_| stream(&mut seed, 400, 50)).collect();
            let slices: Vec<&[i32]> = big.iter().map(Vec::as_slice).collect();
            pool.extend(&ids, &slices).unwrap(); // 400 tokens each: parallel
            let next: Vec<i32> = ids.iter().map(|_| (lcg(&mut seed) % 50) as i32).collect();
            // About 8700 units of work in all: up to 4 drafting threads.
            let caps: Vec<usize> = ids
                .iter()
                .map(|_| 1 + lcg(&mut seed) as usize % 400)
                .collect();
            let work = caps.iter().map(|c| c + PROPOSE_REQUEST_UNITS).sum();
            let used = pool.workers(ids.len(), work, PARALLEL_UNITS_PER_THREAD);
            assert!(
                used == threads.min(3) || used == threads.min(4),
                "{used} threads"
            );
            let tokens = slices.iter().map(|t| t.len()).sum();
            assert!(
                pool.workers(ids.len(), tokens, PARALLEL_TOKENS_PER_THREAD)
                    == threads.min(ids.len())
            );
            all.push(pool.propose(&ids, &next, &caps, None).unwrap());
        }
        outputs.push(all);
    }
    for o in &outputs[1..] {
        assert_eq!(o, &outputs[0]);
    }
}

#[test]
fn a_shared_automaton_is_read_by_every_request_as_build_draft_tree_shared_reads_it() {
    let vocab = 50;
    let mut shared = Automaton::new(8, 2_000, 1).unwrap();
    let mut seed = 21;
    shared.extend(&stream(&mut seed, 600, vocab)).unwrap();
    for scored in [false, true] {
        let o = PoolOptions {
            min_depth: 1,
            ..options(vocab as usize, scored)
        };
        for threads in [1, 3] {
            let pool = DraftPool::new(o, threads).unwrap();
            let n = 2 * PARALLEL_MIN_REQUESTS + 1;
            let ids: Vec<RequestId> = (0..n).map(|i| RequestId::Int(i as i64)).collect();
            let mut refs = Vec::new();
            for id in &ids {
                let prompt = stream(&mut seed, 40, vocab);
                pool.add(id.clone(), &prompt).unwrap();
                refs.push(Reference::new(&o, &prompt));
            }
            let next: Vec<i32> = ids
                .iter()
                .map(|_| (lcg(&mut seed) % vocab) as i32)
                .collect();
            let caps = vec![24; n];
            let cal = vec![0.5; EDGE_CELLS];
            let (batch, recency) = pool
                .propose_shared(&ids, &next, &caps, Some(&cal), Some(&shared))
                .unwrap();
            assert_eq!(recency.len(), n);
            for (i, r) in refs.iter_mut().enumerate() {
                let options = o.draft_options(caps[i]);
                let (want, used) = build_draft_tree_shared(
                    &mut r.automaton,
                    Some(&shared),
                    &r.table,
                    next[i],
                    &[],
                    &options,
                    Some(&cal),
                )
                .unwrap();
                assert_eq!(batch.trees()[i], want, "request {i}, scored {scored}");
                assert_eq!(recency[i].is_empty(), used.is_empty());
            }
            // The shared source adds nodes: without it the trees are the plain pool's.
            assert!(recency.iter().any(|r| !r.is_empty()));
            let plain = pool.propose(&ids, &next, &caps, Some(&cal)).unwrap();
            assert_ne!(plain, batch);
            assert_eq!(
                pool.propose_shared(&ids, &next, &caps, Some(&cal), None)
                    .unwrap()
                    .0,
                plain
            );
        }
    }
}

#[test]
fn batches_go_parallel_only_with_enough_work_and_never_past_the_threads_asked() {
    let (pool, _) = filled_pool(3, 1);
    let per = PARALLEL_UNITS_PER_THREAD;
    assert_eq!(pool.workers(PARALLEL_MIN_REQUESTS - 1, 100 * per, per), 1);
    assert_eq!(pool.workers(PARALLEL_MIN_REQUESTS, per - 1, per), 1);
    assert_eq!(pool.workers(PARALLEL_MIN_REQUESTS, 2 * per, per), 2);
    assert_eq!(pool.workers(PARALLEL_MIN_REQUESTS, 100 * per, per), 3);
    assert_eq!(pool.workers(256, usize::MAX, per), 3);
    pool.set_threads(64).unwrap();
    assert_eq!(pool.workers(10, usize::MAX, per), 10);
}

fn snapshot(pool: &DraftPool, ids: &[RequestId]) -> BatchDraft {
    let next: Vec<i32> = (0..ids.len() as i32).collect();
    pool.propose(ids, &next, &vec![32; ids.len()], None)
        .unwrap()
}

#[test]
fn failed_calls_name_the_request_and_change_nothing() {
    let (pool, ids) = filled_pool(2, 10);
    let before = snapshot(&pool, &ids);
    let unknown = RequestId::from("nope");
    let good: Vec<i32> = vec![1, 2, 3];
    let bad: Vec<i32> = vec![1, 50];
    let message = |r: Result<()>| r.unwrap_err().to_string();
    let cases: Vec<(String, &str)> = vec![
        (
            message(pool.extend(
                &[ids[0].clone(), ids[3].clone(), ids[0].clone()],
                &[&good, &good, &good],
            )),
            "ids[2] (0): duplicate request id (also ids[0])",
        ),
        (
            message(pool.extend(&[ids[0].clone(), unknown.clone()], &[&good, &good])),
            "ids[1] ('nope'): unknown request id",
        ),
        (
            message(pool.extend(&[ids[0].clone(), ids[1].clone()], &[&good, &bad])),
            "tokens[1] (7): token 50 is outside 0..50",
        ),
        (message(pool.extend(&[], &[])), "ids: the batch is empty"),
        (
            message(pool.propose(&ids[..2], &[1, -1], &[4, 4], None).map(drop)),
            "last_tokens[1] (7): token -1 is outside 0..50",
        ),
        (
            message(pool.propose(&ids[..2], &[1, 1], &[4, 0], None).map(drop)),
            "capacity[1] (7): must be in 1..=1048576, got 0",
        ),
        (
            message(
                pool.propose(&ids[..2], &[1, 1], &[4, 4], Some(&[0.5]))
                    .map(drop),
            ),
            "calibration: needs",
        ),
        (
            message(pool.update_topk(&ids[1], &[1, 2], &[1, 2, 3, 4, 5, 99], 3, None)),
            "topk_ids (7): token 99 is outside 0..50",
        ),
        (
            message(pool.update_topk(&ids[1], &[1], &[1, 2], 2, None)),
            "topk_ids (7): expected 3 columns, got 2",
        ),
        (
            message(pool.add(ids[4].clone(), &[1])),
            "id (28): already in the pool",
        ),
        (
            message(pool.add("x".into(), &[1, 77])),
            "prompt_ids ('x'): token 77",
        ),
        (
            message(pool.remove(&unknown)),
            "id ('nope'): unknown request id",
        ),
    ];
    for (got, want) in cases {
        assert!(got.starts_with(want), "{got:?} should start with {want:?}");
    }
    assert_eq!(pool.len(), 10);
    assert_eq!(snapshot(&pool, &ids), before);
}

#[test]
fn ids_follow_insertion_order_and_clear_forgets_everything() {
    let pool = DraftPool::new(options(10, false), 1).unwrap();
    for id in [RequestId::from("b"), 3.into(), "a".into(), (-1).into()] {
        pool.add(id, &[1, 2, 1, 2]).unwrap();
    }
    pool.remove(&3.into()).unwrap();
    pool.add(3.into(), &[]).unwrap();
    assert_eq!(
        pool.ids().unwrap(),
        vec!["b".into(), "a".into(), (-1).into(), 3.into()]
    );
    assert!(pool.contains(&"a".into()) && !pool.contains(&"c".into()));
    assert!(pool.memory_bytes() > 4 * 10 * 3 * 8);
    pool.clear();
    assert!(pool.is_empty() && pool.ids().unwrap().is_empty());
    pool.add("b".into(), &[]).unwrap();
}

#[test]
fn options_are_checked_under_the_pool_names() {
    let bad = |o: PoolOptions| DraftPool::new(o, 1).unwrap_err().to_string();
    let base = PoolOptions::new(100);
    assert!(bad(PoolOptions { breadth: 0, ..base }).starts_with("breadth:"));
    assert!(
        bad(PoolOptions {
            max_nodes: 10,
            ..base
        })
        .starts_with("max_nodes:")
    );
    assert!(bad(PoolOptions { ngram: 1, ..base }).starts_with("ngram:"));
    assert!(
        bad(PoolOptions {
            min_depth: 11,
            ..base
        })
        .starts_with("min_depth:")
    );
    assert!(
        bad(PoolOptions {
            vocab_size: 0,
            ..base
        })
        .starts_with("vocab_size:")
    );
    assert!(
        bad(PoolOptions {
            min_score: f32::NAN,
            ..base
        })
        .starts_with("min_score:")
    );
    let off = PoolOptions {
        use_retrieval: false,
        use_logits: false,
        ..base
    };
    assert!(bad(off).contains("cannot both be False"));
    assert!(
        DraftPool::new(base, 0)
            .unwrap_err()
            .to_string()
            .starts_with("threads:")
    );
    let pool = DraftPool::new(base, 1).unwrap();
    assert!(pool.set_threads(MAX_THREADS + 1).is_err());
    pool.set_threads(4).unwrap();
    assert_eq!(pool.threads(), 4);
}

#[test]
fn one_source_pools_draft_like_the_ablations() {
    let mut seed = 3;
    let prompt = stream(&mut seed, 200, 30);
    let (t, k, _) = topk_rows(&mut seed, 30, 3, 30);
    for (use_retrieval, use_logits) in [(true, false), (false, true)] {
        let o = PoolOptions {
            use_retrieval,
            use_logits,
            ..options(30, false)
        };
        let pool = DraftPool::new(o, 1).unwrap();
        pool.add(1.into(), &prompt).unwrap();
        pool.update_topk(&1.into(), &t, &k, 3, None).unwrap();
        let mut a = Automaton::new(o.ngram, o.max_nodes, o.min_depth).unwrap();
        if use_retrieval {
            a.extend(&prompt).unwrap();
        }
        let mut table = LogitsTable::new(30, 3).unwrap();
        if use_logits {
            table.update(&t, &k, 3).unwrap();
        }
        for next in 0..30 {
            let got = pool.propose(&[1.into()], &[next], &[20], None).unwrap();
            let want =
                build_draft_tree(&mut a, &table, next, &[], &o.draft_options(20), None).unwrap();
            assert_eq!(got.trees()[0], want);
        }
    }
}

#[test]
fn ragged_lengths_must_add_up() {
    let ids: Vec<RequestId> = vec!["a".into(), "b".into()];
    let t = [1, 2, 3];
    let parts = split_ragged(&t, &[1, 2], &ids).unwrap();
    assert_eq!(parts, vec![&[1][..], &[2, 3][..]]);
    let err = |l: &[i64]| split_ragged(&t, l, &ids).unwrap_err().to_string();
    assert!(err(&[1, 1]).starts_with("lengths: add up to 2, but 3"));
    assert!(err(&[2, 2]).starts_with("lengths[1] ('b'): the lengths so far exceed"));
    assert!(err(&[-1, 4]).starts_with("lengths[0] ('a'): must be >= 0"));
    assert!(err(&[3]).starts_with("lengths: expected one length per id (2), got 1"));
}

fn tree(tokens: &[i32], parents: &[i32]) -> DraftTree {
    DraftTree::from_parents(tokens.to_vec(), parents.to_vec()).unwrap()
}

#[test]
fn sglang_layout_cuts_or_pads_and_masks_ancestors() {
    // 9 -> {1 -> {3, 4 -> 6}, 2 -> 5}
    let t = tree(&[9, 1, 2, 3, 4, 5, 6], &[-1, 0, 0, 1, 1, 2, 4]);
    let batch = BatchDraft::new(vec![t.clone(), tree(&[4], &[-1])]);
    let (tokens, mask) = batch.sglang(4).unwrap();
    assert_eq!(tokens, vec![9, 1, 2, 3, 4, 0, 0, 0]);
    let rows = |b: usize| -> Vec<Vec<usize>> {
        (0..4)
            .map(|i| (0..4).filter(|&j| mask[(b * 4 + i) * 4 + j]).collect())
            .collect()
    };
    assert_eq!(
        rows(0),
        vec![vec![0], vec![0, 1], vec![0, 2], vec![0, 1, 3]]
    );
    assert_eq!(rows(1), vec![vec![0], vec![0, 1], vec![0, 2], vec![0, 3]]);
    let (tokens, mask) = batch.sglang(7).unwrap();
    assert_eq!(
        &tokens[..7],
        t.tokens().iter().map(|&x| i64::from(x)).collect::<Vec<_>>()
    );
    assert_eq!(&mask[..49], t.attention_mask().unwrap().as_slice());
    assert!(batch.sglang(0).is_err());
    assert!(batch.sglang(1 << 14).is_err());
}

#[test]
fn chains_follow_the_deepest_leaf_with_the_smallest_index() {
    let t = tree(&[9, 1, 2, 3, 4, 5, 6, 7], &[-1, 0, 0, 1, 2, 2, 4, 5]);
    let batch = BatchDraft::new(vec![t, tree(&[4], &[-1]), tree(&[4, 8], &[-1, 0])]);
    assert_eq!(
        batch.chains(10).unwrap(),
        vec![vec![2, 4, 6], vec![], vec![8]]
    );
    assert_eq!(batch.chains(2).unwrap(), vec![vec![2, 4], vec![], vec![8]]);
    assert_eq!(batch.chains(0).unwrap(), vec![Vec::<i32>::new(); 3]);
    // The same chains as a table, with their nodes' cells, -1 past each end.
    let (tokens, cells) = batch.chain_table(4).unwrap();
    assert_eq!(tokens, [2, 4, 6, -1, -1, -1, -1, -1, 8, -1, -1, -1]);
    let c = |b: usize, u: usize| batch.trees()[b].cells()[u];
    let expected = [
        c(0, 2),
        c(0, 4),
        c(0, 6),
        -1,
        -1,
        -1,
        -1,
        -1,
        c(2, 1),
        -1,
        -1,
        -1,
    ];
    assert_eq!(cells, expected);
    assert!(batch.chain_table(usize::MAX).is_err());
    assert_eq!(batch.offsets(), &[0, 8, 9, 11]);
    assert_eq!(batch.parents().unwrap()[8..], [-1, -1, 0]);
}

#[test]
fn concurrent_batches_over_overlapping_ids_finish() {
    let (pool, ids) = filled_pool(2, 16);
    let reversed: Vec<RequestId> = ids.iter().rev().cloned().collect();
    std::thread::scope(|s| {
        for order in [&ids, &reversed, &ids, &reversed] {
            let pool = &pool;
            s.spawn(move || {
                for round in 0..20 {
                    let next: Vec<i32> =
                        (0..order.len() as i32).map(|i| (i + round) % 50).collect();
                    let committed: Vec<&[i32]> = order.iter().map(|_| &[1, 2, 3][..]).collect();
                    pool.extend(order, &committed).unwrap();
                    assert_eq!(
                        pool.propose(order, &next, &vec![16; order.len()], None)
                            .unwrap()
                            .len(),
                        16
                    );
                }
            });
        }
        s.spawn(|| {
            for i in 0..20 {
                let id = RequestId::Str(format!("extra-{i}"));
                pool.add(id.clone(), &[1, 2, 3]).unwrap();
                pool.remove(&id).unwrap();
            }
        });
    });
    assert_eq!(pool.len(), 16);
}

#[test]
fn request_ids_display_like_python_reprs() {
    assert_eq!(RequestId::Int(-3).to_string(), "-3");
    assert_eq!(RequestId::from("req-7").to_string(), "'req-7'");
    let long = RequestId::Str("x".repeat(100));
    assert_eq!(
        long.to_string(),
        format!("'{}...'", "x".repeat(MAX_QUOTED_ID))
    );
}

#[test]
fn ten_thousand_requests_cost_what_they_store() {
    let pool = DraftPool::new(PoolOptions::new(152_000), 1).unwrap();
    let base = pool.memory_bytes();
    for i in 0..10_000 {
        pool.add(RequestId::Int(i), &[]).unwrap();
    }
    let empty = (pool.memory_bytes() - base) / 10_000;
    assert!(empty < 16 * 1024, "an empty request holds {empty} bytes");
    // Writing rows and indexing a prompt grows a request by about what it stores.
    let mut seed = 9;
    let prompt = stream(&mut seed, 200, 1000);
    let before = pool.memory_bytes();
    for i in 0..100 {
        pool.remove(&RequestId::Int(i)).unwrap();
        pool.add(RequestId::Int(i), &prompt).unwrap();
    }
    let stored = (pool.memory_bytes() - before) / 100;
    let a = {
        let mut a = Automaton::new(10, 10_000, 2).unwrap();
        a.extend(&prompt).unwrap();
        a.memory_bytes()
    };
    assert!(
        stored + empty >= a && stored < a + 16 * 1024,
        "{stored} vs {a}"
    );
}

#[test]
fn a_shared_continuation_beyond_the_vocabulary_is_refused_naming_the_request() {
    let vocab = 20;
    let mut shared = Automaton::new(5, 200, 1).unwrap();
    shared.extend(&[3, 4, 5, 6, 7, 8, 25, 9]).unwrap();
    for scored in [false, true] {
        let pool = DraftPool::new(options(vocab, scored), 1).unwrap();
        let (a, b) = (RequestId::Int(1), RequestId::Int(2));
        pool.add(a.clone(), &[3, 4, 5, 6]).unwrap();
        pool.add(b.clone(), &[1, 2]).unwrap();
        let err = pool
            .propose_shared(&[b.clone(), a], &[2, 7], &[8, 8], None, Some(&shared))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("shared (1): drafted token 25 is outside the vocabulary 0..20"),
            "{text}"
        );
        // Without the foreign continuation every tree stays inside the vocabulary.
        let (ok, _) = pool
            .propose_shared(&[b], &[2], &[8], None, Some(&shared))
            .unwrap();
        assert!(ok.trees()[0].tokens().iter().all(|&t| (t as usize) < vocab));
    }
}

#[test]
fn batched_copy_logit_writes_equal_one_call_per_request() {
    for (scored, with_probs) in [(false, false), (true, true)] {
        let o = options(50, scored);
        let (one, many) = (DraftPool::new(o, 1).unwrap(), DraftPool::new(o, 1).unwrap());
        let ids: Vec<RequestId> = vec![3.into(), "b".into(), 11.into()];
        let mut seed = 17;
        for id in &ids {
            let prompt = stream(&mut seed, 120, 50);
            one.add(id.clone(), &prompt).unwrap();
            many.add(id.clone(), &prompt).unwrap();
        }
        for step in 0..6 {
            // Ragged rows per request, one of them none; tokens repeat, so the last write wins.
            let lengths: Vec<i64> = (0..ids.len()).map(|i| ((step + i) % 4) as i64).collect();
            let total = lengths.iter().sum::<i64>() as usize;
            let (t, k, p) = topk_rows(&mut seed, total, 3, 12);
            let probs = with_probs.then_some(p.as_slice());
            let mut start = 0;
            for (id, &n) in ids.iter().zip(&lengths) {
                let end = start + n as usize;
                let rows = probs.map(|p| &p[start * 3..end * 3]);
                one.update_topk(id, &t[start..end], &k[start * 3..end * 3], 3, rows)
                    .unwrap();
                start = end;
            }
            many.update_topk_many(&ids, &t, &k, 3, probs, &lengths)
                .unwrap();
            let next: Vec<i32> = ids.iter().map(|_| (lcg(&mut seed) % 12) as i32).collect();
            let caps = vec![16; ids.len()];
            assert_eq!(
                one.propose(&ids, &next, &caps, None).unwrap(),
                many.propose(&ids, &next, &caps, None).unwrap(),
                "step {step}"
            );
        }
    }
}

#[test]
fn a_bad_batched_copy_logit_write_changes_no_request() {
    let (pool, ids) = filled_pool(1, 3);
    let next = vec![1, 2, 3];
    let caps = vec![16; 3];
    let before = pool.propose(&ids, &next, &caps, None).unwrap();
    let message = |r: Result<()>| r.unwrap_err().to_string();
    let t = [1, 2, 3];
    let k = [4, 5, 6, 7, 8, 9, 10, 11, 12];
    for (result, expected) in [
        (
            message(pool.update_topk_many(
                &ids,
                &t,
                &[4, 5, 6, 7, 8, 9, 10, 11, 99],
                3,
                None,
                &[1, 1, 1],
            )),
            "topk_ids (14): token 99 is outside 0..50",
        ),
        (
            message(pool.update_topk_many(&ids, &t, &k, 3, None, &[1, 1])),
            "lengths: expected one length per id (3), got 2",
        ),
        (
            message(pool.update_topk_many(&ids, &t, &k, 3, None, &[1, 1, 2])),
            "lengths[2] (14): the lengths so far exceed the 3 tokens given",
        ),
        (
            message(pool.update_topk_many(&ids, &t, &k, 3, Some(&[0.5; 8]), &[1, 1, 1])),
            "topk_probs: expected 9 probabilities",
        ),
        (
            message(pool.update_topk_many(&ids, &t, &k[..6], 2, None, &[1, 1, 1])),
            "topk_ids: expected 3 columns, got 2",
        ),
        (
            message(pool.update_topk_many(
                &[ids[0].clone(), ids[0].clone()],
                &t[..2],
                &k[..6],
                3,
                None,
                &[1, 1],
            )),
            "ids[1] (0): duplicate request id (also ids[0])",
        ),
    ] {
        assert!(result.contains(expected), "{result:?} lacks {expected:?}");
    }
    assert_eq!(pool.propose(&ids, &next, &caps, None).unwrap(), before);
}
