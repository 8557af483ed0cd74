//! Every run is recorded, and recorded truthfully, whichever door it came
//! through: the first chat turn of a fresh process is a cold start with its
//! load time, `ondo demo` and `ondo bench --peer` land in the history with
//! their kinds, and a repo id is found in the models folder the app's
//! settings chose.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use ondo::app_settings::AppSettings;
use ondo::run_kinds::{LoadKind, RunKind};
use ondo::store::{RunQuery, RunRecord, Store};

/// `ondo ARGS` with its own data folder and Hugging Face cache, `stdin` fed
/// in.
fn ondo(root: &Path, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(args)
        .env("ONDO_HOME", root.join("ondo"))
        .env("HF_HOME", root.join("hf"))
        .env("ONDO_NO_KEYCHAIN", "1")
        .env_remove("MLX_CUDA_GRAPH_CACHE_SIZE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ondo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn history(root: &Path, kind: Option<RunKind>) -> Vec<RunRecord> {
    Store::open_default(&root.join("ondo"))
        .unwrap()
        .runs(&RunQuery {
            kind,
            include_warmup: true,
            ..RunQuery::default()
        })
        .unwrap()
}

#[test]
fn the_first_chat_turn_of_a_fresh_process_is_recorded_cold_with_its_load() {
    let root = tempfile::tempdir().unwrap();
    ondo(
        root.path(),
        &["chat", "tiny", "--max-tokens", "8"],
        "hi\nagain\n",
    );
    let turns = history(root.path(), Some(RunKind::Chat));
    assert_eq!(turns.len(), 2, "{turns:#?}");
    let (first, second) = (&turns[0], &turns[1]);
    assert_eq!(first.load_kind, LoadKind::Cold);
    assert!(first.load_ms > 0.0, "the load was not counted: {first:#?}");
    assert_eq!(second.load_kind, LoadKind::Warm);
    assert_eq!(second.load_ms, 0.0);
    assert!(second.cached_tokens > 0, "the second turn reused no cache");
    assert_eq!(first.conversation_id, second.conversation_id);
    assert_eq!(first.model_id, "tiny");

    // `ondo runs` says the same.
    let runs = ondo(root.path(), &["runs", "--kind", "chat"], "");
    let text = String::from_utf8_lossy(&runs.stdout);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("cold"), "{text}");
    assert!(lines[1].contains("warm"), "{text}");
}

#[test]
fn a_demo_is_recorded_as_one_cold_and_one_warm_run() {
    let root = tempfile::tempdir().unwrap();
    ondo(root.path(), &["demo", "--max-tokens", "4"], "");
    let runs = history(root.path(), Some(RunKind::Demo));
    let kinds: Vec<LoadKind> = runs.iter().map(|r| r.load_kind).collect();
    assert_eq!(kinds, [LoadKind::Cold, LoadKind::Warm]);
    assert!(runs[0].load_ms > 0.0);
    let listed = ondo(root.path(), &["runs", "--kind", "demo"], "");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), 3);
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn ondos_side_of_the_mlx_lm_comparison_is_recorded_as_one_benchmark() {
    let python = common::python();
    let root = tempfile::tempdir().unwrap();
    // mlx-lm runs with the user's environment, not the MLX settings Ondo
    // chose for itself (engine::mlx_settings): a Python that notes what it
    // was given, then is the real one.
    let seen = root.path().join("peer-env.txt");
    let noting_python = root.path().join("python");
    std::fs::write(
        &noting_python,
        format!(
            "#!/bin/sh\necho \"run MLX_CUDA_GRAPH_CACHE_SIZE=${{MLX_CUDA_GRAPH_CACHE_SIZE-unset}}\" >> '{}'\nexec '{}' \"$@\"\n",
            seen.display(),
            python.display()
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&noting_python).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&noting_python, permissions).unwrap();
    ondo(
        root.path(),
        &[
            "bench",
            "tiny",
            "--peer",
            "mlx-lm",
            "--python",
            noting_python.to_str().unwrap(),
            "--prompt-tokens",
            "16",
            "--gen",
            "4",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--loop",
            "pipelined",
            "--cold",
            "1",
        ],
        "",
    );
    let runs = history(root.path(), None);
    let bench_ids: std::collections::BTreeSet<_> =
        runs.iter().map(|r| r.bench_id.clone()).collect();
    assert_eq!(bench_ids.len(), 1, "one benchmark: {bench_ids:?}");
    assert!(bench_ids.iter().all(Option::is_some));
    let kinds: Vec<(RunKind, bool)> = runs.iter().map(|r| (r.kind, r.warmup)).collect();
    assert_eq!(
        kinds,
        [
            (RunKind::Bench, true),
            (RunKind::Bench, false),
            (RunKind::Bench, false),
            (RunKind::BenchCold, false),
        ]
    );
    assert_eq!(runs[0].load_kind, LoadKind::Cold, "the first run loaded");
    assert!(runs[3].fresh_process && runs[3].cold_start_ms.is_some());
    assert!(
        runs[..3]
            .iter()
            .all(|r| r.test.as_deref() == Some("pp16+tg4"))
    );
    // The cold start times process start to the first token only, as mlx-lm's does.
    assert_eq!(runs[3].test.as_deref(), Some("pp16+tg1"));
    // The warm worker and the cold run, neither with Ondo's setting.
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        "run MLX_CUDA_GRAPH_CACHE_SIZE=unset\nrun MLX_CUDA_GRAPH_CACHE_SIZE=unset\n"
    );
}

