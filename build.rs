//! Sets the rpath of Ondo's binaries to the folder of libmlx, which the
//! patched mlx-sys publishes as DEP_MLX_LIB (a link argument from mlx-sys's own
//! build script would not reach our binaries).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB");
    if let Ok(lib_dir) = std::env::var("DEP_MLX_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    }
}
