//! Draft chains judged by their calibrated edge probabilities: which of several candidate chains
//! each request drafts, how many of its tokens pay for their share of a batched forward, and what
//! the target's sampled tokens then say about every candidate's edges.
//!
//! A chain table holds `candidates` chains for each of `rows` requests, `k` slots each
//! (`[candidates, rows, k]`, row-major): token ids, a chain ending at its first negative id, and
//! each token's edge cell ([`crate::edge_cells`]). A token at chain position `j` is accepted with
//! the product of the chain's edge probabilities up to `j` (computed in float32, as numpy's
//! `cumprod` over the float32 edges).
//!
//! A serving engine (vLLM) calls these once per step for the whole batch: in numpy they took
//! 0.2 ms of the proposer's 0.6 ms a step at one request (SmolLM2-135M, the vLLM replay).

use crate::error::{Result, invalid};

/// A `[candidates, rows, k]` table of chains.
#[derive(Clone, Copy)]
pub struct ChainTable<'a> {
    /// Token ids; a chain ends at its first negative id.
    pub tokens: &'a [i32],
    /// Each token's edge cell (read only where the token is part of its chain).
    pub cells: &'a [i32],
    /// Chains per request.
    pub candidates: usize,
    /// Requests.
    pub rows: usize,
    /// Slots per chain.
    pub k: usize,
}

impl ChainTable<'_> {
    /// Checks the lengths, and every cell of a chain token against `edges`.
    fn check(&self, edges: usize) -> Result<()> {
        let len = self
            .candidates
            .checked_mul(self.rows)
            .and_then(|n| n.checked_mul(self.k));
        if len != Some(self.tokens.len()) || len != Some(self.cells.len()) {
            return Err(invalid(
                "tokens",
                format!(
                    "tokens and cells must hold {} x {} x {} entries, got {} and {}",
                    self.candidates,
                    self.rows,
                    self.k,
                    self.tokens.len(),
                    self.cells.len()
                ),
            ));
        }
        for chain in 0..self.candidates * self.rows {
            let at = chain * self.k;
            let length = self.length(at);
            if let Some(&cell) = self.cells[at..at + length]
                .iter()
                .find(|&&c| usize::try_from(c).map_or(true, |c| c >= edges))
            {
                return Err(invalid(
                    "cells",
                    format!("a chain token's cell must be in [0, {edges}), got {cell}"),
                ));
            }
        }
        Ok(())
    }

    /// Offset of candidate `c`'s chain for row `r`.
    fn at(&self, c: usize, r: usize) -> usize {
        (c * self.rows + r) * self.k
    }

    /// Tokens of the chain starting at offset `at` (up to its first negative id).
    fn length(&self, at: usize) -> usize {
        self.tokens[at..at + self.k]
            .iter()
            .position(|&t| t < 0)
            .unwrap_or(self.k)
    }

    /// Path probabilities of the chain at `at`'s first `n` tokens, into `out` (float32
    /// products, widened).
    fn path_probabilities(&self, at: usize, n: usize, edges: &[f32], out: &mut Vec<f64>) {
        out.clear();
        let mut product = 1.0f32;
        for &cell in &self.cells[at..at + n] {
            #[allow(clippy::cast_sign_loss)] // checked non-negative
            {
                product *= edges[cell as usize];
            }
            out.push(f64::from(product));
        }
    }
}

/// Each request's chosen candidate and the tokens of it to draft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Per row, the candidate whose scaled expected accepted tokens are highest (the first on
    /// ties).
    pub best: Vec<usize>,
    /// Per row, how many of its chosen chain's first tokens to draft.
    pub lengths: Vec<usize>,
}

/// Step seconds for a forward verifying `n` tokens: `measured[n]` where the engine's steps
/// gave it, else `a + b * n`. A CPU forward's time is a staircase more than a line (vLLM's
/// bfloat16 SmolLM2-135M at 8 requests: 37-41 ms for 8 to 16 tokens, then 45 ms at 17), and a
/// cut that knows the stairs stops below one where the next tokens do not pay for it.
#[derive(Debug, Clone, Copy)]
pub struct StepCost<'a> {
    /// Seconds per step.
    pub a: f64,
    /// Seconds per verified token.
    pub b: f64,
    /// Measured seconds of a step verifying `n` tokens, for `n` below its length (may be empty).
    pub measured: &'a [f64],
}

