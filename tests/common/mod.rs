//! Helpers shared by the integration tests that compare with mlx-lm.

use std::path::{Path, PathBuf};

/// The project venv's Python, or `None` (with a note) when it is absent and
/// not required. `make test` requires it.
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os("ONDO_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
            venv.is_file().then_some(venv)
        });
    if python.is_none() {
        assert!(
            std::env::var_os("ONDO_REQUIRE_PYTHON").is_none(),
            "ONDO_REQUIRE_PYTHON is set but no Python with mlx-lm was found; run `make setup`"
        );
        eprintln!("note: no project venv; skipping the mlx-lm comparison");
    }
    python
}
