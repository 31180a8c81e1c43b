//! The logic behind the `redlite` command, kept in a library so tests reach it.

pub mod inspect;
pub mod quantbench;