impl StepCost<'_> {
    /// Seconds of a step verifying `n` tokens.
    #[allow(clippy::cast_precision_loss)] // counts of tokens
    fn seconds(&self, n: usize) -> f64 {
        self.measured
            .get(n)
            .copied()
            .unwrap_or(self.a + self.b * n as f64)
    }
}

/// Most passes of [`choose`]'s alternation between the rows' candidates and the batch's cut
/// (it ends sooner, when no row changes its candidate; two or three passes in practice).
const MAX_PASSES: usize = 16;

/// Chooses each row's chain and cuts it.
///
/// Candidate `c`'s chain tokens are expected to be accepted with their path probabilities times
/// `scales[c]` (at most 1). Without a `cost`, each row drafts, within its budget, every token of
/// the candidate expected to commit the most. With a `cost`, the choice and the cut together
/// maximise expected tokens per second of a step of `requests` requests: `(requests + sum of
/// kept p) / (a + b * (requests + kept))`. At the best rate `r` a token pays exactly when its
/// `p` exceeds `b * r`, so each row's best candidate is the one whose tokens gain the most
/// beyond that price, `sum of max(0, p - b * r)` (Dinkelbach's method for a ratio): starting
/// from the rows' likeliest candidates, the cut ([`cut_lengths`]) gives a rate, the rate a
/// price, the price the rows' candidates, until no row changes; its fixed point is the best
/// rate over every candidate and length per row. A candidate chosen by its whole sum would
/// draft a long mediocre chain where a short sure one pays more once tokens cost. With
/// [`StepCost::measured`] seconds the cut of the chosen candidates is exact on that staircase
/// (the candidates are still priced by the line's `b`).
///
/// # Errors
/// `InvalidArgument` if the table's or the other arguments' lengths do not match, a chain
/// token's cell is outside `edges`, a scale is negative or not finite, or the cost is not
/// finite with `a > 0` and `b >= 0` or a measured time is not finite and positive.
pub fn choose(
    table: ChainTable<'_>,
    edges: &[f32],
    scales: &[f64],
    budgets: &[usize],
    requests: usize,
    cost: Option<StepCost<'_>>,
) -> Result<Choice> {
    table.check(edges.len())?;
    if scales.len() != table.candidates || budgets.len() != table.rows {
        return Err(invalid(
            "scales",
            format!(
                "one scale per candidate ({}) and one budget per row ({}) expected, got {} and {}",
                table.candidates,
                table.rows,
                scales.len(),
                budgets.len()
            ),
        ));
    }
    if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s >= 0.0)) {
        return Err(invalid(
            "scales",
            format!("must be finite and non-negative, got {s}"),
        ));
    }
    if let Some(StepCost { a, b, measured }) = cost {
        if !(a.is_finite() && b.is_finite() && a > 0.0 && b >= 0.0) {
            return Err(invalid(
                "cost",
                format!(
                    "a must be finite and positive and b finite and non-negative, got {a} and {b}"
                ),
            ));
        }
        if let Some(t) = measured.iter().find(|t| !(t.is_finite() && **t > 0.0)) {
            return Err(invalid(
                "cost",
                format!("measured step seconds must be finite and positive, got {t}"),
            ));
        }
    }
    let mut chooser = Chooser {
        table,
        edges,
        scales,
        budgets,
        probs: Vec::with_capacity(table.k),
    };
    let mut best = vec![0; table.rows];
    chooser.pick(0.0, &mut best);
    let Some(cost) = cost else {
        let lengths = (0..table.rows)
            .map(|r| chooser.allowed(best[r], r))
            .collect();
        return Ok(Choice { best, lengths });
    };
    let mut kept = Vec::with_capacity(table.rows * table.k);
    let mut lengths = vec![0; table.rows];
    let mut next = best.clone();
    for pass in 1..=MAX_PASSES {
        chooser.tokens(&best, &mut kept);
        lengths.fill(0);
        let rate = cut_lengths(&mut kept, requests, cost, &mut lengths);
        chooser.pick(cost.b * rate, &mut next);
        if next == best || pass == MAX_PASSES {
            break; // `lengths` are `best`'s cut
        }
        best.clone_from(&next);
    }
    Ok(Choice { best, lengths })
}

