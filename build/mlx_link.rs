//! The link arguments that let Ondo's binaries (the `ondo` command and the
//! desktop app) load MLX's libraries without LD_LIBRARY_PATH or
//! DYLD_LIBRARY_PATH. Both build scripts include this file.

/// Sets the rpath to the folder of libmlx, which the patched mlx-sys
/// publishes as DEP_MLX_LIB (a link argument from mlx-sys's own build script
/// would not reach our binaries), and on Linux links OpenBLAS, which mlx-sys
/// publishes as DEP_MLX_FAST_BLAS, with an rpath to its folder.
pub fn link_mlx_libraries() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB");
    println!("cargo:rerun-if-env-changed=ONDO_MACOS_BUNDLE");
    let macos = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "macos");
    // `make dmg` builds for Ondo.app alone: no rpath to this machine's MLX
    // folder, so the bundle cannot quietly load it from there.
    let for_the_bundle_only =
        macos && std::env::var_os("ONDO_MACOS_BUNDLE").is_some_and(|v| v == "1");
    if let Ok(lib_dir) = std::env::var("DEP_MLX_LIB")
        && !for_the_bundle_only
    {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    }
    // On Linux, OpenBLAS for MLX's fp32 matmuls instead of the wheel's
    // reference BLAS (see third_party/mlx-sys/PATCHES.md, change 8).
    println!("cargo:rerun-if-env-changed=DEP_MLX_FAST_BLAS");
    if let Ok(blas) = std::env::var("DEP_MLX_FAST_BLAS") {
        println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed,{blas},--pop-state");
        // The soname is shared by OpenBLAS's serial and threaded builds; the
        // rpath makes the loader take the one linked here.
        if let Some(dir) = std::path::Path::new(&blas).parent() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
    }
}
