//! Records the git commit for provenance, and sets the rpath of Ondo's binaries to the folder of libmlx, which the
//! patched mlx-sys publishes as DEP_MLX_LIB (a link argument from mlx-sys's own
//! build script would not reach our binaries), and on macOS also to the app
//! bundle's Frameworks, where Ondo.app carries libmlx.dylib.
//! It also marks the tests that compare with Python ignored where a developer
//! asked to skip them (`skip_python_tests_if_asked`).
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
    // In Ondo.app the CLI sits in Contents/MacOS and libmlx.dylib in
    // Contents/Frameworks (docs/ARCHITECTURE.md, "Shipping on a Mac"). After
    // the rpath above, so that a build run from target/ loads the libmlx
    // whose mlx.metallib lies beside it.
    if macos {
        println!("cargo:rustc-link-arg=-Wl,-rpath,@executable_path/../Frameworks");
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
