//! Ondo patch: the build of every target. Instead of fetching MLX from
//! GitHub and building it, mlx-c is compiled against a prebuilt libmlx: the
//! official wheel of the MLX release mlx-c pins (`mlx-cpu` or `mlx-cuda-*` on
//! Linux, `mlx-metal` on macOS, which also holds `mlx.metallib`) or any folder
//! holding `include/mlx` and `lib/libmlx.so` (`lib/libmlx.dylib` on macOS).

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// True when building for macOS/iOS.
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
(`python3 -m venv .venv && .venv/bin/pip install 'mlx[cpu]==0.32.4'`) and name it \
with MLX_PYTHON=.venv/bin/python, or set MLX_PREFIX to a folder that holds \
include/mlx/mlx.h and lib/libmlx.so (`make setup` does the former)";

const HOW_TO_INSTALL_ON_A_MAC: &str = "run `scripts/setup.sh mac`, which unpacks \
the official mlx-metal wheel into target/mlx-metal, and build with \
MLX_PREFIX=target/mlx-metal/mlx (an absolute path), or name a Python whose `mlx` \
package holds include/mlx/mlx.h and lib/libmlx.dylib with MLX_PYTHON";

fn how_to_install() -> &'static str {
    if is_apple_target() {
        HOW_TO_INSTALL_ON_A_MAC
    } else {
        HOW_TO_INSTALL
    }
}

/// The shared library's file name on the target: the wheels ship
/// `libmlx.so` on Linux and `libmlx.dylib` on macOS.
fn library_file() -> &'static str {
    if is_apple_target() {
        "libmlx.dylib"
    } else {
        "libmlx.so"
    }
}

fn looks_like_prefix(prefix: &Path) -> bool {
    prefix.join("include/mlx/mlx.h").is_file() && prefix.join("lib").join(library_file()).is_file()
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
                "MLX_PREFIX={} has no include/mlx/mlx.h and lib/{}; {}",
                prefix.display(),
                library_file(),
                how_to_install()
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
            "`{python}` cannot import mlx ({}); {}",
            String::from_utf8_lossy(&out.stderr).trim(),
            how_to_install()
        ),
        Err(err) => panic!("cannot run `{python}` ({err}); {}", how_to_install()),
    };
    if !looks_like_prefix(&prefix) {
        panic!(
            "the mlx package at {} has no include/mlx/mlx.h and lib/{} \
             (a source install?); {}",
            prefix.display(),
            library_file(),
            how_to_install()
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
    // mlx-c is compiled against the prefix's headers: a different MLX in the
    // same place (the venv after a version bump) must rebuild it.
    println!(
        "cargo:rerun-if-changed={}",
        prefix.join("include/mlx/version.h").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        prefix.join("lib").join(library_file()).display()
    );
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
    if is_apple_target() {
        // Xcode's clang, as upstream's build uses: a compiler from Homebrew
        // or elsewhere on PATH may not know the macOS SDK.
        config
            .define("CMAKE_C_COMPILER", "/usr/bin/cc")
            .define("CMAKE_CXX_COMPILER", "/usr/bin/c++");
    }
    let dst = config.build();

    let lib_dir = prefix.join("lib");
    println!("cargo:rustc-link-search=native={}", dst.join("lib").display());
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // mlx-c is C++: Apple's C++ library is libc++, GNU's libstdc++. libmlx
    // itself links Metal, Accelerate and Foundation on macOS, so mlx-c needs
    // no framework of its own.
    if is_apple_target() {
        println!("cargo:rustc-link-lib=dylib=c++");
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
    }

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
    // On macOS the wheel's libmlx uses Accelerate; the binaries' build
    // scripts link this with GNU ld's options.
    if is_apple_target() {
        return None;
    }
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
