//! `build_draft_tree` for Python.

use pyo3::prelude::*;

use super::arrays::{Int, at_least, prob_vector, token_arg, token_id};
use super::automaton::PyAutomaton;
use super::logits_table::{PyLogitsTable, exempt};
use super::tree::PyDraftTree;
use crate::draft::{DraftOptions, build_draft_tree as build};

/// RACER's draft tree: ``draft_chain`` first, then retrieval paths, then the logits tree;
/// the budget is charged after merging.
#[pyfunction]
#[pyo3(signature = (automaton, table, next_token, capacity = Int(64), *, use_retrieval = true, use_logits = true, draft_chain = None, exempt_depth = Int(1), scored = false, min_score = 0.0, calibration = None))]
#[pyo3(
    text_signature = "(automaton, table, next_token, capacity=64, *, use_retrieval=True, use_logits=True, draft_chain=None, exempt_depth=1, scored=False, min_score=0.0, calibration=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_draft_tree(
    py: Python<'_>,
    automaton: &PyAutomaton,
    table: &PyLogitsTable,
    next_token: Int,
    capacity: Int,
    use_retrieval: bool,
    use_logits: bool,
    draft_chain: Option<&Bound<'_, PyAny>>,
    exempt_depth: Int,
    scored: bool,
    min_score: f64,
    calibration: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDraftTree> {
    let next_token = token_id(next_token, "next_token")?;
    let options = DraftOptions {
        capacity: at_least(capacity, 1, "capacity")?,
        use_retrieval,
        use_logits,
        exempt_depth: exempt(exempt_depth)?,
        scored,
        #[allow(clippy::cast_possible_truncation)] // a threshold: f32 precision is plenty
        min_score: if min_score.is_nan() { -1.0 } else { min_score as f32 },
    };
    let chain = draft_chain
        .map(|c| token_arg(c, "draft_chain"))
        .transpose()?;
    let chain: &[i32] = chain.as_ref().map_or(&[], |c| c.as_slice());
    let calibration = calibration
        .map(|c| prob_vector(c, "calibration"))
        .transpose()?;
    let tree = py.detach(|| {
        let mut a = automaton.inner.lock();
        build(
            &mut a,
            &table.inner.read(),
            next_token,
            chain,
            &options,
            calibration.as_deref(),
        )
    })?;
    Ok(tree.into())
}
