//! The `ondo-app` binary: everything lives in the library so tests can drive it.

// Without this a release build on Windows would also open a console window.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    ondo_app::run();
}
