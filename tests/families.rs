//! One description per family (`ondo::family`), read alike by the engine and
//! by the fit estimate. For every family and every `ondo synth` preset (and
//! the family's mixture of experts where `--experts` makes one), the engine
//! builds the model from the tensors synth would write (zeros, made
//! lazily and never evaluated, so even the 8B shapes cost nothing), and what
//! it built agrees with the fit estimate of the same config.json: the
//! parameters, the KV cache per token, the layers a sliding window bounds,
//! and the context. The tiny preset is also run, and its cache measured.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};
use ondo::engine::cache::LayerCache;
use ondo::engine::model::decoder::Decoder;
use ondo::engine::weights::{StoredTensor, WeightMap};
use ondo::family::{self, FAMILIES, Family};
use ondo::hub::fit::ModelShape;
use ondo::synth::tokenizer::SynthTokenizer;
use ondo::synth::{self, SynthOptions, presets, weights};

/// A stand-in for the trained tokenizer: only its vocabulary size shapes
/// the model.
fn tokenizer(vocab_size: usize) -> SynthTokenizer {
    SynthTokenizer {
        vocab_size,
        bos_token_id: 0,
        eos_token_ids: vec![1],
        pad_token_id: 2,
    }
}

fn zeros(shape: &[i32], dtype: Dtype) -> Array {
    mlx_rs::ops::zeros_dtype(shape, dtype).expect("a lazy array")
}

/// The config.json synth would write, and the engine's model built from
/// the tensors it would write beside it.
fn built(options: &SynthOptions) -> (serde_json::Value, Decoder) {
    let planned = synth::plan_model(
        options,
        &tokenizer(options.preset.shape.tokenizer_vocab_size),
    )
    .expect("a plan");
    let mut tensors = HashMap::new();
    let extra = options
        .arch
        .synth
        .extra_tensors
        .iter()
        .map(|name| ((*name).to_owned(), vec![16], options.dtype.to_mlx()));
    let stored = planned
        .plan
        .iter()
        .flat_map(|tensor| weights::stored_layout(options, tensor))
        .chain(extra);
    for (name, shape, dtype) in stored {
        let array = zeros(&shape, dtype);
        let file = "model.safetensors".to_owned();
        tensors.insert(name, StoredTensor { array, file });
    }
    let settled = family::settle(&planned.config).expect("synth's config settles");
    let weights = WeightMap {
        dir: "/synth".into(),
        tensors,
    };
    let decoder = Decoder::load(&settled, Path::new("/synth/config.json"), weights)
        .unwrap_or_else(|e| panic!("{} {}: {e}", options.arch.model_type, options.preset.name));
    (planned.config, decoder)
}

fn options(family: &'static Family, preset: &presets::Preset) -> SynthOptions {
    let mut options = SynthOptions::for_preset(preset.clone());
    options.arch = family;
    options.sliding_window = 64;
    options
}

/// The folders of a family at a preset: as synth writes it, and its mixture
/// of experts too where the family has one of its own `model_type` that the
/// plain folder lacks (`--experts`: Gemma 4), each with a name.
fn variants(family: &'static Family, preset: &presets::Preset) -> Vec<(String, SynthOptions)> {
    let plain = options(family, preset);
    let name = format!("{} at {}", family.model_type, preset.name);
    let mixture = SynthOptions {
        experts: true,
        ..plain.clone()
    };
    let has_mixture = plain.shape().experts.is_none()
        && synth::plan_model(&mixture, &tokenizer(preset.shape.tokenizer_vocab_size)).is_ok();
    let mut out = vec![(name.clone(), plain)];
    if has_mixture {
        out.push((format!("{name} with experts"), mixture));
    }
    out
}

#[test]
fn the_engine_and_the_fit_estimate_read_every_family_alike() {
    for family in FAMILIES {
        for (what, options) in presets::all().iter().flat_map(|p| variants(family, p)) {
            let (config, decoder) = built(&options);
            let shape = ModelShape::from_config(&config, None).expect("sizable");
            assert_eq!(
                Some(decoder.parameters()),
                shape.parameters,
                "{what}: parameters"
            );
            let caches = decoder.layer_caches();
            assert_eq!(caches.len() as u64, shape.num_hidden_layers, "{what}");
            let element_bytes = shape.kv_dtype.bytes();
            let per_token: u64 = caches.iter().map(|(_, elements)| elements).sum();
            assert_eq!(
                per_token * element_bytes,
                shape.kv_bytes_per_token(),
                "{what}: KV bytes per token"
            );
            let windowed: Vec<i32> = caches.iter().filter_map(|(w, _)| *w).collect();
            match shape.sliding_window {
                Some(sliding) => {
                    assert_eq!(
                        windowed.len() as u64,
                        sliding.layers,
                        "{what}: sliding layers"
                    );
                    assert!(
                        windowed.iter().all(|&w| w as u64 == sliding.window_tokens),
                        "{what}: windows {windowed:?}"
                    );
                }
                None => assert!(windowed.is_empty(), "{what}: windows {windowed:?}"),
            }
            // The context the engine refuses prompts beyond is the one fit
            // caps the estimate at.
            let settled = family::settle(&config).unwrap();
            assert_eq!(
                settled.max_position_embeddings.map(|n| n as u64),
                shape.max_position_embeddings,
                "{what}: context"
            );
        }
    }
}

