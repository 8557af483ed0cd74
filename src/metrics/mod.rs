//! Measurements: what MLX reports about itself and its memory. System memory
//! pressure comes from the `ondo-os` crate.

pub mod mlx_runtime;
