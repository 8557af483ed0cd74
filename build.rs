//! Records the git commit for provenance, and lets the `ondo` command load
//! MLX's libraries from where they lie (build/mlx_link.rs), and on macOS
//! also from the app bundle's Frameworks, where Ondo.app carries
//! libmlx.dylib.

#[path = "build/mlx_link.rs"]
mod mlx_link;

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
    mlx_link::link_mlx_libraries();
    // In Ondo.app the CLI sits in Contents/MacOS and libmlx.dylib in
    // Contents/Frameworks (docs/ARCHITECTURE.md, "Shipping on a Mac"). After
    // the rpath to MLX's folder, so that a build run from target/ loads the
    // libmlx whose mlx.metallib lies beside it.
    if std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "macos") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,@executable_path/../Frameworks");
    }
}
