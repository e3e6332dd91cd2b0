//! Unit tests of the automaton against brute force.

use super::*;

/// A small deterministic generator (no dependency needed for unit tests).
fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (*seed >> 33) as u32
}

fn brute_count(seqs: &[Vec<i32>], pattern: &[i32]) -> u64 {
    seqs.iter()
        .map(|s| s.windows(pattern.len()).filter(|w| *w == pattern).count() as u64)
        .sum()
}

#[test]
fn counts_match_brute_force_without_eviction() {
    let mut seed = 7;
    let mut a = Automaton::new(4, 100_000, 2).unwrap();
    let mut seqs = vec![];
    for _ in 0..3 {
        let s: Vec<i32> = (0..200).map(|_| (lcg(&mut seed) % 5) as i32).collect();
        a.extend(&s[..50]).unwrap();
        a.extend(&s[50..]).unwrap();
        a.check_integrity().unwrap();
        seqs.push(s);
        a.new_sequence();
    }
    for len in 1..=4 {
        for p in 0..5i32.pow(len) {
            let pattern: Vec<i32> = (0..len).map(|i| (p / 5i32.pow(i)) % 5).collect();
            assert_eq!(
                a.count(&pattern).unwrap(),
                brute_count(&seqs, &pattern),
                "{pattern:?}"
            );
        }
    }
}

#[test]
fn eviction_keeps_invariants_and_the_newest_window() {
    let mut seed = 11;
    let mut a = Automaton::new(5, 15, 2).unwrap();
    let mut recent = vec![];
    for step in 0..3000 {
        let t = (lcg(&mut seed) % 7) as i32;
        a.extend(&[t]).unwrap();
        recent.push(t);
        assert!(a.len() <= a.capacity());
        if step % 97 == 0 {
            a.check_integrity().unwrap();
            let tree = a.retrieve((lcg(&mut seed) % 7) as i32, 8).unwrap();
            assert!(tree.len() <= 8);
        }
        let tail = &recent[recent.len().saturating_sub(5)..];
        for start in 0..tail.len() {
            assert!(a.count(&tail[start..]).unwrap() >= 1);
        }
    }
    a.check_integrity().unwrap();
}

#[test]
fn retrieve_returns_real_continuations_by_frequency() {
    let mut a = Automaton::new(4, 1000, 2).unwrap();
    // "1 2 3" twice, "1 2 4" once; context ends with 1, next token 2.
    a.extend(&[1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1]).unwrap();
    let t = a.retrieve(2, 64).unwrap();
    assert_eq!(t.tokens()[0], 2);
    assert_eq!(&t.tokens()[1..3], &[3, 4]);
    let t = a.retrieve(2, 2).unwrap();
    assert_eq!(t.tokens(), &[2, 3]);
    // Nothing followed "1 7": only the root.
    assert_eq!(a.retrieve(7, 64).unwrap().len(), 1);
    a.check_integrity().unwrap();
}

#[test]
fn rejects_bad_arguments() {
    assert!(Automaton::new(1, 100, 1).is_err());
    assert!(Automaton::new(10, 54, 2).is_err());
    assert!(Automaton::new(10, 55, 2).is_ok());
    assert!(Automaton::new(4, 100, 0).is_err());
    let mut a = Automaton::new(3, 100, 2).unwrap();
    assert!(a.extend(&[1, -1]).is_err());
    assert_eq!(a.len(), 0);
    assert!(a.count(&[]).is_err());
    assert!(a.count(&[1, 2, 3, 4]).is_err());
    assert!(a.retrieve(1, 0).is_err());
}

/// A stream with repeats, several sequences and, under a small budget, many evictions.
fn workload(seed: u64, len: usize, alphabet: u32) -> Vec<Vec<i32>> {
    let mut seed = seed;
    let mut seqs = vec![vec![]];
    for _ in 0..len {
        let r = lcg(&mut seed);
        if r % 97 == 0 {
            seqs.push(vec![]);
        }
        seqs.last_mut().unwrap().push((r % alphabet) as i32);
    }
    seqs
}

fn feed(a: &mut Automaton, seqs: &[Vec<i32>]) {
    for (i, s) in seqs.iter().enumerate() {
        if i > 0 {
            a.new_sequence();
        }
        for chunk in s.chunks(5) {
            a.extend(chunk).unwrap();
        }
    }
}

