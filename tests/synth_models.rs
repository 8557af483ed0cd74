//! `ondo synth` writes folders that both Ondo and Python mlx-lm load, for
//! every preset and format, deterministically; bad input is refused clearly.

use std::path::Path;
use std::process::Command;

use ondo::engine::LoadError;
use ondo::engine::load::LoadedModel;
use ondo::family;
use ondo::run_kinds::LoopShape;
use ondo::synth::{self, SynthError, SynthOptions, WeightDtype};

fn options(preset: &str) -> SynthOptions {
    SynthOptions::for_preset(synth::preset_named(preset).expect("preset exists"))
}

fn write(options: &SynthOptions, dir: &Path) -> synth::SynthSummary {
    synth::write_model(options, dir, &mut |_| {}).expect("synth writes the model")
}

mod common;
use common::python;

/// Generates with mlx-lm; returns (prompt ids, generated ids).
fn mlx_lm_generate(python: &Path, dir: &Path, prompt: &str, tokens: usize) -> (Vec<u32>, Vec<u32>) {
    mlx_lm_generate_chunked(python, dir, prompt, tokens, 2048)
}

fn mlx_lm_generate_chunked(
    python: &Path,
    dir: &Path,
    prompt: &str,
    tokens: usize,
    prefill_step_size: usize,
) -> (Vec<u32>, Vec<u32>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mlx_lm_generate.py");
    let out = Command::new(python)
        .arg(script)
        .arg(dir)
        .args(["--prompt", prompt, "--max-tokens", &tokens.to_string()])
        .args(["--prefill-step-size", &prefill_step_size.to_string()])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "mlx-lm could not load {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let value: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let ids = |key: &str| -> Vec<u32> {
        value[key]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect()
    };
    (ids("prompt_ids"), ids("generated_ids"))
}

/// Ondo's greedy tokens for the same prompt ids, with both loop shapes
/// (which must agree with each other before they are compared with mlx-lm).
fn ondo_generate(dir: &Path, prompt_ids: &[u32], tokens: usize) -> Vec<u32> {
    let loaded = LoadedModel::load(dir).expect("Ondo loads the synthetic model");
    let run = |shape| {
        let mut cache = loaded.model.make_cache(None, None);
        ondo::engine::generate::TokenSteps::new(&loaded.model, &mut cache, prompt_ids)
            .unwrap()
            .with_loop_shape(shape)
            .take(tokens)
            .collect::<Result<Vec<u32>, _>>()
            .expect("generation runs")
    };
    let pipelined = run(LoopShape::Pipelined);
    assert_eq!(
        run(LoopShape::Sync),
        pipelined,
        "sync and pipelined loops agree"
    );
    pipelined
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn tiny_presets_load_in_mlx_lm_and_ondo_generates_the_same_tokens() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let variants: Vec<(&str, SynthOptions)> = vec![
        ("tiny-f32", options("tiny")),
        (
            "tiny-q4",
            SynthOptions {
                bits: Some(4),
                ..options("tiny")
            },
        ),
        (
            "tiny-q8-bf16",
            SynthOptions {
                bits: Some(8),
                dtype: WeightDtype::Bf16,
                group_size: 32,
                ..options("tiny")
            },
        ),
        (
            "tiny-qwen3",
            SynthOptions {
                arch: &family::QWEN3,
                ..options("tiny")
            },
        ),
    ];
    for (name, opts) in variants {
        let dir = root.path().join(name);
        write(&opts, &dir);
        let (prompt_ids, reference) = mlx_lm_generate(&python, &dir, "The temperature is 온도.", 8);
        assert_eq!(reference.len(), 8, "{name}: mlx-lm generated 8 tokens");
        let ours = ondo_generate(&dir, &prompt_ids, 8);
        assert_eq!(
            ours, reference,
            "{name}: Ondo's greedy tokens equal mlx-lm's"
        );
    }
}

