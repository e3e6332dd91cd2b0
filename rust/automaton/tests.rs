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