/// [`choose`]'s table, edges, scales and budgets, with a buffer for path probabilities.
struct Chooser<'a> {
    table: ChainTable<'a>,
    edges: &'a [f32],
    scales: &'a [f64],
    budgets: &'a [usize],
    probs: Vec<f64>,
}

impl Chooser<'_> {
    /// Tokens of candidate `c`'s chain for row `r` within the row's budget.
    fn allowed(&self, c: usize, r: usize) -> usize {
        self.table.length(self.table.at(c, r)).min(self.budgets[r])
    }

    /// Candidate `c`'s scaled acceptance probabilities for row `r`, into `self.probs`.
    fn scaled(&mut self, c: usize, r: usize) {
        let at = self.table.at(c, r);
        let n = self.allowed(c, r);
        self.table
            .path_probabilities(at, n, self.edges, &mut self.probs);
        for p in &mut self.probs {
            *p = (*p * self.scales[c]).min(1.0);
        }
    }

    /// Per row, the candidate whose tokens gain the most beyond `price` each (the first on ties).
    fn pick(&mut self, price: f64, best: &mut [usize]) {
        for (r, best) in best.iter_mut().enumerate() {
            let mut top = f64::NEG_INFINITY;
            for c in 0..self.table.candidates {
                self.scaled(c, r);
                let gain: f64 = self.probs.iter().map(|&p| (p - price).max(0.0)).sum();
                if gain > top {
                    (top, *best) = (gain, c);
                }
            }
        }
    }

    /// The draftable tokens of every row's chosen candidate, into `kept`.
    fn tokens(&mut self, best: &[usize], kept: &mut Vec<Token>) {
        kept.clear();
        for (r, &c) in best.iter().enumerate() {
            self.scaled(c, r);
            for (depth, &p) in self.probs.iter().enumerate() {
                if p > 0.0 {
                    kept.push(Token { p, row: r, depth });
                }
            }
        }
    }
}

/// A draftable token: its acceptance probability, row and chain position.
#[derive(Debug, Clone, Copy)]
pub struct Token {
    /// Acceptance probability, in `(0, 1]`, non-increasing along its row's chain.
    pub p: f64,
    /// Its request.
    pub row: usize,
    /// Its position in the chain.
    pub depth: usize,
}

/// Adds to `lengths[row]` the tokens, among `tokens`, that maximise expected tokens per second
/// of a step: `(requests + sum of kept p) / seconds(requests + kept)` ([`StepCost`]), keeping
/// the most probable first (a chain's tokens in order, rows in order on ties) and the fewest on
/// ties (within a relative 1e-9). `tokens` is sorted in place. Returns that rate.
pub fn cut_lengths(
    tokens: &mut [Token],
    requests: usize,
    cost: StepCost<'_>,
    lengths: &mut [usize],
) -> f64 {
    tokens.sort_by(|x, y| {
        y.p.total_cmp(&x.p)
            .then(x.depth.cmp(&y.depth))
            .then(x.row.cmp(&y.row))
    });
    #[allow(clippy::cast_precision_loss)] // counts of tokens
    let rate = |gained: f64, n: usize| (requests as f64 + gained) / cost.seconds(requests + n);
    let mut rates = Vec::with_capacity(tokens.len() + 1);
    let mut gained = 0.0;
    rates.push(rate(0.0, 0));
    for (n, token) in tokens.iter().enumerate() {
        gained += token.p;
        rates.push(rate(gained, n + 1));
    }
    let top = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let keep = rates
        .iter()
        .position(|&r| r >= top * (1.0 - 1e-9))
        .unwrap_or(0);
    for token in &tokens[..keep] {
        lengths[token.row] += 1;
    }
    rates[keep]
}