/// Prompt lengths that take different paths: the BOS token alone (no cache
/// fill), and ~300 tokens (the cache grows past its first 256-position step
/// during prefill and keeps growing while decoding).
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn greedy_parity_holds_for_one_token_and_long_prompts() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("tiny");
    write(&options("tiny"), &dir);
    let long =
        "The prefill runs the whole prompt once; decode adds one token per step. ".repeat(20);
    for prompt in ["", long.as_str()] {
        let (prompt_ids, reference) = mlx_lm_generate(&python, &dir, prompt, 16);
        if prompt.is_empty() {
            assert_eq!(
                prompt_ids.len(),
                1,
                "an empty prompt is the BOS token alone"
            );
        } else {
            assert!(prompt_ids.len() > 256, "{} prompt tokens", prompt_ids.len());
        }
        assert_eq!(
            ondo_generate(&dir, &prompt_ids, 16),
            reference,
            "prompt of {} tokens",
            prompt_ids.len()
        );
    }
    // Prefill in chunks of 64 (the prompt is longer than the step size).
    let (prompt_ids, reference) = mlx_lm_generate_chunked(&python, &dir, &long, 16, 64);
    let loaded = LoadedModel::load(&dir).unwrap();
    let mut cache = loaded.model.make_cache(None, None);
    let ours = ondo::engine::generate::TokenSteps::new(&loaded.model, &mut cache, &prompt_ids)
        .unwrap()
        .with_prefill_step_size(64)
        .take(16)
        .collect::<Result<Vec<u32>, _>>()
        .unwrap();
    assert_eq!(
        ours,
        reference,
        "chunked prefill of {} tokens",
        prompt_ids.len()
    );
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn small_preset_shards_and_loads_in_both() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("small");
    let summary = write(
        &SynthOptions {
            max_shard_bytes: 100_000_000,
            ..options("small")
        },
        &dir,
    );
    assert!(
        summary.weight_files.len() >= 3,
        "{:?}",
        summary.weight_files
    );
    assert!(dir.join("model.safetensors.index.json").is_file());
    let (prompt_ids, reference) = mlx_lm_generate(&python, &dir, "hello", 3);
    assert_eq!(ondo_generate(&dir, &prompt_ids, 3), reference);
}

/// The real Llama 3.2 shapes, 4-bit bf16, as mlx-community ships them. They
/// are large for a CPU: two tokens each are enough to prove mlx-lm loads them.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn real_llama_shapes_load_in_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for preset in ["llama-3.2-1b", "llama-3.2-3b"] {
        let dir = root.path().join(preset);
        let summary = write(&options(preset), &dir);
        let expected_params = if preset == "llama-3.2-1b" {
            1.2e9
        } else {
            3.2e9
        };
        let params = summary.parameters as f64;
        assert!(
            (params / expected_params - 1.0).abs() < 0.05,
            "{preset}: {params} parameters"
        );
        let (_, generated) = mlx_lm_generate(&python, &dir, "hi", 2);
        assert_eq!(generated.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn same_seed_writes_identical_bytes_and_another_seed_does_not() {
    let root = tempfile::tempdir().unwrap();
    let read =
        |name: &str| std::fs::read(root.path().join(name).join("model.safetensors")).unwrap();
    let q4 = SynthOptions {
        bits: Some(4),
        ..options("tiny")
    };
    write(&q4, &root.path().join("a"));
    write(&q4, &root.path().join("b"));
    write(
        &SynthOptions {
            seed: 1,
            ..q4.clone()
        },
        &root.path().join("c"),
    );
    assert_eq!(read("a"), read("b"));
    assert_ne!(read("a"), read("c"));
    for file in ["tokenizer.json", "config.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(root.path().join("a").join(file)).unwrap(),
            std::fs::read(root.path().join("b").join(file)).unwrap(),
            "{file} is deterministic"
        );
    }
}