#[test]
fn images_round_trip_byte_for_byte_and_behave_the_same_afterwards() {
    for (seed, ngram, capacity) in [(1, 4, 10), (2, 5, 40), (3, 3, 1000), (4, 6, 21), (5, 2, 3)] {
        let mut a = Automaton::new(ngram, capacity, 2.min(ngram)).unwrap();
        feed(&mut a, &workload(seed, 600, 5));
        let mut b = Automaton::from_bytes(&a.to_bytes()).unwrap();
        b.check_integrity().unwrap();
        assert_eq!(b.to_bytes(), a.to_bytes());
        assert_eq!((b.len(), b.match_length()), (a.len(), a.match_length()));
        // Identical images after every further step: same counts, same recency, same slots, so
        // the same nodes were evicted in the same order.
        let mut s = seed + 100;
        for step in 0..300 {
            let t = (lcg(&mut s) % 5) as i32;
            a.extend(&[t]).unwrap();
            b.extend(&[t]).unwrap();
            let next = (lcg(&mut s) % 5) as i32;
            assert_eq!(a.retrieve(next, 12).unwrap(), b.retrieve(next, 12).unwrap());
            if step % 50 == 49 {
                a.new_sequence();
                b.new_sequence();
            }
            assert_eq!(a.to_bytes(), b.to_bytes(), "step {step}");
        }
        for p in [[0, 1], [1, 1], [2, 3]] {
            assert_eq!(a.count(&p).unwrap(), b.count(&p).unwrap());
        }
        b.check_integrity().unwrap();
    }
}

#[test]
fn empty_and_cleared_automata_round_trip() {
    let a = Automaton::new(3, 6, 1).unwrap();
    let b = Automaton::from_bytes(&a.to_bytes()).unwrap();
    assert_eq!(b.to_bytes(), a.to_bytes());
    assert_eq!((b.ngram(), b.capacity(), b.min_depth()), (3, 6, 1));
    let mut c = Automaton::new(3, 6, 1).unwrap();
    c.extend(&[1, 2, 3, 4, 5]).unwrap();
    c.clear();
    assert_eq!(
        Automaton::from_bytes(&c.to_bytes()).unwrap().to_bytes(),
        c.to_bytes()
    );
}

fn corrupt_message(data: &[u8]) -> String {
    match Automaton::from_bytes(data) {
        Err(Error::CorruptFile { source_name, msg }) => {
            assert_eq!(source_name, "data");
            msg
        }
        Err(e) => panic!("expected CorruptFile, got {e:?}"),
        Ok(_) => panic!("a damaged image loaded"),
    }
}

#[test]
fn every_truncation_and_every_flipped_byte_is_reported() {
    let mut a = Automaton::new(4, 12, 2).unwrap();
    feed(&mut a, &workload(9, 200, 4));
    let image = a.to_bytes();
    for cut in 0..image.len() {
        corrupt_message(&image[..cut]);
    }
    let mut longer = image.clone();
    longer.push(0);
    assert!(corrupt_message(&longer).contains("trailing"));
    for i in 0..image.len() {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut d = image.clone();
            d[i] ^= flip;
            corrupt_message(&d);
        }
    }
    assert!(corrupt_message(&[]).contains("empty"));
    assert!(corrupt_message(&vec![0; image.len()]).contains("not an automaton image"));
    assert!(corrupt_message(b"RACER").contains("truncated"));
    let mut future = image.clone();
    future[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert!(corrupt_message(&future).contains("version 2"));
    assert!(corrupt_message(&image[..image.len() - 1]).contains("truncated"));
}

/// Re-seal an edited image with a valid checksum (a buggy writer rather than a damaged file).
fn reseal(mut d: Vec<u8>) -> Vec<u8> {
    let n = d.len() - 4;
    let c = crate::crc32::crc32(&d[..n]);
    d[n..].copy_from_slice(&c.to_le_bytes());
    d
}

