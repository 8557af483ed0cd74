//! `ondo doctor` as a user runs it: what MLX computes here, and Ondo's own
//! environment variables that are set, each with what it does.

use std::process::Command;

fn doctor(args: &[&str]) -> (bool, String) {
    let home = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .arg("doctor")
        .args(args)
        .env("ONDO_HOME", home.path())
        .env("ONDO_NO_KEYCHAIN", "1")
        .env("ONDO_JOIN_PROJECTIONS", "0")
        .env("ONDO_API_KEY", "a-secret-key")
        .output()
        .expect("ondo runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn doctor_names_the_variables_set_and_never_a_keys_value() {
    let (healthy, text) = doctor(&[]);
    assert!(healthy, "{text}");
    assert!(
        text.contains("set          ONDO_JOIN_PROJECTIONS=0 (1 or 0: one matmul for q, k and v"),
        "{text}"
    );
    assert!(text.contains("set          ONDO_API_KEY=(set)"), "{text}");
    assert!(!text.contains("a-secret-key"), "{text}");

    let (_, json) = doctor(&["--json"]);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let names: Vec<&str> = report["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for name in [
        "ONDO_HOME",
        "ONDO_NO_KEYCHAIN",
        "ONDO_JOIN_PROJECTIONS",
        "ONDO_API_KEY",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert!(!json.contains("a-secret-key"));
    // MLX runs on the CPU here: no kernel of Ondo's own is checked, and
    // every check that runs passes.
    let checks = report["checks"].as_array().unwrap();
    assert!(checks.iter().all(|c| c["passed"] == true), "{checks:?}");
    assert!(
        checks.iter().all(|c| c["name"] != "Ondo's CUDA kernel"),
        "{checks:?}"
    );
}
