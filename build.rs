//! Records the git commit for provenance, and lets the `ondo` command load
//! MLX's libraries from where they lie (build/mlx_link.rs), and on macOS
//! also from the app bundle's Frameworks, where Ondo.app carries
//! libmlx.dylib. It also marks the tests that compare with Python ignored
//! where a developer asked to skip them (`skip_python_tests_if_asked`).

#[path = "build/mlx_link.rs"]
mod mlx_link;

fn main() {
    skip_python_tests_if_asked();
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

/// The tests that compare with Python fail without one, saying how to get it.
/// `ONDO_SKIP_PYTHON=1` asks to skip them instead: where no Python is found
/// (`ONDO_PYTHON`, else `.venv/bin/python`), the `ondo_skip_python` cfg marks
/// them ignored (`cfg_attr(ondo_skip_python, ignore)`), so cargo counts them
/// as ignored, not passed. `ONDO_REQUIRE_PYTHON` (`make test` sets it) refuses
/// the skip. The venv is looked for when one of these variables changes, and
/// only while a skip is asked, so other builds never rerun this script for it.
fn skip_python_tests_if_asked() {
    println!("cargo:rustc-check-cfg=cfg(ondo_skip_python)");
    println!("cargo:rerun-if-env-changed=ONDO_SKIP_PYTHON");
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if !set("ONDO_SKIP_PYTHON") {
        return;
    }
    println!("cargo:rerun-if-env-changed=ONDO_REQUIRE_PYTHON");
    println!("cargo:rerun-if-env-changed=ONDO_PYTHON");
    let python_found = set("ONDO_PYTHON") || std::path::Path::new(".venv/bin/python").is_file();
    if !python_found && !set("ONDO_REQUIRE_PYTHON") {
        println!("cargo:rustc-cfg=ondo_skip_python");
    }
}