#[test]
fn images_with_a_valid_checksum_but_bad_contents_are_rejected_or_sound() {
    let mut a = Automaton::new(4, 16, 2).unwrap();
    feed(&mut a, &workload(21, 300, 4));
    let image = a.to_bytes();
    let mut rejected = 0;
    for i in 12..image.len() - 4 {
        for flip in [0x01u8, 0x10, 0xFF] {
            let mut d = image.clone();
            d[i] ^= flip;
            match Automaton::from_bytes(&reseal(d)) {
                Err(Error::CorruptFile { .. }) => rejected += 1,
                Err(e) => panic!("byte {i}: expected CorruptFile, got {e:?}"),
                // Some edits describe another valid automaton (a later last use, a smaller
                // count); whatever loads must satisfy every invariant.
                Ok(b) => b.check_integrity().unwrap(),
            }
        }
    }
    assert!(rejected > 0);
    // Hand-made structural damage, each caught by its own check.
    let header =
        |d: &mut Vec<u8>, at: usize, v: u32| d[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let mut d = image.clone();
    header(&mut d, 12, 1);
    assert!(corrupt_message(&reseal(d)).contains("flags"));
    let mut d = image.clone();
    header(&mut d, 16, 1);
    assert!(corrupt_message(&reseal(d)).contains("configuration"));
    let mut d = image.clone();
    header(
        &mut d,
        40,
        u32::from_le_bytes(image[40..44].try_into().unwrap()) + 1,
    );
    assert!(corrupt_message(&reseal(d)).contains("slots"));
}

#[test]
fn huge_counts_in_a_header_do_not_allocate() {
    let a = Automaton::new(4, 100, 2).unwrap();
    let mut d = a.to_bytes();
    for at in [40, 44, 48, 52] {
        let mut e = d.clone();
        e[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let expected = if at == 40 {
            "slots"
        } else {
            "header describes"
        };
        assert!(
            corrupt_message(&reseal(e)).contains(expected),
            "offset {at}"
        );
    }
    d[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(corrupt_message(&reseal(d)).contains("configuration"));
}

#[test]
fn load_checks_the_header_against_the_file_before_reading_it() {
    let dir = std::env::temp_dir().join(format!("racer-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let load_error = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        match Automaton::load(&path) {
            Err(Error::CorruptFile { msg, .. }) => msg,
            other => panic!("{name}: {other:?}"),
        }
    };
    let mut a = Automaton::new(4, 100, 2).unwrap();
    a.extend(&[1, 2, 3, 1, 2]).unwrap();
    let image = a.to_bytes();
    // A header that claims 2**32 - 2 nodes in a file of a few bytes: refused from the file's
    // length, before anything is allocated for the 107 GB it describes.
    let mut huge = image[..56].to_vec(); // the header
    huge[40..44].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
    huge[44..48].copy_from_slice(&(u32::MAX - 2).to_le_bytes());
    huge[48..56].fill(0);
    huge.extend_from_slice(&[0; 4]);
    let msg = load_error("huge", &huge);
    assert!(
        msg.contains("is truncated") && msg.contains("107374182"),
        "{msg}"
    );
    let mut longer = image.clone();
    longer.push(0);
    assert!(load_error("longer", &longer).contains("has trailing bytes"));
    assert!(load_error("short", &image[..30]).contains("truncated"));
    assert!(load_error("empty", &[]).contains("is empty"));
    std::fs::write(dir.join("good"), &image).unwrap();
    assert_eq!(
        Automaton::load(&dir.join("good")).unwrap().to_bytes(),
        image
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // A file that never ends is read no further than a header.
    #[cfg(target_os = "linux")]
    match Automaton::load(std::path::Path::new("/dev/zero")) {
        Err(Error::CorruptFile { msg, .. }) => assert!(msg.contains("not an automaton image")),
        other => panic!("/dev/zero: {other:?}"),
    }
}

#[test]
fn the_linear_check_agrees_with_brute_force_and_catches_a_wrong_link() {
    let mut a = Automaton::new(5, 30, 2).unwrap();
    feed(&mut a, &workload(33, 500, 4));
    a.check_integrity().unwrap();
    a.check_integrity_linear().unwrap();
    let v = (1..a.nodes.len())
        .find(|&v| a.nodes[v].alive && a.nodes[v].depth >= 2)
        .unwrap();
    a.nodes[v].fail = ROOT;
    assert!(a.check_integrity().is_err());
    assert!(a.check_integrity_linear().is_err());
}

#[test]
fn save_is_atomic_and_load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("racer-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("index.racer");
    let mut a = Automaton::new(4, 50, 2).unwrap();
    feed(&mut a, &workload(5, 300, 5));
    a.save(&path).unwrap();
    assert_eq!(Automaton::load(&path).unwrap().to_bytes(), a.to_bytes());
    a.extend(&[1, 2, 3]).unwrap();
    a.save(&path).unwrap(); // replaces the old image
    assert_eq!(Automaton::load(&path).unwrap().to_bytes(), a.to_bytes());
    // A failed save leaves no temporary file behind and the old image intact.
    let blocked = dir.join("sub");
    std::fs::create_dir_all(blocked.join("child")).unwrap();
    assert!(matches!(a.save(&blocked), Err(Error::Io { .. })));
    let missing = dir.join("no-such-folder").join("x.racer");
    assert!(matches!(
        a.save(&missing),
        Err(Error::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        })
    ));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    std::fs::write(dir.join("bad"), b"RACERIDX\x01\0\0\0").unwrap();
    match Automaton::load(&dir.join("bad")) {
        Err(Error::CorruptFile { source_name, .. }) => assert!(source_name.ends_with("bad")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Automaton::load(&dir.join("absent")),
        Err(Error::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stateless_borders_equal_the_match_state_borders() {
    for (seed, ngram, capacity) in [(1, 4, 10_000), (2, 5, 30), (3, 3, 8)] {
        let mut a = Automaton::new(ngram, capacity, 1).unwrap();
        let mut s = seed;
        for _ in 0..400 {
            a.extend(&[(lcg(&mut s) % 4) as i32]).unwrap();
            let recent = a.recent_tokens();
            for next in 0..5 {
                assert_eq!(a.borders_for(&recent, next), a.borders(next));
            }
            let next = (lcg(&mut s) % 4) as i32;
            let context: Vec<i32> = recent.iter().map(|&t| t as i32).collect();
            let mut b = a.clone();
            let (tree, recency) = b.retrieve_after(&context, next, 10).unwrap();
            assert_eq!(a.retrieve(next, 10).unwrap(), tree);
            b.touch(&recency); // the same recency as the stateful call's
            assert_eq!(a.to_bytes(), b.to_bytes());
        }
    }
}

#[test]
fn touch_skips_nodes_recycled_since_the_build() {
    let mut a = Automaton::new(3, 6, 1).unwrap();
    a.extend(&[1, 2, 3]).unwrap();
    let used: Vec<u32> = (1..a.nodes.len() as u32).collect();
    let recency = a.recency(&used);
    assert_eq!(recency.len(), used.len());
    a.extend(&[4, 5, 6, 7]).unwrap(); // evicts and recycles slots
    let before: Vec<(u32, u64)> = a.nodes.iter().map(|n| (n.generation, n.tick)).collect();
    let tick = a.tick;
    a.touch(&recency);
    for (v, n) in a.nodes.iter().enumerate().skip(1) {
        let unchanged = before[v] == (n.generation, n.tick);
        assert_eq!(unchanged, n.generation != 0 || !n.alive, "slot {v}");
        if !unchanged {
            assert_eq!(n.tick, tick + 1);
        }
    }
    a.check_integrity().unwrap();
    // After `clear` the slots restart at generation 0: an older recency must not touch them.
    let recency = a.recency(&(1..a.nodes.len() as u32).collect::<Vec<_>>());
    a.clear();
    a.extend(&[1, 2, 3]).unwrap();
    let image = a.to_bytes();
    a.touch(&recency);
    assert_eq!(a.to_bytes(), image);
}

#[test]
fn memory_follows_the_nodes_held() {
    let empty = Automaton::new(10, 10_000, 2).unwrap();
    assert!(empty.memory_bytes() < 1024, "{}", empty.memory_bytes());
    let mut a = Automaton::new(10, 10_000, 2).unwrap();
    let mut seed = 3;
    let tokens: Vec<i32> = (0..400).map(|_| (lcg(&mut seed) % 50) as i32).collect();
    a.extend(&tokens).unwrap();
    let (live, bytes) = (a.len(), a.memory_bytes());
    // Each node holds its slot and a goto entry, with growth slack: more than the
    // node alone, never the budget's worth.
    assert!(
        live > 1000 && bytes > live * size_of::<Node>(),
        "{live} {bytes}"
    );
    assert!(
        bytes < 6 * live * size_of::<Node>() + 65_536,
        "{live} {bytes}"
    );
    a.clear();
    assert!(
        a.memory_bytes() <= empty.memory_bytes(),
        "{}",
        a.memory_bytes()
    );
}

#[test]
fn the_shortest_border_is_the_last_of_the_borders() {
    // Alphabets above HASHED_CHILDREN put the shallow nodes' children in the goto map.
    for (seed, ngram, capacity, alphabet) in [(1, 4, 10_000, 4), (2, 5, 30, 12), (3, 3, 40, 20)] {
        for min_depth in 1..=ngram {
            let mut a = Automaton::new(ngram, capacity, min_depth).unwrap();
            let mut s = seed;
            for _ in 0..300 {
                a.extend(&[(lcg(&mut s) % alphabet) as i32]).unwrap();
                let recent = a.recent_tokens();
                let mut other: Vec<u32> = (0..lcg(&mut s) % 6)
                    .map(|_| lcg(&mut s) % alphabet)
                    .collect();
                other.extend_from_slice(
                    &recent[recent.len().saturating_sub(lcg(&mut s) as usize % 4)..],
                );
                for next in 0..alphabet {
                    let direct = |a: &Automaton, context: &[u32]| {
                        let start = context.len().checked_sub(min_depth - 1)?;
                        a.shortest_border(context[start..].iter().copied(), next)
                    };
                    assert_eq!(direct(&a, &recent), a.borders(next).last().copied());
                    assert_eq!(
                        direct(&a, &other),
                        a.borders_for(&other, next).last().copied()
                    );
                }
            }
        }
    }
}

#[test]
fn children_on_lists_and_in_the_map_keep_every_invariant() {
    // Nodes cross HASHED_CHILDREN both ways (children added, then evicted), and an image
    // (which hashes by the children held) behaves as the automaton it came from.
    for (seed, ngram, capacity, alphabet) in [
        (1, 3, 60, 20),
        (2, 4, 300, 30),
        (3, 2, 40, 40),
        (4, 5, 2000, 12),
    ] {
        let mut a = Automaton::new(ngram, capacity, 2).unwrap();
        for (i, part) in workload(seed, 3000, alphabet).chunks(4).enumerate() {
            feed(&mut a, part);
            a.check_integrity().unwrap();
            if i % 3 == 0 {
                let mut b = Automaton::from_bytes(&a.to_bytes()).unwrap();
                b.check_integrity().unwrap();
                let more = workload(seed + 100 + i as u64, 200, alphabet);
                let mut c = a.clone();
                feed(&mut b, &more);
                feed(&mut c, &more);
                assert_eq!(b.to_bytes(), c.to_bytes());
                for next in 0..alphabet as i32 {
                    assert_eq!(b.retrieve(next, 12).unwrap(), c.retrieve(next, 12).unwrap());
                }
            }
        }
        assert!(
            a.nodes.iter().any(|n| n.alive && n.hashed),
            "no node was hashed"
        );
    }
}

#[test]
fn a_node_moves_its_children_to_the_map_and_back() {
    let mut a = Automaton::new(2, 60, 1).unwrap();
    let fan_out = |a: &mut Automaton, base: i32| {
        for x in 1..=12 {
            a.extend(&[0, base + x]).unwrap();
        }
    };
    let zero = |a: &Automaton| a.nodes[a.find(&[0]).unwrap() as usize].clone();
    fan_out(&mut a, 0);
    assert!(zero(&a).hashed && zero(&a).n_children == 12);
    a.check_integrity().unwrap();
    // Other tokens push every child of [0] out (it keeps [x, 0] pointing at it).
    let mut s = 5;
    for _ in 0..400 {
        a.extend(&[100 + (lcg(&mut s) % 20) as i32]).unwrap();
    }
    a.extend(&[7, 0]).unwrap();
    assert!(zero(&a).n_children == 0 && !zero(&a).hashed);
    a.check_integrity().unwrap();
    fan_out(&mut a, 50);
    assert!(zero(&a).hashed);
    a.check_integrity().unwrap();
    assert_eq!(a.count(&[0, 55]).unwrap(), 1);
    let b = Automaton::from_bytes(&a.to_bytes()).unwrap();
    b.check_integrity().unwrap();
    assert_eq!(b.to_bytes(), a.to_bytes());
}

/// Every substring count of `a` up to `ngram` over a small alphabet.
fn all_counts(a: &Automaton, alphabet: i32) -> Vec<u64> {
    let mut counts = vec![];
    for len in 1..=a.ngram() as u32 {
        for p in 0..alphabet.pow(len) {
            let pattern: Vec<i32> = (0..len).map(|i| (p / alphabet.pow(i)) % alphabet).collect();
            counts.push(a.count(&pattern).unwrap());
        }
    }
    counts
}

#[test]
fn sequences_extended_in_turns_count_what_each_alone_would() {
    let (ngram, alphabet) = (4, 4);
    let mut seed = 5;
    let streams: Vec<Vec<i32>> = (0..4)
        .map(|_| {
            (0..120)
                .map(|_| (lcg(&mut seed) % alphabet as u32) as i32)
                .collect()
        })
        .collect();
    // In turns: each stream's next chunk after its own last ngram - 1 tokens.
    let mut turns = Automaton::new(ngram, 100_000, 1).unwrap();
    let mut done = vec![0usize; streams.len()];
    while done.iter().zip(&streams).any(|(d, s)| *d < s.len()) {
        let i = (lcg(&mut seed) as usize) % streams.len();
        let end = (done[i] + 1 + (lcg(&mut seed) as usize) % 5).min(streams[i].len());
        let lead = &streams[i][done[i].saturating_sub(ngram - 1)..done[i]];
        turns.extend_after(lead, &streams[i][done[i]..end]).unwrap();
        done[i] = end;
    }
    turns.check_integrity().unwrap();
    let mut alone = Automaton::new(ngram, 100_000, 1).unwrap();
    feed(&mut alone, &streams);
    assert_eq!(all_counts(&turns, alphabet), all_counts(&alone, alphabet));
    for len in 1..=ngram {
        let pattern: Vec<i32> = streams[2][10..10 + len].to_vec();
        assert_eq!(
            turns.count(&pattern).unwrap(),
            brute_count(&streams, &pattern)
        );
    }
    // Its counterpart, plain `extend` in turns, counts substrings that span two streams.
    let mut spliced = Automaton::new(ngram, 100_000, 1).unwrap();
    for chunk in streams.iter().flat_map(|s| s.chunks(7)) {
        spliced.extend(chunk).unwrap();
    }
    assert_ne!(all_counts(&spliced, alphabet), all_counts(&alone, alphabet));
}

#[test]
fn extending_after_a_lead_under_eviction_keeps_every_invariant() {
    let mut seed = 9;
    let mut a = Automaton::new(5, 40, 1).unwrap();
    let mut streams = vec![vec![]; 3];
    for _ in 0..2000 {
        let i = (lcg(&mut seed) as usize) % 3;
        let t = (lcg(&mut seed) % 6) as i32;
        let s: &mut Vec<i32> = &mut streams[i];
        a.extend_after(&s[s.len().saturating_sub(4)..], &[t])
            .unwrap();
        s.push(t);
        assert!(a.len() <= a.capacity());
        let tail = &s[s.len().saturating_sub(5)..];
        assert!(a.count(&tail[tail.len() - 1..]).unwrap() >= 1);
    }
    a.check_integrity().unwrap();
    assert!(a.extend_after(&[-1], &[1]).is_err());
    assert!(a.extend_after(&[1], &[-1]).is_err());
    a.check_integrity().unwrap();
}

#[test]
fn chain_follows_the_longest_match_and_falls_back_to_suffixes() {
    let mut a = Automaton::new(4, 1000, 2).unwrap();
    // After "1 2" the most frequent continuation is 3; after "5 1 2" it was 9.
    a.extend(&[1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 9, 8, 0, 5, 1])
        .unwrap();
    assert_eq!(a.chain(2, 2).unwrap().tokens(), &[2, 9, 8]);
    // "5 1 2 9" is `ngram` long: the chain goes on from "1 2 9" (then "2 9 8", "9 8 0").
    assert_eq!(a.chain(2, 5).unwrap().tokens(), &[2, 9, 8, 0, 5, 1]);
    let (tree, recency) = a.chain_after(&[7, 1], 2, 3).unwrap();
    assert_eq!(tree.tokens(), &[2, 3, 4, 1]);
    assert!(!recency.is_empty());
    assert_eq!(a.chain(2, 0).unwrap().tokens(), &[2]);
    assert!(a.chain(-1, 3).is_err() && a.chain(2, crate::tree::MAX_TREE_NODES).is_err());
    a.check_integrity().unwrap();
}
