//! racer_rs core: the retrieval automaton, the copy-logit table and draft-tree construction for
//! RACER speculative decoding. Everything outside `bindings` is plain Rust with no pyo3.

pub mod alloc;
pub mod automaton;
pub mod chains;
mod crc32;
pub mod draft;
pub mod edge_cells;
pub mod error;
pub mod isotonic;
pub mod logits_summary;
pub mod logits_table;
pub mod lookup;
pub mod pool;
pub mod tree;

#[cfg(feature = "python")]
mod bindings;

pub use automaton::Automaton;
pub use draft::{DraftOptions, build_draft_tree, build_draft_tree_shared};
pub use error::{Error, Result};
pub use logits_table::LogitsTable;
pub use lookup::prompt_lookup;
pub use pool::{BatchDraft, DraftPool, PoolOptions, RequestId};
pub use tree::{DraftTree, TreeBuilder};
