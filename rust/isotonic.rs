//! Weighted isotonic regression within groups of cells, by pool adjacent violators: the
//! calibration's fit of its per-cell acceptance estimates (a vLLM step refits it every call).

use crate::error::{Result, invalid};

/// `values` made non-decreasing, in index order, within each group (`groups[i] >= 0`; a
/// group's cells need not be contiguous) by the weighted least-squares isotonic fit; cells of a
/// negative group keep their value. The fit keeps each group's weighted mean.
///
/// # Errors
/// `InvalidArgument` if the three lengths differ, a value is not finite or a weight is not a
/// finite positive number.
pub fn monotone_fit(values: &[f64], weights: &[f64], groups: &[i32]) -> Result<Vec<f64>> {
    if weights.len() != values.len() || groups.len() != values.len() {
        return Err(invalid(
            "weights",
            format!(
                "values, weights and groups must have one length, got {}, {} and {}",
                values.len(),
                weights.len(),
                groups.len()
            ),
        ));
    }
    if let Some(v) = values.iter().find(|v| !v.is_finite()) {
        return Err(invalid("values", format!("must be finite, got {v}")));
    }
    if let Some(w) = weights.iter().find(|&&w| !(w.is_finite() && w > 0.0)) {
        return Err(invalid(
            "weights",
            format!("must be finite and positive, got {w}"),
        ));
    }
    let mut out = values.to_vec();
    let mut cells: Vec<usize> = (0..values.len()).filter(|&i| groups[i] >= 0).collect();
    cells.sort_unstable_by_key(|&i| (groups[i], i));
    let mut blocks = Vec::new();
    for run in cells.chunk_by(|&a, &b| groups[a] == groups[b]) {
        pool_adjacent_violators(run, values, weights, &mut blocks);
        let mut next = run.iter();
        for block in &blocks {
            for &cell in next.by_ref().take(block.cells) {
                out[cell] = block.mean;
            }
        }
    }
    Ok(out)
}

/// Cells pooled into one fitted value.
struct Block {
    mean: f64,
    weight: f64,
    cells: usize,
}

/// The blocks of the isotonic fit of `values[run]` (in `run`'s order) into `blocks`: each new
/// cell is merged leftwards while its block's mean is below the one before it.
fn pool_adjacent_violators(
    run: &[usize],
    values: &[f64],
    weights: &[f64],
    blocks: &mut Vec<Block>,
) {
    blocks.clear();
    for &cell in run {
        let mut block = Block {
            mean: values[cell],
            weight: weights[cell],
            cells: 1,
        };
        while let Some(last) = blocks.last() {
            if last.mean <= block.mean {
                break;
            }
            let weight = last.weight + block.weight;
            block = Block {
                mean: (last.mean * last.weight + block.mean * block.weight) / weight,
                weight,
                cells: last.cells + block.cells,
            };
            blocks.pop();
        }
        blocks.push(block);
    }
}

#[cfg(test)]
mod tests {
    use super::monotone_fit;

    /// The min-max formula: `f(i) = max_{j<=i} min_{k>=i} mean(j..=k)`.
    fn oracle(values: &[f64], weights: &[f64]) -> Vec<f64> {
        let mean = |j: usize, k: usize| {
            let w: f64 = weights[j..=k].iter().sum();
            values[j..=k]
                .iter()
                .zip(&weights[j..=k])
                .map(|(v, u)| v * u)
                .sum::<f64>()
                / w
        };
        let n = values.len();
        (0..n)
            .map(|i| {
                (0..=i)
                    .map(|j| (i..n).map(|k| mean(j, k)).fold(f64::INFINITY, f64::min))
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect()
    }

    #[test]
    fn matches_the_min_max_formula_in_interleaved_groups() {
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as f64 / f64::from(1u32 << 31)
        };
        for n in 0..40 {
            let values: Vec<f64> = (0..n).map(|_| next()).collect();
            let weights: Vec<f64> = (0..n).map(|_| 0.5 + 4.0 * next()).collect();
            #[allow(clippy::cast_possible_truncation)] // 0..4
            let groups: Vec<i32> = (0..n).map(|_| (next() * 4.0) as i32 - 1).collect();
            let fitted = monotone_fit(&values, &weights, &groups).unwrap();
            for group in -1..3 {
                let cells: Vec<usize> = (0..n).filter(|&i| groups[i] == group).collect();
                let v: Vec<f64> = cells.iter().map(|&i| values[i]).collect();
                let w: Vec<f64> = cells.iter().map(|&i| weights[i]).collect();
                let want = if group < 0 { v } else { oracle(&v, &w) };
                for (&cell, want) in cells.iter().zip(want) {
                    assert!((fitted[cell] - want).abs() < 1e-12, "n {n} cell {cell}");
                }
            }
        }
    }

    #[test]
    fn refuses_bad_weights_and_lengths() {
        assert!(monotone_fit(&[0.1], &[0.0], &[0]).is_err());
        assert!(monotone_fit(&[0.1], &[f64::NAN], &[0]).is_err());
        assert!(monotone_fit(&[f64::INFINITY], &[1.0], &[0]).is_err());
        assert!(monotone_fit(&[0.1, 0.2], &[1.0], &[0, 0]).is_err());
    }
}
