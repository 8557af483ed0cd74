extern crate cmake;

use std::{env, fs, path::PathBuf};

#[path = "src/bindgen_config.rs"]
mod bindgen_config;

// Ondo patch: every target links a prebuilt libmlx, the official wheel's
// (see linux/system_mlx.rs and PATCHES.md); the source build is gone.
#[path = "linux/system_mlx.rs"]
mod system_mlx;

fn main() {
    let mlx_c_root = PathBuf::from("src/mlx-c");
    // Ondo patch: `cargo check` for Apple targets from a machine without Metal
    // uses the checked-in bindings and builds nothing (see PATCHES.md).
    if system_mlx::is_apple_target() && system_mlx::is_check_only() {
        let out_path = PathBuf::from(env::var("OUT_DIR").unwrap());
        println!("cargo:rerun-if-changed=linux/check-only-bindings.rs");
        fs::copy("linux/check-only-bindings.rs", out_path.join("bindings.rs"))
            .expect("Couldn't copy the check-only bindings");
        return;
    }
    system_mlx::build_and_link(&mlx_c_root);

    let headers =
        bindgen_config::discover_headers(&mlx_c_root).expect("Unable to discover headers");
    for header in &headers {
        let relative =
            bindgen_config::relative_header(&mlx_c_root, header).expect("Unable to record header");
        println!(
            "cargo:rerun-if-changed={}",
            mlx_c_root.join(relative).display()
        );
    }
    let mut builder = bindgen_config::builder(&mlx_c_root, &headers);
    if !system_mlx::is_apple_target() {
        builder = system_mlx::adjust_bindgen(builder);
    }
    let bindings = builder
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("Unable to generate bindings");

    // Write the bindings to the $OUT_DIR/bindings.rs file.
    let out_path = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings
        .write_to_file(out_path.join("bindings.rs"))
        .expect("Couldn't write bindings!");
}
