//! Constrained decoding for Red Lite.
//!
//! * [`gbnf::parse`]: GBNF text (llama.cpp's grammar format) into a checked
//!   [`Grammar`], errors with line and column.
//! * [`schema::compile`]: a JSON Schema (what tool parameters and
//!   `response_format: json_schema` use) into GBNF text.
//! * [`Matcher`]: a pushdown matcher over UTF-8 bytes with a bounded state.
//! * [`Vocab`] and [`Constraint`]: which tokens of a vocabulary keep the
//!   grammar alive at each step, walked as a byte trie, with masks cached per
//!   grammar position; the end-of-generation tokens only once the grammar
//!   is complete.

pub mod gbnf;
pub mod grammar;
pub mod mask;
pub mod matcher;
pub mod schema;

pub use grammar::Grammar;
pub use mask::{Constraint, MaskStats, Vocab};
pub use matcher::Matcher;

/// What can go wrong building or running a grammar.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum GrammarError {
    #[error("grammar line {line}, column {col}: {message}")]
    Parse {
        line: usize,
        col: usize,
        message: String,
    },
    #[error("grammar line {line}, column {col}: rule `{name}` is used but never defined")]
    Undefined {
        name: String,
        line: usize,
        col: usize,
    },
    #[error("the grammar has no `{0}` rule to start from")]
    NoRoot(String),
    #[error("rule `{0}` is left-recursive (it can reach itself before matching a character)")]
    LeftRecursion(String),
    #[error("the grammar is too large (over {0} elements once repetitions are expanded)")]
    TooLarge(usize),
    #[error("the grammar is too ambiguous: over {0} parses alive at once")]
    TooAmbiguous(usize),
    #[error("the grammar nests rules over {0} deep")]
    TooDeep(u32),
    #[error("{0}")]
    Invalid(String),
}
