//! PyO3 bindings: argument conversion, GIL release and error mapping only; no algorithms.

mod arrays;
mod automaton;
mod chains;
mod draft;
mod edge_cells;
mod errors;
mod logits_summary;
mod logits_table;
mod lookup;
mod pool;
mod signature;
mod tree;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _native {
    #[pymodule_export]
    use super::automaton::PyAutomaton;
    #[pymodule_export]
    use super::chains::{chain_outcomes, choose_chains};
    #[pymodule_export]
    use super::draft::build_draft_tree;
    #[pymodule_export]
    use super::edge_cells::{
        edge_cell_groups, edge_cell_priors, edge_cell_shared_counterparts, monotone_fit,
    };
    #[pymodule_export]
    use super::logits_summary::{logits_summary, logits_topk};
    #[pymodule_export]
    use super::logits_table::PyLogitsTable;
    #[pymodule_export]
    use super::lookup::prompt_lookup;
    #[pymodule_export]
    use super::pool::{PyBatchDraft, PyDraftPool};
    #[pymodule_export]
    use super::tree::PyDraftTree;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("EDGE_CELLS", crate::edge_cells::EDGE_CELLS)?;
        m.add("__version__", env!("CARGO_PKG_VERSION"))
    }
}
