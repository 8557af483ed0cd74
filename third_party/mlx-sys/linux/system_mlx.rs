//! Ondo patch: the build for targets other than Apple's. Instead of fetching
//! MLX from GitHub and building it with Metal, mlx-c is compiled against a
//! prebuilt libmlx: the official `mlx` wheel (mlx-cpu or mlx-cuda-*) or any
//! folder holding `include/mlx` and `lib/libmlx.so`.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// True when building for macOS/iOS, where the upstream Metal build is kept.
pub fn is_apple_target() -> bool {
    env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple")
}

/// True when the caller only wants `cargo check` for an Apple target on a
/// machine that cannot build MLX with Metal: bindings come from the
/// checked-in copy and nothing is compiled or linked.
pub fn is_check_only() -> bool {
    println!("cargo:rerun-if-env-changed=MLX_SYS_CHECK_ONLY");
    env::var_os("MLX_SYS_CHECK_ONLY").is_some_and(|v| v == "1")
}

const HOW_TO_INSTALL: &str = "install the official wheel into a Python \
(`python3 -m venv .venv && .venv/bin/pip install 'mlx[cpu]==0.32.2'`) and name it \
with MLX_PYTHON=.venv/bin/python, or set MLX_PREFIX to a folder that holds \
include/mlx/mlx.h and lib/libmlx.so (`make setup` does the former)";

fn looks_like_prefix(prefix: &Path) -> bool {
    prefix.join("include/mlx/mlx.h").is_file() && prefix.join("lib/libmlx.so").is_file()
}

/// Finds the MLX prefix: `MLX_PREFIX`, else the `mlx` package of `MLX_PYTHON`
/// (default `python3`).
pub fn locate_prefix() -> PathBuf {
    println!("cargo:rerun-if-env-changed=MLX_PREFIX");
    println!("cargo:rerun-if-env-changed=MLX_PYTHON");
    if let Some(prefix) = env::var_os("MLX_PREFIX") {
        let prefix = PathBuf::from(prefix);
        if !looks_like_prefix(&prefix) {
            panic!(
                "MLX_PREFIX={} has no include/mlx/mlx.h and lib/libmlx.so; {HOW_TO_INSTALL}",
                prefix.display()
            );
        }
        return prefix;
    }
    let python = env::var("MLX_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let output = Command::new(&python)
        .args(["-c", "import mlx; print(list(mlx.__path__)[0])"])
        .output();
    let prefix = match output {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
        Ok(out) => panic!(
            "`{python}` cannot import mlx ({}); {HOW_TO_INSTALL}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(err) => panic!("cannot run `{python}` ({err}); {HOW_TO_INSTALL}"),
    };
    if !looks_like_prefix(&prefix) {
        panic!(
            "the mlx package at {} has no include/mlx/mlx.h and lib/libmlx.so \
             (a source install?); {HOW_TO_INSTALL}",
            prefix.display()
        );
    }
    prefix
}

/// Compiles mlx-c as a static library against the prebuilt libmlx and tells
/// cargo how to link both. Publishes the library folder as `DEP_MLX_LIB` so
/// that each binary's own build script can set its rpath (a link argument
/// from this build script would not reach the final binary).
pub fn build_and_link(mlx_c_root: &Path) {
    let prefix = locate_prefix();
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let ours = manifest.join("linux");
    println!("cargo:rerun-if-changed={}", ours.display());

    let mut config = cmake::Config::new(mlx_c_root);
    config
        .define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("CMAKE_MODULE_PATH", &ours)
        .define("MLX_PREFIX", &prefix)
        // The C layer is thin; an optimised build costs little and keeps
        // debug builds of Ondo from paying for it on every call.
        .define("CMAKE_BUILD_TYPE", "Release")
        .profile("Release")
        .cxxflag(format!("-include {}", ours.join("format_compat.h").display()));
    let dst = config.build();

    let lib_dir = prefix.join("lib");
    println!("cargo:rustc-link-search=native={}", dst.join("lib").display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    println!("cargo:rustc-link-lib=dylib=stdc++");

    let include = env::join_paths([prefix.join("include"), manifest.join(mlx_c_root)])
        .expect("MLX include directories must not contain the path-list separator");
    println!("cargo::metadata=include={}", include.display());
    println!("cargo::metadata=lib={}", lib_dir.display());
    println!("cargo::metadata=prefix={}", prefix.display());
    if let Some(blas) = fast_blas() {
        println!("cargo::metadata=fast_blas={}", blas.display());
    }
}

/// An optimised CBLAS the final binaries can load ahead of the wheel's
/// reference BLAS: libmlx leaves `cblas_sgemm` undefined and takes the first
/// definition in load order, so a library the binary itself needs wins. The
/// wheel's BLAS multiplies fp32 matrices at a few GFLOP/s on x86; OpenBLAS at
/// tens. The serial build is preferred: the threaded one's exit handler can
/// wait forever for its worker threads once they have run (seen with 0.3.21),
/// and MLX already computes on a thread of its own. `MLX_SYS_FAST_BLAS` names
/// another library, or `none` to keep the wheel's.
fn fast_blas() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=MLX_SYS_FAST_BLAS");
    match env::var("MLX_SYS_FAST_BLAS") {
        Ok(v) if v == "none" => None,
        Ok(v) => Some(PathBuf::from(v)),
        Err(_) => [
            "/usr/lib/x86_64-linux-gnu/openblas-serial/libopenblas.so.0",
            "/usr/lib/aarch64-linux-gnu/openblas-serial/libopenblas.so.0",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file()),
    }
}

/// bindgen settings for these targets: `float16_t` is the newtype over its bit
/// pattern that mlx-rs expects (on Arm bindgen makes one from `__fp16`).
pub fn adjust_bindgen(builder: bindgen::Builder) -> bindgen::Builder {
    builder.blocklist_type("float16_t").raw_line(
        "#[repr(transparent)]\n#[derive(Debug, Default, Copy, Clone, PartialEq, Eq)]\npub struct float16_t(pub u16);",
    )
}
