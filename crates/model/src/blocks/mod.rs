//! Blocks shared by architectures: attention, Gated DeltaNet, MoE and dense FFN.

pub mod attention;
pub mod deltanet;
pub mod moe;