/// The comparison's JSON says whether the greedy tokens agreed, and how a
/// decode step of Ondo's spent the host's time and how large its graph is.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn the_mlx_lm_comparison_checks_tokens_and_shows_a_decode_steps_anatomy() {
    let python = common::python();
    let root = tempfile::tempdir().unwrap();
    let output = ondo(
        root.path(),
        &[
            "bench",
            "tiny",
            "--peer",
            "mlx-lm",
            "--python",
            python.to_str().unwrap(),
            "--prompt-tokens",
            "16",
            "--gen",
            "8",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--loop",
            "sync,pipelined",
            "--cold",
            "0",
            "--json",
        ],
        "",
    );
    assert!(output.status.success(), "{output:?}");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["token_verdict"], "identical", "{result}");
    assert_eq!(result["token_check"]["rounds"], 2);
    assert_eq!(result["token_check"]["departures"], serde_json::json!([]));
    let sides = result["results"].as_array().unwrap();
    let side = |name: &str| sides.iter().find(|s| s["side"] == name).unwrap();
    assert!(side("mlx-lm")["anatomy"].is_null());
    let nodes: Vec<u64> = ["ondo sync", "ondo pipelined"]
        .iter()
        .map(|name| {
            let anatomy = &side(name)["anatomy"];
            assert!(anatomy["host_build_ms"]["median"].as_f64().unwrap() > 0.0);
            assert!(anatomy["wait_ms"]["median"].as_f64().unwrap() > 0.0);
            assert_eq!(
                anatomy["host_build_ms"]["samples"]
                    .as_array()
                    .unwrap()
                    .len(),
                2
            );
            anatomy["graph_nodes"].as_u64().unwrap()
        })
        .collect();
    // Two layers of attention and MLP, a head and a greedy pick: dozens of
    // nodes, the same whichever loop builds them but for the reshape that
    // feeds the pipelined loop's lazy token back in.
    assert!(nodes[0] > 20, "{nodes:?}");
    assert_eq!(nodes[1], nodes[0] + 1, "{nodes:?}");
    assert!(
        side("ondo sync")["anatomy"]["scalar_inputs"]
            .as_u64()
            .is_some()
    );
}

/// `--kv-bits` quantizes the KV cache on both sides of the comparison:
/// Ondo's runs record it, mlx-lm is asked for it, and their greedy tokens
/// still agree; a bounded cache with it is refused before anything runs.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn the_mlx_lm_comparison_quantizes_both_sides_kv_caches_alike() {
    let python = common::python();
    let root = tempfile::tempdir().unwrap();
    let common_args = [
        "bench",
        "tiny",
        "--peer",
        "mlx-lm",
        "--python",
        python.to_str().unwrap(),
        "--prompt-tokens",
        "24",
        "--gen",
        "8",
        "--reps",
        "2",
        "--warmup",
        "0",
        "--loop",
        "pipelined",
        "--cold",
        "0",
        "--json",
        "--kv-bits",
        "4",
        "--kv-group-size",
        "32",
    ];
    let output = ondo(
        root.path(),
        &[&common_args[..], &["--quantized-kv-start", "0"]].concat(),
        "",
    );
    assert!(output.status.success(), "{output:?}");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["token_verdict"], "identical", "{result}");
    assert_eq!(result["plan"]["kv_bits"], 4, "{}", result["plan"]);
    let runs = history(root.path(), None);
    assert!(!runs.is_empty());
    assert!(runs.iter().all(|r| r.kv_bits == Some(4)), "{runs:?}");
    let refused = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args([&common_args[..], &["--max-kv-size", "64"]].concat())
        .env("ONDO_HOME", root.path().join("ondo"))
        .env("ONDO_NO_KEYCHAIN", "1")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--max-kv-size"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn a_repo_id_is_found_in_the_models_folder_the_app_chose() {
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join("my models");
    // The app saved a models folder of the user's choice.
    let mut store = Store::open_default(&root.path().join("ondo")).unwrap();
    AppSettings {
        models_folder: Some(folder.clone()),
        ..AppSettings::default()
    }
    .save(&mut store)
    .unwrap();
    drop(store);
    // A model downloaded there, in the hub cache's layout.
    let repo = folder.join("models--someone--tiny-copy");
    let snapshot = repo.join("snapshots").join("0123abcd");
    ondo(
        root.path(),
        &["synth", "tiny", snapshot.to_str().unwrap()],
        "",
    );
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();

    let out = ondo(
        root.path(),
        &[
            "run",
            "Someone/Tiny-Copy",
            "hi",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--json",
        ],
        "",
    );
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["generated_tokens"], 4);
    let runs = history(root.path(), Some(RunKind::Run));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].model_id, "someone/tiny-copy");
    assert_eq!(runs[0].model_revision.as_deref(), Some("0123abcd"));

    // A name that is nowhere says what there is.
    let missing = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(["run", "someone/elsewhere", "hi"])
        .env("ONDO_HOME", root.path().join("ondo"))
        .env("HF_HOME", root.path().join("hf"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(message.contains("someone/tiny-copy"), "{message}");
    assert!(message.contains("ondo pull someone/elsewhere"), "{message}");
}