/// What the estimate says a cache holds is what the engine's caches hold
/// once a conversation has run, for every family at the tiny shape: a
/// prompt, then one token at a time past the sliding window, so the
/// windowed layers stop at it while the others keep every position.
#[test]
fn the_cache_the_engine_fills_is_the_one_fit_estimates() {
    let tiny = presets::find("tiny").unwrap();
    for (what, options) in FAMILIES.iter().flat_map(|f| variants(f, &tiny)) {
        let (config, decoder) = built(&options);
        let shape = ModelShape::from_config(&config, None).unwrap();
        let mut cache = decoder.make_cache(None, None);
        let prompt = Array::from_slice(&[5i32; 40], &[1, 40]);
        decoder.hidden(&prompt, &mut cache).unwrap().eval().unwrap();
        let one = Array::from_slice(&[7i32], &[1, 1]);
        for _ in 0..60 {
            decoder.hidden(&one, &mut cache).unwrap().eval().unwrap();
        }
        let held: usize = cache.iter().map(LayerCache::nbytes).sum();
        assert_eq!(
            held as u64,
            shape.kv_cache_bytes(100),
            "{what}: cache bytes after 100 positions"
        );
    }
}

/// The catalog's configs are what their families settle: each entry's
/// estimate comes from the description the engine builds from.
#[test]
fn every_catalog_entry_settles_with_its_family() {
    for entry in ondo::hub::catalog::catalog() {
        let config = entry.config();
        match family::find(entry.family) {
            Some(found) => {
                (found.settle)(&config).unwrap_or_else(|e| panic!("{}: {e}", entry.repo_id));
            }
            None => assert!(entry.unsupported().is_some(), "{}", entry.repo_id),
        }
    }
}

/// Runs the `ondo` binary with a private home, so each run is a fresh
/// process whose MLX memory is its own model's alone.
fn ondo_json(home: &Path, args: &[&str]) -> serde_json::Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args(args)
        .env("ONDO_HOME", home)
        .env("ONDO_NO_KEYCHAIN", "1")
        .output()
        .expect("ondo runs");
    assert!(
        output.status.success(),
        "ondo {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("ondo {} printed no JSON: {e}", args.join(" ")))
}

fn bytes_at(value: &serde_json::Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {value}"))
}

/// What `ondo fit` says a model holds at a context (its weights and its
/// cache) is what MLX measures once a run has reached that context, within
/// 10%, for every family in floats and at 4 bits: past the sliding window,
/// with the state layers' constant state and the mixtures' every expert.
#[test]
fn fit_agrees_with_the_memory_a_loaded_model_holds() {
    let root = tempfile::tempdir().unwrap();
    let home = root.path().join("home");
    let prompt = "Tell me everything about the weather in the mountains, \
                  the rivers that run down from them and the towns beside the rivers.";
    for family in FAMILIES {
        for bits in ["none", "4"] {
            let dir = root.path().join(format!("{}-{bits}", family.model_type));
            let dir_arg = dir.to_str().unwrap();
            ondo_json(
                &home,
                &[
                    "synth",
                    "tiny",
                    dir_arg,
                    "--arch",
                    family.model_type,
                    "--bits",
                    bits,
                    "--sliding-window",
                    "64",
                    "--json",
                ],
            );
            let run = ondo_json(
                &home,
                &[
                    "run",
                    dir_arg,
                    prompt,
                    "--raw",
                    "--max-tokens",
                    "160",
                    "--ignore-eos",
                    "--no-history",
                    "--json",
                ],
            );
            let context = bytes_at(&run, "prompt_tokens") + bytes_at(&run, "generated_tokens");
            let fit = ondo_json(
                &home,
                &["fit", dir_arg, "--context", &context.to_string(), "--json"],
            );
            let estimated = bytes_at(&fit, "weights_bytes") + bytes_at(&fit, "kv_cache_bytes");
            let measured = bytes_at(&run, "mlx_active_bytes");
            let off = estimated.abs_diff(measured) as f64 / measured as f64;
            assert!(
                off <= 0.10,
                "{} bits {bits} at {context} tokens: fit says {estimated} bytes \
                 (weights {} + cache {}), MLX holds {measured} ({:.1}% apart)",
                family.model_type,
                bytes_at(&fit, "weights_bytes"),
                bytes_at(&fit, "kv_cache_bytes"),
                off * 100.0
            );
            eprintln!(
                "{} bits {bits}: fit {estimated}, measured {measured} ({:+.1}%)",
                family.model_type,
                (estimated as f64 - measured as f64) / measured as f64 * 100.0
            );
        }
    }
}