/// What the target's tokens said about a step's candidate chains.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcomes {
    /// Every observed edge's cell: for each candidate chain (candidate-major, then row), its
    /// tokens up to and including the first that differs from the target's, and none past the
    /// target's tokens.
    pub cells: Vec<i32>,
    /// Whether each observed edge was accepted.
    pub accepted: Vec<bool>,
    /// Per row, the drafted tokens committed (the chosen chain's drafted prefix that matched).
    pub committed: Vec<usize>,
    /// Per row, the drafted tokens its path probabilities expected (unscaled).
    pub expected: Vec<f64>,
}

/// One request's step: its row in the table, its drafted chain and what the target sampled.
#[derive(Debug, Clone, Copy)]
pub struct Sampled<'a> {
    /// Its row in the table.
    pub row: usize,
    /// The candidate it drafted from.
    pub best: usize,
    /// The tokens it drafted (a prefix of that candidate's chain).
    pub drafted: usize,
    /// The tokens the target sampled after the root: the accepted drafts, then the bonus token.
    pub tokens: &'a [i64],
}

/// The outcomes of every candidate chain of the requests in `steps` (see [`Outcomes`]): a
/// chain token is evidence, verified, cut or not chosen, up to the first mismatch with the
/// target's tokens (a chain matching all of them says nothing of its next token).
///
/// # Errors
/// `InvalidArgument` as [`choose`] for the table, and if a step's row, candidate or drafted
/// length is outside the table.
pub fn outcomes(table: ChainTable<'_>, edges: &[f32], steps: &[Sampled<'_>]) -> Result<Outcomes> {
    table.check(edges.len())?;
    let mut out = Outcomes {
        cells: Vec::new(),
        accepted: Vec::new(),
        committed: Vec::with_capacity(steps.len()),
        expected: Vec::with_capacity(steps.len()),
    };
    for step in steps {
        if step.row >= table.rows || step.best >= table.candidates || step.drafted > table.k {
            return Err(invalid(
                "steps",
                format!(
                    "row {}, candidate {} or drafted length {} outside a {} x {} x {} table",
                    step.row, step.best, step.drafted, table.candidates, table.rows, table.k
                ),
            ));
        }
    }
    let mut probs = Vec::with_capacity(table.k);
    for c in 0..table.candidates {
        for step in steps {
            let at = table.at(c, step.row);
            let chain = &table.tokens[at..at + table.length(at)];
            let matched = chain
                .iter()
                .zip(step.tokens)
                .take_while(|(a, b)| i64::from(**a) == **b)
                .count();
            let observed = (matched + 1).min(chain.len()).min(step.tokens.len());
            out.cells.extend_from_slice(&table.cells[at..at + observed]);
            out.accepted.extend((0..observed).map(|j| j < matched));
        }
    }
    for step in steps {
        let at = table.at(step.best, step.row);
        let drafted = step.drafted.min(table.length(at));
        let matched = table.tokens[at..at + drafted]
            .iter()
            .zip(step.tokens)
            .take_while(|(a, b)| i64::from(**a) == **b)
            .count();
        out.committed.push(matched);
        table.path_probabilities(at, drafted, edges, &mut probs);
        out.expected.push(probs.iter().sum());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{ChainTable, Sampled, StepCost, Token, choose, cut_lengths, outcomes};

    fn table<'a>(
        tokens: &'a [i32],
        cells: &'a [i32],
        candidates: usize,
        k: usize,
    ) -> ChainTable<'a> {
        ChainTable {
            tokens,
            cells,
            candidates,
            rows: tokens.len() / candidates / k,
            k,
        }
    }

    #[test]
    fn the_likeliest_scaled_candidate_is_chosen_and_cut_to_what_pays() {
        // Two candidates, one row, k = 3: cell 0 has p 0.9, cell 1 p 0.1.
        let edges = [0.9f32, 0.1];
        let tokens = [5, 6, 7, 8, 9, -1];
        let cells = [1, 1, 1, 0, 0, 0];
        let t = table(&tokens, &cells, 2, 3);
        let choice = choose(t, &edges, &[1.0, 1.0], &[3], 8, None).unwrap();
        assert_eq!((choice.best, choice.lengths), (vec![1], vec![2]));
        // Scaled down enough, the first candidate wins.
        let choice = choose(t, &edges, &[1.0, 0.05], &[3], 8, None).unwrap();
        assert_eq!(choice.best, vec![0]);
        // The budget caps the length; a costly token is cut.
        let choice = choose(t, &edges, &[1.0, 1.0], &[1], 8, None).unwrap();
        assert_eq!(choice.lengths, vec![1]);
        let cost = StepCost {
            a: 60.0,
            b: 2.0,
            measured: &[],
        };
        let choice = choose(t, &edges, &[1.0, 1.0], &[3], 8, Some(cost)).unwrap();
        assert_eq!(choice.lengths, vec![2]); // 0.9 and 0.81 both pay at 8 requests
        let cost = StepCost {
            a: 1.0,
            b: 2.0,
            measured: &[],
        };
        let choice = choose(t, &edges, &[1.0, 1.0], &[3], 8, Some(cost)).unwrap();
        assert_eq!(choice.lengths, vec![0]); // a token costs more than it brings
    }

    #[test]
    fn once_tokens_cost_a_short_sure_chain_beats_a_long_mediocre_one() {
        // One row, k = 8: a single token at 0.9 (cell 0) against eight at 0.7 per edge (cell
        // 1: path probabilities 0.7, 0.49, ... summing to 2.2).
        let edges = [0.9f32, 0.7];
        let mut tokens = [-1; 16];
        tokens[0] = 5;
        tokens[8..].fill(6);
        let mut cells = [0; 16];
        cells[8..].fill(1);
        let t = table(&tokens, &cells, 2, 8);
        let free = choose(t, &edges, &[1.0, 1.0], &[8], 1, None).unwrap();
        assert_eq!((free.best, free.lengths), (vec![1], vec![8]));
        // At a = 1, b = 0.3 the long chain's best cut (two tokens: 2.19 / 1.9 = 1.15) loses to
        // the sure token (1.9 / 1.6 = 1.19); no token at all gives 1 / 1.3.
        let cost = Some(StepCost {
            a: 1.0,
            b: 0.3,
            measured: &[],
        });
        let costly = choose(t, &edges, &[1.0, 1.0], &[8], 1, cost).unwrap();
        assert_eq!((costly.best, costly.lengths), (vec![0], vec![1]));
    }

    #[test]
    fn the_cut_keeps_the_likeliest_tokens_and_the_fewest_on_ties() {
        let mut tokens = vec![
            Token {
                p: 0.5,
                row: 1,
                depth: 0,
            },
            Token {
                p: 0.9,
                row: 0,
                depth: 0,
            },
            Token {
                p: 0.2,
                row: 0,
                depth: 1,
            },
        ];
        let mut lengths = vec![0; 2];
        // Rate with n tokens: (1 + gained) / (1 + 0.6 (1 + n)): 0.625, 0.864, 0.857, 0.765.
        cut_lengths(
            &mut tokens,
            1,
            StepCost {
                a: 1.0,
                b: 0.6,
                measured: &[],
            },
            &mut lengths,
        );
        assert_eq!(lengths, vec![1, 0]);
        let mut lengths = vec![0; 2];
        // Tokens almost free: every one pays.
        cut_lengths(
            &mut tokens,
            1,
            StepCost {
                a: 1.0,
                b: 1e-12,
                measured: &[],
            },
            &mut lengths,
        );
        assert_eq!(lengths, vec![2, 1]);
    }

    #[test]
    fn a_measured_stair_stops_the_cut_below_it() {
        // Eight requests, each with one token of p = 0.5 twice over (p 0.5, then 0.25).
        let mut tokens: Vec<Token> = (0..8)
            .flat_map(|row| {
                [
                    Token {
                        p: 0.5,
                        row,
                        depth: 0,
                    },
                    Token {
                        p: 0.25,
                        row,
                        depth: 1,
                    },
                ]
            })
            .collect();
        // On the line 1 + 0.01 n every token pays (its p beats b * rate, about 0.01 * 8).
        let line = StepCost {
            a: 1.0,
            b: 0.01,
            measured: &[],
        };
        let mut lengths = vec![0; 8];
        cut_lengths(&mut tokens, 8, line, &mut lengths);
        assert_eq!(lengths, vec![2; 8]);
        // Measured: the same line up to 16 tokens, then a stair of 0.3 s: only the first eight
        // drafted tokens (16 in the step) pay.
        let measured: Vec<f64> = (0..=24)
            .map(|n| 1.0 + 0.01 * f64::from(n) + if n > 16 { 0.3 } else { 0.0 })
            .collect();
        let stairs = StepCost {
            a: 1.0,
            b: 0.01,
            measured: &measured,
        };
        let mut lengths = vec![0; 8];
        cut_lengths(&mut tokens, 8, stairs, &mut lengths);
        assert_eq!(lengths, vec![1; 8]);
    }

    #[test]
    fn outcomes_count_every_candidate_up_to_its_first_mismatch() {
        let edges = [0.5f32, 0.25];
        // One row, two candidates: [1, 2, 3] (cells 0 0 1) and [1, 4, -1] (cells 1 1 -).
        let tokens = [1, 2, 3, 1, 4, -1];
        let cells = [0, 0, 1, 1, 1, 0];
        let t = table(&tokens, &cells, 2, 3);
        // The target sampled 1, 2, then 9: the first chain matched 2 (its third is a miss),
        // the second 1 (its second a miss).
        let sampled = [1i64, 2, 9];
        let steps = [Sampled {
            row: 0,
            best: 0,
            drafted: 2,
            tokens: &sampled,
        }];
        let out = outcomes(t, &edges, &steps).unwrap();
        assert_eq!(out.cells, vec![0, 0, 1, 1, 1]);
        assert_eq!(out.accepted, vec![true, true, false, true, false]);
        assert_eq!(out.committed, vec![2]);
        assert!((out.expected[0] - (0.5 + 0.25)).abs() < 1e-12);
        // Only two sampled tokens (one accepted draft and the bonus): nothing past them.
        let sampled = [1i64, 2];
        let steps = [Sampled {
            row: 0,
            best: 1,
            drafted: 1,
            tokens: &sampled,
        }];
        let out = outcomes(t, &edges, &steps).unwrap();
        assert_eq!(out.cells, vec![0, 0, 1, 1]);
        assert_eq!(out.accepted, vec![true, true, true, false]);
        assert_eq!(out.committed, vec![1]);
    }

    #[test]
    fn bad_tables_and_arguments_are_errors() {
        let edges = [0.5f32];
        let t = table(&[1, 2], &[0, 1], 1, 2);
        assert!(choose(t, &edges, &[1.0], &[2], 1, None).is_err()); // cell 1 outside edges
        let t = table(&[1, -1], &[0, 7], 1, 2); // a cell past the chain's end is not read
        assert!(choose(t, &edges, &[1.0], &[2], 1, None).is_ok());
        assert!(choose(t, &edges, &[f64::NAN], &[2], 1, None).is_err());
        assert!(choose(t, &edges, &[1.0, 1.0], &[2], 1, None).is_err());
        let bad = Some(StepCost {
            a: 0.0,
            b: 1.0,
            measured: &[],
        });
        assert!(choose(t, &edges, &[1.0], &[2], 1, bad).is_err());
        let short = ChainTable { rows: 2, ..t };
        assert!(choose(short, &edges, &[1.0], &[2, 2], 1, None).is_err());
        let steps = [Sampled {
            row: 1,
            best: 0,
            drafted: 0,
            tokens: &[],
        }];
        assert!(outcomes(t, &edges, &steps).is_err());
    }
}
