//! `build_draft_tree` for Python.

use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{Flag, Int, Real, at_least, native, prob_vector, token_arg, token_id};
use super::automaton::PyAutomaton;
use super::errors::value_error;
use super::logits_table::{PyLogitsTable, exempt};
use super::signature::{Given, Signature, or_default};
use super::tree::PyDraftTree;
use crate::automaton::Automaton;
use crate::draft::{DraftOptions, build_draft_tree_shared as build};
use crate::logits_table::LogitsTable;

/// Trees up to this many nodes (draft chain included) are built without releasing the GIL when
/// their locks are free: a release and re-acquisition costs about as much as a few nodes.
const DETACH_MIN_NODES: usize = 192;

/// The request's automaton, written, and the shared one, read.
type Locks<'a> = (
    RwLockWriteGuard<'a, Automaton>,
    Option<RwLockReadGuard<'a, Automaton>>,
);

/// [`lock_pair`] without waiting: `None` if a lock is held elsewhere. Never blocks, so the
/// order does not matter.
fn try_lock_pair<'a>(
    automaton: &'a PyAutomaton,
    shared: Option<&'a PyAutomaton>,
) -> Option<Locks<'a>> {
    let a = automaton.inner.try_write()?;
    match shared {
        None => Some((a, None)),
        Some(s) => Some((a, Some(s.inner.try_read()?))),
    }
}

/// The request's automaton (written) and the shared one (read), locked in address order: every
/// caller takes two automaton locks in the same global order, so two builds that use the same
/// pair in opposite roles cannot deadlock.
fn lock_pair<'a>(automaton: &'a PyAutomaton, shared: Option<&'a PyAutomaton>) -> Locks<'a> {
    match shared {
        None => (automaton.inner.write(), None),
        Some(s) if std::ptr::from_ref(s) < std::ptr::from_ref(automaton) => {
            let s = s.inner.read();
            (automaton.inner.write(), Some(s))
        }
        Some(s) => {
            let a = automaton.inner.write();
            (a, Some(s.inner.read()))
        }
    }
}

/// RACER's draft tree: ``draft_chain`` first, then retrieval paths (the request's, then the
/// shared automaton's), then the logits tree; the budget is charged after merging.
#[pyfunction]
#[pyo3(signature = (automaton = Given::MISSING, table = Given::MISSING, next_token = Given::MISSING, capacity = Given::MISSING, /, *extra, use_retrieval = Flag::of(true), use_logits = Flag::of(true), draft_chain = None, exempt_depth = Int::of(1), scored = Flag::of(false), min_score = Real::of(0.0), calibration = None, shared = None, **kwargs))]
#[pyo3(
    text_signature = "(automaton, table, next_token, capacity=64, *, use_retrieval=True, use_logits=True, draft_chain=None, exempt_depth=1, scored=False, min_score=0.0, calibration=None, shared=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_draft_tree(
    py: Python<'_>,
    automaton: Given<'_>,
    table: Given<'_>,
    next_token: Given<'_>,
    capacity: Given<'_>,
    extra: &Bound<'_, PyTuple>,
    use_retrieval: Flag,
    use_logits: Flag,
    draft_chain: Option<&Bound<'_, PyAny>>,
    exempt_depth: Int,
    scored: Flag,
    min_score: Real,
    calibration: Option<&Bound<'_, PyAny>>,
    shared: Option<&Bound<'_, PyAny>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyDraftTree> {
    const SIGNATURE: Signature<3, 1> = Signature::new(
        "build_draft_tree",
        ["automaton", "table", "next_token"],
        ["capacity"],
        &[
            "use_retrieval",
            "use_logits",
            "draft_chain",
            "exempt_depth",
            "scored",
            "min_score",
            "calibration",
            "shared",
        ],
    );
    let ([automaton, table, next_token], [capacity]) =
        SIGNATURE.bind([automaton, table, next_token], [capacity], extra, kwargs)?;
    let next_token: Int = next_token.extract()?;
    let capacity = or_default(capacity.as_ref(), Int::of(64))?;
    let automaton = native::<PyAutomaton>(&automaton, "automaton", "an Automaton")?;
    let table = native::<PyLogitsTable>(&table, "table", "a LogitsTable")?;
    let shared = shared
        .filter(|s| !s.is_none())
        .map(|s| native::<PyAutomaton>(s, "shared", "an Automaton or None"))
        .transpose()?;
    let (automaton, table, shared) = (
        automaton.get(),
        table.get(),
        shared.as_ref().map(Bound::get),
    );
    let next_token = token_id(next_token, "next_token")?;
    if shared.is_some_and(|s| std::ptr::eq(s, automaton)) {
        return Err(value_error(
            "shared",
            "must be another Automaton than `automaton` (the request's own index is already read)",
        ));
    }
    let options = DraftOptions {
        capacity: at_least(capacity, 1, "capacity")?,
        use_retrieval: use_retrieval.get("use_retrieval")?,
        use_logits: use_logits.get("use_logits")?,
        exempt_depth: exempt(exempt_depth)?,
        scored: scored.get("scored")?,
        #[allow(clippy::cast_possible_truncation)] // a threshold: f32 precision is plenty
        min_score: min_score.within("min_score", 0.0, 1.0)? as f32,
    };
    let chain = draft_chain
        .map(|c| token_arg(c, "draft_chain"))
        .transpose()?;
    let chain: &[i32] = chain.as_ref().map_or(&[], |c| c.as_slice());
    let calibration = calibration
        .map(|c| prob_vector(c, "calibration"))
        .transpose()?;
    let run = |(mut a, s): Locks<'_>, t: RwLockReadGuard<'_, LogitsTable>| {
        let (tree, recency) = build(
            &mut a,
            s.as_deref(),
            &t,
            next_token,
            chain,
            &options,
            calibration.as_deref(),
        )?;
        drop((a, s, t));
        // The shared automaton's read lock is gone; its recency update takes the write lock
        // alone (holding no other lock), skipping nodes a writer evicted in between.
        if let Some(s) = shared.filter(|_| !recency.is_empty()) {
            s.inner.write().touch(&recency);
        }
        Ok::<_, crate::Error>(tree)
    };
    // A small tree without a shared automaton (whose recency update could wait for its lock)
    // is built at once if its locks are free; anything else releases the GIL.
    if options.capacity + chain.len() < DETACH_MIN_NODES && shared.is_none() {
        if let (Some(locks), Some(t)) = (try_lock_pair(automaton, None), table.inner.try_read()) {
            return Ok(run(locks, t)?.into());
        }
    }
    let tree = py.detach(|| {
        let locks = lock_pair(automaton, shared);
        run(locks, table.inner.read())
    })?;
    Ok(tree.into())
}
