//! Ondo.app as `tauri.conf.json` and the `Info.plist` beside it describe it,
//! checked here, where no Mac can build it: MLX's libmlx.dylib and its Metal
//! kernels go where the binaries and MLX look for them inside the bundle,
//! from the paths the Mac build writes them to; the `ondo` CLI ships beside
//! the app; the minimum macOS is one the kernels load on; and the app stays
//! out of the Dock. docs/ARCHITECTURE.md, "Shipping on a Mac", says why.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("src-tauri sits in the repository")
        .to_path_buf()
}

fn tauri_config() -> Value {
    let path = repo_root().join("src-tauri/tauri.conf.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn mac_bundle(config: &Value) -> &Value {
    &config["bundle"]["macOS"]
}

/// A file the Mac bundle copies into `Contents/<inside>` (`bundle.macOS.files`),
/// as its source path relative to src-tauri.
fn bundled_file<'c>(config: &'c Value, inside: &str) -> Option<&'c str> {
    mac_bundle(config)["files"][inside].as_str()
}

/// Where the Mac build unpacks the mlx-metal wheel, as `scripts/setup.sh`
/// says (`MLX_PREFIX`, relative to the repository root).
fn mac_mlx_prefix() -> String {
    let output = Command::new("bash")
        .arg(repo_root().join("scripts/setup.sh"))
        .arg("mac-prefix")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// The wheel's layout: `mlx/lib/libmlx.dylib` and `mlx/lib/mlx.metallib`
/// under the prefix's `lib`.
fn from_the_wheel(file: &str) -> String {
    format!("../{}/lib/{file}", mac_mlx_prefix())
}

#[test]
fn the_metallib_goes_where_ondo_tells_mlx_to_look() {
    let config = tauri_config();
    assert_eq!(
        bundled_file(&config, ondo::metallib::METALLIB_IN_BUNDLE),
        Some(from_the_wheel(ondo::metallib::METALLIB_FILE).as_str()),
        "bundle.macOS.files must copy the wheel's mlx.metallib to Contents/{}",
        ondo::metallib::METALLIB_IN_BUNDLE
    );
}

#[test]
fn libmlx_goes_into_the_bundles_frameworks_from_the_unpacked_wheel() {
    let config = tauri_config();
    // A .dylib in `frameworks` lands in Contents/Frameworks, where the
    // binaries' rpath (@executable_path/../Frameworks) finds
    // @rpath/libmlx.dylib, the wheel's install name.
    let frameworks: Vec<&str> = mac_bundle(&config)["frameworks"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(frameworks, [from_the_wheel("libmlx.dylib")]);
}

#[test]
fn the_cli_ships_beside_the_app() {
    let config = tauri_config();
    // `cargo build --release --target aarch64-apple-darwin --bin ondo`
    // writes it there (make dmg builds it so).
    assert_eq!(
        bundled_file(&config, "MacOS/ondo"),
        Some("../target/aarch64-apple-darwin/release/ondo")
    );
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("[[bin]]\nname = \"ondo\"\n"),
        "the workspace root no longer builds a binary named ondo"
    );
}

#[test]
fn the_minimum_macos_is_one_the_kernels_load_on() {
    let config = tauri_config();
    let minimum = mac_bundle(&config)["minimumSystemVersion"]
        .as_str()
        .expect("bundle.macOS.minimumSystemVersion is missing");
    // mlx-metal 0.32.4's oldest wheel is for macOS 14.0 (its libmlx's
    // minimum and its metallib's header say so too); an older minimum
    // would let the app install where its kernels cannot load.
    let (major, minor) = minimum
        .split_once('.')
        .expect("minimumSystemVersion is MAJOR.MINOR, as the wheel's platform tag needs");
    let major: u32 = major.parse().unwrap();
    let _: u32 = minor.parse().unwrap();
    assert!(
        major >= 14,
        "minimumSystemVersion {minimum} is below macOS 14.0"
    );
}

#[test]
fn the_app_stays_out_of_the_dock() {
    // Tauri merges src-tauri/Info.plist into the bundle's.
    let path = repo_root().join("src-tauri/Info.plist");
    let plist = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing: LSUIElement lives there", path.display()));
    let after_key = plist
        .split_once("<key>LSUIElement</key>")
        .map(|(_, rest)| rest.trim_start())
        .expect("Info.plist has no LSUIElement");
    assert!(after_key.starts_with("<true/>"), "LSUIElement is not true");
}
