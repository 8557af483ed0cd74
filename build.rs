//! Records the git commit for provenance, and sets the rpath of Ondo's binaries to the folder of libmlx, which the
//! patched mlx-sys publishes as DEP_MLX_LIB (a link argument from mlx-sys's own
//! build script would not reach our binaries).
fn main() {
    // Every run record names the commit it was built from (provenance).
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=ONDO_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB");
    if let Ok(lib_dir) = std::env::var("DEP_MLX_LIB") {
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
