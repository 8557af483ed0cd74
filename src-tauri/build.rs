//! Generates Tauri's context (config, capabilities, icons) and lets the app
//! load MLX's libraries from where they lie (build/mlx_link.rs). On macOS
//! tauri-build adds the bundle's Frameworks, where Ondo.app carries
//! libmlx.dylib (it does so for any `bundle.macOS.frameworks`), after ours.

#[path = "../build/mlx_link.rs"]
mod mlx_link;

fn main() {
    mlx_link::link_mlx_libraries();
    tauri_build::build();
}
