//! Generates Tauri's context (config, capabilities, icons) and sets the rpath
//! of the app binary to the folder of libmlx, which the patched mlx-sys
//! publishes as DEP_MLX_LIB (its own link arguments do not reach our binary).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB");
    if let Ok(lib_dir) = std::env::var("DEP_MLX_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    }
    tauri_build::build();
}