#[test]
fn quantized_layout_matches_mlx_community_checkpoints() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("q4");
    write(
        &SynthOptions {
            bits: Some(4),
            group_size: 64,
            ..options("tiny")
        },
        &dir,
    );
    let tensors = mlx_rs::Array::load_safetensors(dir.join("model.safetensors")).unwrap();
    let packed = &tensors["model.layers.0.mlp.gate_proj.weight"];
    assert_eq!(packed.dtype(), mlx_rs::Dtype::Uint32);
    // 512 x 256 at 4 bits: 8 values per uint32, 4 groups of 64 per row.
    assert_eq!(packed.shape(), &[512, 32]);
    assert_eq!(
        tensors["model.layers.0.mlp.gate_proj.scales"].shape(),
        &[512, 4]
    );
    assert_eq!(
        tensors["model.layers.0.mlp.gate_proj.biases"].shape(),
        &[512, 4]
    );
    // Embeddings are quantized too; norms are not.
    assert!(tensors.contains_key("model.embed_tokens.scales"));
    assert_eq!(tensors["model.norm.weight"].dtype(), mlx_rs::Dtype::Float32);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    assert_eq!(config["quantization"]["group_size"], 64);
}

#[test]
fn a_non_empty_folder_is_refused_unless_forced() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let err = synth::write_model(&options("tiny"), &dir, &mut |_| {}).unwrap_err();
    assert!(matches!(err, SynthError::TargetNotEmpty { .. }));
    assert_eq!(err.kind(), "folder_not_empty");
    assert!(err.to_string().contains("replace what is there"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "mine"
    );
    write(
        &SynthOptions {
            force: true,
            ..options("tiny")
        },
        &dir,
    );
    assert!(!dir.join("notes.txt").exists());
    assert!(dir.join("config.json").is_file());
}

#[test]
fn the_cli_says_which_flag_replaces_a_non_empty_folder() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(["synth", "tiny"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    // The message in the words the app uses too, then the CLI's own hint.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("error: ") && l.contains("is not empty")),
        "{stderr}"
    );
    assert!(
        lines.contains(&"hint: pass --force to replace what is there"),
        "{stderr}"
    );
    assert!(dir.join("notes.txt").is_file());
}

#[test]
fn an_unknown_preset_lists_the_valid_ones() {
    let err = synth::preset_named("huge").unwrap_err().to_string();
    for name in [
        "tiny",
        "small",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "llama-3.1-8b",
    ] {
        assert!(err.contains(name), "{err}");
    }
}

#[test]
fn broken_folders_are_named_errors() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    let summary = write(
        &SynthOptions {
            max_shard_bytes: 1_000_000,
            ..options("tiny")
        },
        &dir,
    );
    assert!(summary.weight_files.len() > 1, "{:?}", summary.weight_files);

    // A missing shard (an interrupted download).
    let shard = dir.join(&summary.weight_files[1]);
    let saved = std::fs::read(&shard).unwrap();
    std::fs::remove_file(&shard).unwrap();
    let err = LoadedModel::load(&dir).err().expect("missing shard fails");
    assert!(matches!(err, LoadError::ShardMissing { .. }), "{err}");
    std::fs::write(&shard, saved).unwrap();

    // A config whose shape disagrees with the tensors.
    let config_path = dir.join("config.json");
    let original = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        original.replace("\"intermediate_size\": 512", "\"intermediate_size\": 640"),
    )
    .unwrap();
    let err = LoadedModel::load(&dir).err().expect("shape mismatch fails");
    assert!(matches!(err, LoadError::TensorShape { .. }), "{err}");
    assert!(err.to_string().contains("mlp.gate_proj.weight"), "{err}");

    // An architecture Ondo does not run.
    std::fs::write(
        &config_path,
        original.replace("\"model_type\": \"llama\"", "\"model_type\": \"mamba\""),
    )
    .unwrap();
    let err = LoadedModel::load(&dir)
        .err()
        .expect("unknown model_type fails");
    assert!(
        matches!(err, LoadError::UnsupportedModelType { .. }),
        "{err}"
    );

    // No config at all.
    std::fs::remove_file(&config_path).unwrap();
    assert!(matches!(
        LoadedModel::load(&dir),
        Err(LoadError::ConfigMissing { .. })
    ));
}
