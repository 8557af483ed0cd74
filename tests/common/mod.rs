//! Helpers shared by the integration tests that compare with mlx-lm.
//!
//! Those tests need a Python with mlx-lm (the project venv that `make setup`
//! makes). Without one they fail, saying how to get it: a comparison that did
//! not run must not count as passed. `ONDO_SKIP_PYTHON=1` asks to skip them
//! instead; build.rs then sets the `ondo_skip_python` cfg (only if no Python
//! is found and `ONDO_REQUIRE_PYTHON`, which `make test` sets, is not), and
//! each such test carries
//! `#[cfg_attr(ondo_skip_python, ignore = "...")]`, so cargo reports it as
//! ignored.

use std::path::{Path, PathBuf};

/// The Python the comparisons run: `ONDO_PYTHON`, else the project venv's.
/// Panics, saying how to get one, when there is neither.
pub fn python() -> PathBuf {
    let found = std::env::var_os("ONDO_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
            venv.is_file().then_some(venv)
        });
    let Some(python) = found else {
        let refused = if std::env::var_os("ONDO_REQUIRE_PYTHON").is_some() {
            " (ONDO_REQUIRE_PYTHON is set, as `make test` sets it: these tests cannot be skipped)"
        } else {
            ", or set ONDO_SKIP_PYTHON=1 to report these tests as ignored"
        };
        panic!(
            "this test compares with Python and there is none: run `make setup` (it makes the \
             project venv .venv), or set ONDO_PYTHON to a Python with mlx-lm{refused}"
        );
    };
    python
}

/// Runs `tests/python/SCRIPT` with `args` in the Python of `python()` and
/// reads the JSON it prints; panics with its standard error when it fails.
#[allow(dead_code)] // Not every test binary that shares this module runs one.
pub fn python_script_json(script: &str, args: &[&str]) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = std::process::Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
