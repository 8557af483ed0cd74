//! The UI's TypeScript types and command calls are generated from the Rust
//! commands. This test fails when the committed `ui/src/lib/bindings.ts` no
//! longer matches them, so a changed Rust type cannot ship with a UI that
//! still expects the old one; `npm run check` then finds every use the
//! change breaks.

use std::path::Path;

#[test]
fn the_committed_bindings_match_the_rust_commands() {
    let generated = ondo_app::typescript_bindings().expect("the bindings export");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(ondo_app::BINDINGS_PATH);
    if std::env::var_os("ONDO_WRITE_BINDINGS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: a command or a type it uses changed in Rust. Regenerate it with\n  \
         ONDO_WRITE_BINDINGS=1 cargo test -p ondo-app --test bindings\n\
         then run `npm run check` in ui/ to see what the change breaks.",
        path.display()
    );
}

#[test]
fn every_command_is_in_the_bindings() {
    let generated = ondo_app::typescript_bindings().unwrap();
    // The pages call these by name; each must be generated with its types.
    for call in [
        "__TAURI_INVOKE<DoctorReport>(\"doctor_report\")",
        "__TAURI_INVOKE<RunRecord>(\"chat_send\"",
        "__TAURI_INVOKE<BenchResult>(\"run_benchmark\"",
        "__TAURI_INVOKE<Exported>(\"export_runs\"",
        "__TAURI_INVOKE<DownloadSummary>(\"download_model\"",
    ] {
        assert!(
            generated.contains(call),
            "missing from the bindings: {call}"
        );
    }
    // Errors are thrown as the CommandError the pages read, not wrapped.
    assert!(!generated.contains("typedError<"));
    assert!(generated.contains("export type CommandError = {"));
}
