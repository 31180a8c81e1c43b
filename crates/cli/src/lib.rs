//! The logic behind the `redlite` command, kept in a library so tests reach it.

#[cfg(feature = "cuda")]
pub mod cudabench;
pub mod generate;
pub mod inspect;
pub mod limits;
pub mod memory;
pub mod modelbench;
pub mod out;
pub mod quantbench;
pub mod residency;
