//! Ondo's engine produces exactly mlx-lm's tokens: greedy ids for 64 tokens
//! at prompt lengths 1, 7, 300 and longer than `prefill_step_size`, both
//! loop shapes, llama and qwen3 (and qwen2, mistral), fp32 / 4-bit / 8-bit, with and without a
//! rotating cache; qwen3_moe's routed experts the same way for 32 tokens;
//! first-step log-probabilities within a tolerance; a
//! follow-up turn on a kept cache equal to recomputing from scratch; and
//! Llama 3.2's scaled rope over a long prompt; Gemma 3 (text and
//! multimodal) across its sliding window and Phi-3 with longrope; SmolLM3's
//! layers without rope, Ministral 3 past its original context and Mistral 3's
//! multimodal checkpoints (`assert_family_equals_mlx_lm`); the joined
//! projections a GPU runs, and a 2048-token prompt's peak memory against
//! mlx-lm's; LFM2's short convolutions the same way, and a conversation on
//! its convolution states that prefills only what its cache lacks; Qwen 3.5
//! (gated DeltaNet layers beside gated attention, dense and with routed and
//! shared experts) the same way; GLM-4.5's grouped routing beside shared
//! experts and Qwen3-Next's gated DeltaNet layers with projections grouped
//! by key head the same way, and their checkpoints as transformers saves
//! them; and Gemma 4 (text and multimodal; KV-shared layers and per-layer
//! inputs, or experts beside the dense MLP).
//! The reference is Python mlx-lm 0.32.2 (on MLX 0.32.4) from the project
//! venv.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use ondo::engine::chat_template::ChatMessage;
use ondo::engine::generate::{DEFAULT_PREFILL_STEP_SIZE, TokenSteps};
use ondo::engine::load::LoadedModel;
use ondo::engine::{CancelToken, EngineHandle, GenerateRequest, Prompt};
use ondo::family::{self, Family};
use ondo::run_kinds::LoopShape;
use ondo::synth::{self, Shape, SynthOptions, WeightDtype};

const GENERATE: usize = 64;
/// Chunks of 128 make the 300-token prompt take three prefill passes.
const SMALL_PREFILL_STEP: usize = 128;
/// Smaller than prompt + answer, so the rotating cache wraps while
/// prefilling the long prompts and while decoding the short ones.
const ROTATING_SIZE: usize = 48;

mod common;
use common::python;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

/// mlx-lm loaded once in a child process, answering requests line by line.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(python: &Path, dir: &Path) -> Self {
        let mut child = Command::new(python)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bench/mlx_lm_peer.py"))
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python starts");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert!(ready.contains("\"ready\""), "mlx-lm peer: {ready}");
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        tokens: usize,
        step: usize,
        max_kv: Option<usize>,
    ) -> Vec<u32> {
        let request = serde_json::json!({
            "prompt_ids": prompt,
            "max_tokens": tokens,
            "prefill_step_size": step,
            "max_kv_size": max_kv,
        });
        writeln!(self.stdin, "{request}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).expect("peer answers JSON");
        assert_eq!(value["event"], "result", "mlx-lm peer: {line}");
        ids(&value["generated_ids"])
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin);
        let _ = self.child.wait();
    }
}

fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("a list of ids")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}

/// A prompt of `n` ordinary (non-special) token ids, the same every run.
fn prompt_of(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + 13) % 1900).collect()
}

fn variant(arch: &'static Family, bits: Option<u8>, dtype: WeightDtype) -> SynthOptions {
    SynthOptions {
        arch,
        bits,
        dtype,
        ..SynthOptions::for_preset(synth::preset_named("tiny").unwrap())
    }
}

fn ondo_tokens(
    engine: &EngineHandle,
    dir: &Path,
    prompt: &[u32],
    tokens: usize,
    step: usize,
    max_kv: Option<usize>,
    shape: LoopShape,
) -> Vec<u32> {
    let request = GenerateRequest {
        max_tokens: tokens,
        prefill_step_size: step,
        max_kv_size: max_kv,
        loop_shape: shape,
        ignore_eos: true,
        ..GenerateRequest::new(
            dir,
            Prompt::Tokens {
                ids: prompt.to_vec(),
            },
        )
    };
    engine
        .generate_blocking(request, CancelToken::new(), |_| {})
        .expect("Ondo generates")
        .token_ids
}

/// A synthetic model written under `root` as `name`.
fn synthesize(root: &Path, name: &str, options: &SynthOptions) -> PathBuf {
    let dir = root.join(name);
    synth::write_model(options, &dir, &mut |_| {}).unwrap();
    dir
}

/// Ondo's greedy ids for `prompt` equal `reference` in both loop shapes;
/// `case` opens the failure message. Returns the runs compared.
fn assert_both_loops_give(
    engine: &EngineHandle,
    dir: &Path,
    prompt: &[u32],
    step: usize,
    max_kv: Option<usize>,
    reference: &[u32],
    case: &str,
) -> usize {
    let loops = [LoopShape::Pipelined, LoopShape::Sync];
    for shape in loops {
        let ours = ondo_tokens(engine, dir, prompt, reference.len(), step, max_kv, shape);
        assert_eq!(ours, reference, "{case}, loop {shape}");
    }
    loops.len()
}

/// What one model's greedy tokens are compared with mlx-lm's over.
struct Sweep<'a> {
    /// Tokens generated in each run.
    tokens: usize,
    /// (prompt length, prefill step size) pairs.
    shapes: &'a [(usize, usize)],
    /// KV cache bounds; `None` is unbounded.
    max_kv_sizes: &'a [Option<usize>],
}

impl Sweep<'_> {
    /// mlx-lm generates once for each shape and cache bound, and Ondo must
    /// give the same ids in both loop shapes; the model is unloaded after.
    /// `name` opens every failure message. Returns the runs compared.
    fn assert_equal_to_mlx_lm(
        &self,
        engine: &EngineHandle,
        python: &Path,
        dir: &Path,
        name: &str,
    ) -> usize {
        let mut peer = Peer::start(python, dir);
        let mut compared = 0;
        for &(length, step) in self.shapes {
            for &max_kv in self.max_kv_sizes {
                let prompt = prompt_of(length);
                let reference = peer.generate(&prompt, self.tokens, step, max_kv);
                assert_eq!(reference.len(), self.tokens);
                compared += assert_both_loops_give(
                    engine,
                    dir,
                    &prompt,
                    step,
                    max_kv,
                    &reference,
                    &format!(
                        "{name}: prompt {length}, prefill step {step}, max_kv_size {max_kv:?}"
                    ),
                );
            }
        }
        drop(peer);
        engine.unload(dir).unwrap();
        compared
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn greedy_tokens_equal_mlx_lm_across_the_matrix() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let variants = [
        ("llama-f32", variant(&family::LLAMA, None, WeightDtype::F32)),
        (
            "llama-q4",
            variant(&family::LLAMA, Some(4), WeightDtype::F32),
        ),
        (
            "llama-q8-bf16",
            variant(&family::LLAMA, Some(8), WeightDtype::Bf16),
        ),
        ("qwen3-f32", variant(&family::QWEN3, None, WeightDtype::F32)),
        (
            "qwen3-q4",
            variant(&family::QWEN3, Some(4), WeightDtype::F32),
        ),
        (
            "qwen3-q8",
            variant(&family::QWEN3, Some(8), WeightDtype::F32),
        ),
        ("qwen2-f32", variant(&family::QWEN2, None, WeightDtype::F32)),
        (
            "mistral-q4",
            variant(&family::MISTRAL, Some(4), WeightDtype::F32),
        ),
    ];
    let sweep = Sweep {
        tokens: GENERATE,
        // (prompt length, prefill step): 300 > 128 takes three prefill chunks.
        shapes: &[(1, 2048), (7, 2048), (300, 2048), (300, SMALL_PREFILL_STEP)],
        max_kv_sizes: &[None, Some(ROTATING_SIZE)],
    };
    let mut compared = 0;
    for (name, options) in variants {
        let dir = synthesize(root.path(), name, &options);
        compared += sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, name);
    }
    assert_eq!(compared, 8 * 4 * 2 * 2);
}

/// `ondo bench --peer mlx-lm` on `dir` in a child process made to join the
/// projections (as on a GPU) and asking for Ondo's CUDA matrix-vector
/// kernel (which the CPU must ignore): its JSON report.
fn bench_joined(
    python: &Path,
    dir: &Path,
    home: &Path,
    prompts: &str,
    tokens: &str,
) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_ondo"))
        .args([
            "bench",
            dir.to_str().unwrap(),
            "--peer",
            "mlx-lm",
            "--python",
        ])
        .arg(python)
        .args(["--prompt-tokens", prompts, "--gen", tokens, "--reps", "1"])
        .args([
            "--warmup",
            "0",
            "--cold",
            "0",
            "--loop",
            "pipelined,sync",
            "--json",
        ])
        .env("ONDO_JOIN_PROJECTIONS", "1")
        // Ondo's CUDA matrix-vector kernel asked for too: without CUDA it
        // must change nothing (the tokens below are checked against mlx-lm).
        .env("ONDO_CUDA_MATVEC", "1")
        .env("ONDO_HOME", home)
        .output()
        .expect("ondo runs");
    assert!(
        output.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("bench prints JSON")
}

/// The joined projections (one matmul for q, k and v, one for gate and up,
/// one rope over the q and k heads) run on a GPU only, so the tests above,
/// on the CPU, run the parts. Here a child `ondo bench --peer mlx-lm` is made
/// to join them on the CPU: its tokens must be mlx-lm's, with q/k norms
/// (qwen3) and without (llama), Qwen 3.5's four gated DeltaNet inputs
/// and shared expert joined, GLM-4.5's biased q, k and v and ungated
/// shared expert, Qwen3-Next's two grouped DeltaNet inputs, and Gemma 4's
/// queries and keys where its values are the keys, through a prefill and
/// 32 decode steps.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn joined_projections_give_mlx_lm_tokens() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for (name, options) in [
        (
            "llama-q4",
            variant(&family::LLAMA, Some(4), WeightDtype::F32),
        ),
        (
            "qwen3-q4",
            variant(&family::QWEN3, Some(4), WeightDtype::Bf16),
        ),
        (
            "qwen3_5-q4",
            variant(&family::QWEN3_5, Some(4), WeightDtype::Bf16),
        ),
        (
            "qwen3_5_moe-q4",
            variant(&family::QWEN3_5_MOE, Some(4), WeightDtype::F32),
        ),
        (
            "glm4_moe-q4",
            variant(&family::GLM4_MOE, Some(4), WeightDtype::F32),
        ),
        (
            "qwen3_next-q4",
            variant(&family::QWEN3_NEXT, Some(4), WeightDtype::F32),
        ),
        (
            "gemma4-experts-q4",
            gemma4(&family::GEMMA4_TEXT, true, Some(4)),
        ),
    ] {
        let dir = synthesize(root.path(), name, &options);
        let report = bench_joined(&python, &dir, &root.path().join("home"), "7,300", "32");
        assert_eq!(report["token_verdict"], "identical", "{name}: {report}");
        // Asked for, Ondo's CUDA kernel is not taken without CUDA.
        assert_eq!(
            report["token_check"]["own_cuda_kernel"], false,
            "{name}: {report}"
        );
    }
}

/// A long prompt costs no more memory than in mlx-lm with the projections
/// joined: the peak of a 2048-token prompt prefilled in one chunk, on a
/// model whose MLP is wide enough that its activations dominate the peak.
/// (A prefill through the joined matmul, its outputs views of one array,
/// peaked at 1.11x mlx-lm's here and at 1.29x on the 8B shape on a GPU; the
/// prefill runs the parts since.)
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn a_long_prompt_peaks_no_higher_than_in_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let mut options = variant(&family::LLAMA, None, WeightDtype::F32);
    options.preset.shape.intermediate_size = 2048;
    let dir = synthesize(root.path(), "wide-mlp", &options);
    let report = bench_joined(&python, &dir, &root.path().join("home"), "2048", "4");
    assert_eq!(report["token_verdict"], "identical", "{report}");
    let results = report["results"].as_array().expect("results");
    let peak =
        |side: &serde_json::Value| side["mlx_peak_bytes"]["median"].as_f64().expect("a peak");
    let theirs = results
        .iter()
        .find(|r| r["side"] == "mlx-lm")
        .map(peak)
        .expect("mlx-lm's side");
    let ours: Vec<_> = results.iter().filter(|r| r["side"] != "mlx-lm").collect();
    assert_eq!(ours.len(), 2, "both loop shapes");
    for side in ours {
        assert!(
            peak(side) <= theirs * 1.03,
            "{}: Ondo peaked at {} bytes, mlx-lm at {theirs}",
            side["side"],
            peak(side)
        );
    }
}

/// Gemma 3's sliding window in the synthetic folders: prompts of 40 tokens
/// cross it, and so do 64 generated tokens after any prompt.
const GEMMA_WINDOW: usize = 16;

fn gemma(arch: &'static Family, bits: Option<u8>, dtype: WeightDtype) -> SynthOptions {
    SynthOptions {
        sliding_window: GEMMA_WINDOW,
        ..variant(arch, bits, dtype)
    }
}

/// The families beyond the llama shape: gemma3 (text and multimodal,
/// sliding-window layers beside full ones) and phi3 (fused projections,
/// partial rotary, longrope). A rotating cache only for phi3: mlx-lm gives
/// Gemma its own per-layer caches and ignores `max_kv_size` there.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn greedy_tokens_of_gemma3_and_phi3_equal_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let variants = [
        (
            "gemma3-text-f32",
            gemma(&family::GEMMA3_TEXT, None, WeightDtype::F32),
        ),
        (
            "gemma3-text-q4",
            gemma(&family::GEMMA3_TEXT, Some(4), WeightDtype::F32),
        ),
        (
            "gemma3-multimodal-q8-bf16",
            gemma(&family::GEMMA3, Some(8), WeightDtype::Bf16),
        ),
        ("phi3-f32", variant(&family::PHI3, None, WeightDtype::F32)),
        ("phi3-q4", variant(&family::PHI3, Some(4), WeightDtype::F32)),
        ("phi3-q8", variant(&family::PHI3, Some(8), WeightDtype::F32)),
    ];
    // (prompt length, prefill step): 40 crosses Gemma's window, and in
    // chunks of 16 takes three prefill passes.
    let shapes = [(1, 2048), (7, 2048), (40, 2048), (40, GEMMA_WINDOW)];
    let mut compared = 0;
    for (name, options) in variants {
        let dir = synthesize(root.path(), name, &options);
        let sweep = Sweep {
            tokens: GENERATE,
            shapes: &shapes,
            max_kv_sizes: if options.arch == &family::PHI3 {
                &[None, Some(ROTATING_SIZE)]
            } else {
                &[None]
            },
        };
        compared += sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, name);
    }
    assert_eq!(compared, (3 * 4 + 3 * 4 * 2) * 2);
}

/// Tokens compared per run for the experts models: enough to pass through
/// many routing decisions, half the dense matrix's length to keep CI short.
const EXPERTS_GENERATE: usize = 32;

/// Qwen3-MoE (8 experts, 2 per token) in fp32, 4-bit, 8-bit and with
/// mxfp4 experts (`moe_variants`): greedy ids
/// equal mlx-lm's for a 1- and a 7-token prompt (a handful of routed
/// pairs, taken unsorted), and a 300-token one in one pass and in 128-token
/// chunks (hundreds of pairs, sorted by expert first), in both loop shapes.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn qwen3_moe_greedy_tokens_equal_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (300, 2048), (300, SMALL_PREFILL_STEP)],
        max_kv_sizes: &[None],
    };
    let mut compared = 0;
    for (name, options) in moe_variants() {
        let dir = synthesize(root.path(), name, &options);
        compared +=
            sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, &format!("qwen3_moe {name}"));
    }
    assert_eq!(compared, 4 * 4 * 2);
}

/// The experts models compared with mlx-lm. Quantized ones keep the router
/// at 8 bits with a per-module entry in config.json, as mlx-lm's converter
/// writes Qwen3-MoE; the last has mxfp4 experts and the rest affine 8-bit.
fn moe_variants() -> [(&'static str, SynthOptions); 4] {
    [
        ("f32", variant(&family::QWEN3_MOE, None, WeightDtype::F32)),
        ("q4", variant(&family::QWEN3_MOE, Some(4), WeightDtype::F32)),
        ("q8", variant(&family::QWEN3_MOE, Some(8), WeightDtype::F32)),
        (
            "q8-mxfp4-experts",
            SynthOptions {
                experts_mxfp4: true,
                ..variant(&family::QWEN3_MOE, Some(8), WeightDtype::F32)
            },
        ),
    ]
}

/// A checkpoint's tensors by name.
type Tensors = std::collections::HashMap<String, mlx_rs::Array>;

/// Tensors to write, with their names.
type NamedTensors = Vec<(String, mlx_rs::Array)>;

/// A copy of the model folder `from` at `to` whose `model.safetensors`
/// holds the tensors `rewrite` makes of the original's.
fn copy_with_tensors(from: &Path, to: &Path, rewrite: impl FnOnce(Tensors) -> NamedTensors) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "model.safetensors" {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    let tensors = mlx_rs::Array::load_safetensors(from.join("model.safetensors")).unwrap();
    let rewritten = rewrite(tensors);
    mlx_rs::Array::save_safetensors(
        rewritten.iter().map(|(n, a)| (n, a)),
        &std::collections::HashMap::<String, String>::new(),
        to.join("model.safetensors"),
    )
    .unwrap();
}

/// transformers saves each expert's projections as their own tensors
/// (`mlp.experts.{e}.up_proj.weight`); Ondo stacks them at load, as mlx-lm
/// does, and answers exactly as from the stacked checkpoint.
#[test]
fn qwen3_moe_experts_saved_one_by_one_load_as_stacked() {
    let root = tempfile::tempdir().unwrap();
    let options = variant(&family::QWEN3_MOE, None, WeightDtype::F32);
    let stacked = synthesize(root.path(), "stacked", &options);
    let per_expert = root.path().join("per-expert");
    copy_with_tensors(&stacked, &per_expert, experts_one_by_one);
    let prompt = prompt_of(7);
    assert_eq!(
        ondo_first_logprobs(&per_expert, &prompt, DEFAULT_PREFILL_STEP_SIZE),
        ondo_first_logprobs(&stacked, &prompt, DEFAULT_PREFILL_STEP_SIZE),
    );
}

/// gpt-oss (8 experts, 2 per token, with biases and the clamped SwiGLU;
/// sinks; sliding layers of `GEMMA_WINDOW` positions beside full ones;
/// yarn rope) in fp32 and as mlx-community ships it (mxfp4 experts, 8-bit
/// affine elsewhere): greedy ids equal mlx-lm's at prompts of 1, 7 and 40
/// tokens (across the window), one pass and in window-sized chunks, both
/// loops; first-step log-probabilities at 7 and 40 within 1e-4.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn gpt_oss_equals_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let oss = |bits, mxfp4| SynthOptions {
        sliding_window: GEMMA_WINDOW,
        experts_mxfp4: mxfp4,
        ..variant(&family::GPT_OSS, bits, WeightDtype::F32)
    };
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, GEMMA_WINDOW)],
        max_kv_sizes: &[None],
    };
    let mut compared = 0;
    for (name, options) in [("f32", oss(None, false)), ("mxfp4-q8", oss(Some(8), true))] {
        let dir = synthesize(root.path(), name, &options);
        compared +=
            sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, &format!("gpt_oss {name}"));
        assert_first_logprobs_near_mlx_lm(
            &python,
            root.path(),
            &dir,
            &format!("gpt_oss {name}"),
            &[7, 40],
        );
    }
    assert_eq!(compared, 2 * 4 * 2);
}

/// mlx-lm's log-probabilities over the vocabulary for the first token
/// after `prompt` (written through `path`).
fn mlx_lm_first_logprobs(python: &Path, dir: &Path, prompt: &[u32], path: &Path) -> Vec<f32> {
    let ids_arg = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    mlx_lm_generate(
        python,
        dir,
        &[
            "--prompt-ids",
            &ids_arg,
            "--max-tokens",
            "1",
            "--logits-out",
            path.to_str().unwrap(),
        ],
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs mlx_lm_generate.py; returns its JSON.
fn mlx_lm_generate(python: &Path, dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(python)
        .arg(script("mlx_lm_generate.py"))
        .arg(dir)
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "mlx-lm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn first_step_log_probabilities_match_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for (name, options, tolerance) in [
        (
            "llama-f32",
            variant(&family::LLAMA, None, WeightDtype::F32),
            1e-4,
        ),
        (
            "qwen3-q4",
            variant(&family::QWEN3, Some(4), WeightDtype::F32),
            1e-4,
        ),
        (
            "qwen3_moe-f32",
            variant(&family::QWEN3_MOE, None, WeightDtype::F32),
            1e-4,
        ),
        (
            "qwen3_moe-q4",
            variant(&family::QWEN3_MOE, Some(4), WeightDtype::F32),
            1e-4,
        ),
        (
            "qwen3_moe-q8-mxfp4-experts",
            moe_variants()[3].1.clone(),
            1e-4,
        ),
        (
            "gemma3-text-f32",
            gemma(&family::GEMMA3_TEXT, None, WeightDtype::F32),
            1e-4,
        ),
        (
            "phi3-q4",
            variant(&family::PHI3, Some(4), WeightDtype::F32),
            1e-4,
        ),
        // bf16 rounds each layer's output: a looser bound.
        (
            "llama-q8-bf16",
            variant(&family::LLAMA, Some(8), WeightDtype::Bf16),
            5e-2,
        ),
    ] {
        let dir = synthesize(root.path(), name, &options);
        // 300 tokens route 600 (token, expert) pairs: the experts' sorted path.
        let lengths: &[usize] = if name.starts_with("qwen3_moe") {
            &[7, 300]
        } else {
            &[7]
        };
        for &length in lengths {
            let prompt = prompt_of(length);
            let logits_path = root.path().join(format!("{name}-{length}.json"));
            let reference = mlx_lm_first_logprobs(&python, &dir, &prompt, &logits_path);

            let ours = ondo_first_logprobs(&dir, &prompt, DEFAULT_PREFILL_STEP_SIZE);
            let worst = largest_difference(&ours, &reference);
            assert!(
                worst <= tolerance,
                "{name}, prompt {length}: largest log-probability difference {worst} > {tolerance}"
            );
        }
    }
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn follow_up_turn_on_the_kept_cache_equals_mlx_lm_and_a_fresh_run() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    for (name, options) in [
        ("llama-f32", variant(&family::LLAMA, None, WeightDtype::F32)),
        (
            "qwen3-q4",
            variant(&family::QWEN3, Some(4), WeightDtype::F32),
        ),
        // Gemma's own window (512): a cache that has not wrapped can drop
        // the first turn's diverging tail, in both programs. Seed 1: with
        // seed 0 this random model says the end-of-turn token mid-answer,
        // which mlx-lm's decode keeps in the history and Ondo's drops.
        (
            "gemma3-text-q4",
            SynthOptions {
                seed: 1,
                ..variant(&family::GEMMA3_TEXT, Some(4), WeightDtype::F32)
            },
        ),
        ("phi3-f32", variant(&family::PHI3, None, WeightDtype::F32)),
        (
            "qwen3_moe-q4",
            variant(&family::QWEN3_MOE, Some(4), WeightDtype::F32),
        ),
    ] {
        let dir = synthesize(root.path(), name, &options);
        assert_follow_up_turn_equals_mlx_lm(&engine, &python, &dir, name, FollowUpReuse::AsMlxLm);
    }
}

/// What a follow-up turn reuses of the kept cache.
#[derive(Clone, Copy)]
enum FollowUpReuse {
    /// As many tokens as mlx-lm's prompt cache (a KV cache trims to the
    /// common prefix).
    AsMlxLm,
    /// The first prompt up to its last token: a model with state layers
    /// cannot drop the first answer's re-rendered tail, so mlx-lm starts
    /// over and Ondo goes back to the snapshot it kept at the end of the
    /// first prompt's prefill.
    PrefillSnapshot,
}

/// A chat turn and a follow-up on the kept cache give mlx-lm's tokens, the
/// follow-up reuses what `reuse` says, and it equals the same history
/// recomputed from scratch.
fn assert_follow_up_turn_equals_mlx_lm(
    engine: &EngineHandle,
    python: &Path,
    dir: &Path,
    name: &str,
    reuse: FollowUpReuse,
) {
    let (first, second) = ("What is the temperature today?", "And tomorrow?");
    let reference = mlx_lm_generate(
        python,
        dir,
        &[
            "--prompt",
            first,
            "--chat",
            "--max-tokens",
            "12",
            "--followup",
            second,
            "--followup-tokens",
            "12",
        ],
    );
    let chat = |messages: Vec<ChatMessage>, conversation: Option<&str>| {
        let request = GenerateRequest {
            max_tokens: 12,
            ignore_eos: true,
            conversation: conversation.map(str::to_owned),
            ..GenerateRequest::new(dir, Prompt::chat(None, messages))
        };
        engine
            .generate_blocking(request, CancelToken::new(), |_| {})
            .expect("Ondo generates")
    };
    let turn1 = chat(vec![ChatMessage::user(first)], Some("c"));
    assert_eq!(
        turn1.token_ids,
        ids(&reference["generated_ids"]),
        "{name}: turn 1"
    );
    let history = vec![
        ChatMessage::user(first),
        // mlx-lm puts its decoded text back in the history: the raw
        // text, before any split.
        ChatMessage::assistant(turn1.raw_text.clone()),
        ChatMessage::user(second),
    ];
    let turn2 = chat(history.clone(), Some("c"));
    assert_eq!(
        turn2.stats.prompt_tokens,
        ids(&reference["followup_prompt_ids"]).len(),
        "{name}: the follow-up prompt renders to mlx-lm's tokens"
    );
    match reuse {
        FollowUpReuse::AsMlxLm => {
            assert!(
                turn2.stats.cached_tokens > 0,
                "{name}: the cache was reused"
            );
            assert_eq!(
                turn2.stats.cached_tokens as u64,
                reference["followup_cached_tokens"].as_u64().unwrap(),
                "{name}: as many tokens reused as mlx-lm's prompt cache"
            );
        }
        FollowUpReuse::PrefillSnapshot => {
            assert_eq!(
                reference["followup_cached_tokens"].as_u64(),
                Some(0),
                "{name}: mlx-lm cannot trim the answer's tail and starts over"
            );
            assert_eq!(
                turn2.stats.cached_tokens,
                turn1.stats.prompt_tokens - 1,
                "{name}: Ondo reuses the first prompt up to its last token"
            );
        }
    }
    assert_eq!(
        turn2.stats.cached_tokens + turn2.stats.prefill_tokens,
        turn2.stats.prompt_tokens
    );
    assert_eq!(
        turn2.token_ids,
        ids(&reference["followup_generated_ids"]),
        "{name}: turn 2 equals mlx-lm's"
    );
    let fresh = chat(history, None);
    assert_eq!(fresh.stats.cached_tokens, 0);
    assert_eq!(
        fresh.token_ids, turn2.token_ids,
        "{name}: reuse equals recompute"
    );
}

/// Ondo's first-step log-probabilities for `prompt`, prefilled in chunks
/// of `step`.
fn ondo_first_logprobs(dir: &Path, prompt: &[u32], step: usize) -> Vec<f32> {
    let loaded = LoadedModel::load(dir).unwrap();
    let mut cache = loaded.model.make_cache(None, None);
    let mut steps = TokenSteps::new(&loaded.model, &mut cache, prompt)
        .unwrap()
        .with_prefill_step_size(step);
    steps.next().unwrap().unwrap();
    let logprobs = steps
        .last_logprobs()
        .unwrap()
        .as_dtype(mlx_rs::Dtype::Float32)
        .unwrap();
    logprobs.eval().unwrap();
    logprobs.as_slice::<f32>().to_vec()
}

/// The first step's log-probabilities after prompts of each of `lengths`
/// are within 1e-4 of mlx-lm's (its answers written under `scratch`).
fn assert_first_logprobs_near_mlx_lm(
    python: &Path,
    scratch: &Path,
    dir: &Path,
    name: &str,
    lengths: &[usize],
) {
    for &length in lengths {
        let prompt = prompt_of(length);
        let file = format!("{}-{length}.json", name.replace(' ', "-"));
        let reference = mlx_lm_first_logprobs(python, dir, &prompt, &scratch.join(file));
        let ours = ondo_first_logprobs(dir, &prompt, DEFAULT_PREFILL_STEP_SIZE);
        let worst = largest_difference(&ours, &reference);
        assert!(
            worst <= 1e-4,
            "{name}, prompt {length}: largest log-probability difference {worst}"
        );
    }
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vocabulary size");
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

/// Llama 3.2's rope as its config.json has it (`rope_type: llama3`, factor
/// 32, low and high frequency factors 1 and 4 around 8192 original
/// positions, rope_theta 500000, head_dim 64) on a model small in layers
/// and width, over a 3000-token prompt: greedy ids equal mlx-lm's token for
/// token, and so do the first step's log-probabilities, within 1e-4. The
/// scaling divides the slow frequencies by 32, which at positions this far
/// apart turns them by a different angle altogether; the same weights
/// without it give log-probabilities far outside the tolerance, so the
/// comparison cannot pass with the scaling ignored or misapplied. (Greedy
/// ids of random weights repeat one token, which no rope changes: the
/// log-probabilities are what tells.)
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn llama3_rope_scaling_equals_mlx_lm_on_the_real_llama_3_2_rope() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let real = synth::preset_named("llama-3.2-1b").unwrap();
    let mut preset = real.clone();
    preset.shape = Shape {
        hidden_size: 256,
        intermediate_size: 512,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        vocab_size: 2048,
        tokenizer_vocab_size: 2048,
        ..real.shape.clone()
    };
    let options = SynthOptions {
        bits: None,
        dtype: WeightDtype::F32,
        ..SynthOptions::for_preset(preset)
    };
    let dir = synthesize(root.path(), "llama3-rope", &options);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["rope_scaling"],
        serde_json::json!({
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }),
        "not Llama 3.2's rope_scaling block"
    );
    assert_eq!(config["rope_theta"], 500_000.0);
    assert_eq!(config["head_dim"], 64);

    let prompt = prompt_of(3000);
    let step = 512;
    let logits_path = root.path().join("mlx-lm-logprobs.json");
    let ids_arg = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let reference = mlx_lm_generate(
        &python,
        &dir,
        &[
            "--prompt-ids",
            &ids_arg,
            "--max-tokens",
            &GENERATE.to_string(),
            "--prefill-step-size",
            &step.to_string(),
            "--logits-out",
            logits_path.to_str().unwrap(),
        ],
    );
    let reference_ids = ids(&reference["generated_ids"]);
    assert_eq!(reference_ids.len(), GENERATE);
    let reference_logprobs: Vec<f32> =
        serde_json::from_str(&std::fs::read_to_string(&logits_path).unwrap()).unwrap();

    let engine = EngineHandle::spawn().unwrap();
    assert_both_loops_give(
        &engine,
        &dir,
        &prompt,
        step,
        None,
        &reference_ids,
        "llama3 rope: prompt 3000, prefill step 512",
    );
    drop(engine);
    let tolerance = 1e-4;
    let worst = largest_difference(
        &ondo_first_logprobs(&dir, &prompt, step),
        &reference_logprobs,
    );
    assert!(
        worst <= tolerance,
        "largest log-probability difference from mlx-lm {worst} > {tolerance}"
    );

    // The same weights with the rope unscaled: the prompt is long enough
    // for the scaling to change what the model says.
    let unscaled = root.path().join("llama3-rope-removed");
    std::fs::create_dir_all(&unscaled).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), unscaled.join(entry.file_name())).unwrap();
    }
    let mut plain = config.clone();
    plain.as_object_mut().unwrap().remove("rope_scaling");
    std::fs::write(unscaled.join("config.json"), plain.to_string()).unwrap();
    let apart = largest_difference(
        &ondo_first_logprobs(&unscaled, &prompt, step),
        &reference_logprobs,
    );
    assert!(
        apart > 20.0 * tolerance,
        "without the scaling the log-probabilities move by only {apart}: the prompt is too short to test it"
    );
    eprintln!("llama3 rope: {worst:e} from mlx-lm; {apart:e} without the scaling");
}

/// The benchmark's near-tie check (`bench::token_check`) rests on mlx-lm's
/// own scores at the token where Ondo's greedy tokens would leave its: the
/// two candidates' logits with the model in float32, and how far rounding in
/// the model's dtype moves a logit there. On a bfloat16 model that rounding
/// is above zero and the least likely token lies far beyond it, so a kernel
/// that picked it would be reported as a bug; on a float32 model nothing
/// rounds, so the check is as strict as token equality.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn mlx_lm_scores_a_departure_against_float32() {
    use ondo::bench::peer::MlxLmPeer;
    use ondo::bench::token_check::TieScore;
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let prompt = prompt_of(7);
    for (name, options) in [
        (
            "llama-q4-bf16",
            variant(&family::LLAMA, Some(4), WeightDtype::Bf16),
        ),
        ("llama-f32", variant(&family::LLAMA, None, WeightDtype::F32)),
    ] {
        let dir = synthesize(root.path(), name, &options);
        let logprobs =
            mlx_lm_first_logprobs(&python, &dir, &prompt, &root.path().join("logits.json"));
        let least = (0..logprobs.len())
            .min_by(|&a, &b| logprobs[a].total_cmp(&logprobs[b]))
            .unwrap() as u32;
        let mut peer = MlxLmPeer::start(&python, &dir).unwrap();
        let greedy = peer
            .generate(&prompt, 1, 2048, None, &Default::default())
            .unwrap()
            .generated_ids[0];
        let tie = |tokens: [u32; 2], peer: &mut MlxLmPeer| {
            let score = peer.score(&prompt, tokens, prompt.len() - 1).unwrap();
            assert!(score.logits[0] >= score.logits[1], "{name}: {score:?}");
            assert_eq!(score.routing, None, "{name}: llama routes nothing");
            TieScore::new(
                tokens[0],
                tokens[1],
                score.logits_f32[0] - score.logits_f32[1],
                score.rounding,
                None,
            )
        };
        let same = tie([greedy, greedy], &mut peer);
        assert_eq!(same.gap_f32, 0.0, "{name}");
        assert!(same.is_near_tie(), "{name}");
        let far = tie([greedy, least], &mut peer);
        assert!(!far.is_near_tie(), "{name}: {far:?}");
        if name.ends_with("f32") {
            assert_eq!(far.rounding, 0.0, "{name}: float32 rounds nothing more");
        } else {
            assert!(far.rounding > 0.0, "{name}: {far:?}");
            assert!(far.gap_f32 > 100.0 * far.rounding, "{name}: {far:?}");
        }
        // The model scored in float32 is back in its own dtype afterwards:
        // the same question gets the same rounding, and generation goes on.
        assert_eq!(tie([greedy, least], &mut peer), far, "{name}");
        let again = peer
            .generate(&prompt, 1, 2048, None, &Default::default())
            .unwrap()
            .generated_ids[0];
        assert_eq!(again, greedy, "{name}");
    }
}

/// For a model with routed experts mlx-lm also names the expert choice
/// nearest to a tie over the positions it was asked about (the token
/// check's `RoutingTie`): a layer that has experts, a position in that
/// range, a margin of at least zero, and a rounding above zero in bfloat16
/// and exactly zero in float32, ranking what the family ranks (qwen3_moe a
/// softmax, gpt-oss its router's logits). Scoring leaves the model as it
/// was: generation afterwards gives the same tokens.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn mlx_lm_scores_the_expert_choice_nearest_to_a_tie() {
    use ondo::bench::peer::MlxLmPeer;
    use ondo::bench::token_check::RouterScores;
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let prompt = prompt_of(9);
    for (name, options, ranks) in [
        (
            "qwen3_moe-q4-bf16",
            variant(&family::QWEN3_MOE, Some(4), WeightDtype::Bf16),
            RouterScores::Softmax,
        ),
        (
            "qwen3_moe-f32",
            variant(&family::QWEN3_MOE, None, WeightDtype::F32),
            RouterScores::Softmax,
        ),
        (
            "gpt_oss-q4-bf16",
            variant(&family::GPT_OSS, Some(4), WeightDtype::Bf16),
            RouterScores::Logits,
        ),
    ] {
        let dir = root.path().join(name);
        synth::write_model(&options, &dir, &mut |_| {}).unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let layers = config["num_hidden_layers"].as_u64().unwrap() as usize;
        let experts = config
            .get("num_experts")
            .or(config.get("num_local_experts"))
            .and_then(|v| v.as_u64())
            .unwrap() as usize;
        let top_k = config["num_experts_per_tok"].as_u64().unwrap() as usize;

        let mut peer = MlxLmPeer::start(&python, &dir).unwrap();
        let generated = peer
            .generate(&prompt, 6, 2048, None, &Default::default())
            .unwrap()
            .generated_ids;
        let context: Vec<u32> = prompt.iter().chain(&generated[..5]).copied().collect();
        let route_from = prompt.len() - 1;
        let tokens = [generated[5], generated[0]];
        let score = peer.score(&context, tokens, route_from).unwrap();
        let routing = score
            .routing
            .unwrap_or_else(|| panic!("{name}: no routing scored"));
        assert_eq!(routing.ranks, ranks, "{name}");
        assert_eq!((routing.top_k, routing.experts), (top_k, experts), "{name}");
        assert_eq!(routing.routed_layers, layers, "{name}: every layer routes");
        assert!(routing.layer < layers, "{name}: {routing:?}");
        assert!(
            (route_from..context.len()).contains(&routing.position),
            "{name}: {routing:?}"
        );
        assert!(
            routing.margin_f32 >= 0.0 && routing.margin_f32.is_finite(),
            "{name}: {routing:?}"
        );
        if name.ends_with("f32") {
            assert_eq!(routing.rounding, 0.0, "{name}: float32 rounds nothing more");
        } else {
            assert!(routing.rounding > 0.0, "{name}: {routing:?}");
        }
        // Asked from the first position, the range grows with it; past the
        // last, there is nothing to score.
        let whole = peer.score(&context, tokens, 0).unwrap().routing.unwrap();
        assert!(whole.position < context.len(), "{name}: {whole:?}");
        let error = peer.score(&context, tokens, context.len()).unwrap_err();
        assert!(error.to_string().contains("route_from"), "{name}: {error}");
        // The recorders are gone and the weights back in their dtype.
        let again = peer
            .generate(&prompt, 6, 2048, None, &Default::default())
            .unwrap()
            .generated_ids;
        assert_eq!(again, generated, "{name}");
    }
}

/// One family compared with mlx-lm as every family is: each variant's greedy
/// ids over `sweep` in both loop shapes; the first step's log-probabilities
/// within 1e-4 for prompts of each of `logprob_lengths`; and a chat turn with
/// a follow-up on the kept cache, on the `follow_up` variant. Returns the
/// greedy runs compared.
fn assert_family_equals_mlx_lm(
    family_name: &str,
    variants: &[(&str, SynthOptions)],
    sweep: &Sweep,
    logprob_lengths: &[usize],
    follow_up: &SynthOptions,
) -> usize {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let mut compared = 0;
    for (variant_name, options) in variants {
        let name = format!("{family_name}-{variant_name}");
        let dir = synthesize(root.path(), &name, options);
        compared += sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, &name);
        assert_first_logprobs_near_mlx_lm(&python, root.path(), &dir, &name, logprob_lengths);
    }
    let name = format!("{family_name}-follow-up");
    let dir = synthesize(root.path(), &name, follow_up);
    assert_follow_up_turn_equals_mlx_lm(&engine, &python, &dir, &name, FollowUpReuse::AsMlxLm);
    compared
}

/// SmolLM3 (the tiny shape's second layer without rope) in fp32 and 4-bit:
/// greedy ids equal mlx-lm's at prompts of 1, 7 and 40 tokens, one pass
/// and in chunks of 16, with and without a rotating cache, both loops; the
/// first step's log-probabilities; a follow-up turn on the kept cache.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn smollm3_equals_mlx_lm() {
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, 16)],
        max_kv_sizes: &[None, Some(ROTATING_SIZE)],
    };
    let variants = [
        ("f32", variant(&family::SMOLLM3, None, WeightDtype::F32)),
        ("q4", variant(&family::SMOLLM3, Some(4), WeightDtype::F32)),
    ];
    let compared = assert_family_equals_mlx_lm(
        "smollm3",
        &variants,
        &sweep,
        &[7, 40],
        &variant(&family::SMOLLM3, Some(4), WeightDtype::F32),
    );
    assert_eq!(compared, 2 * 4 * 2 * 2);
}

/// Ministral 3's text model (a sliding layer of `GEMMA_WINDOW` positions
/// beside a full one; yarn rope; queries scaled past an original context of
/// 256 positions) in fp32 and 4-bit: greedy ids equal mlx-lm's at prompts
/// of 1, 7, 40 (across the window) and 300 tokens (across the original
/// context), one pass and in chunks, both loops; the first step's
/// log-probabilities at 7, 40 and 300; a follow-up turn on the kept cache
/// (the synth's own window, which the short chat does not wrap).
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn ministral3_equals_mlx_lm() {
    let windowed = |bits| SynthOptions {
        sliding_window: GEMMA_WINDOW,
        ..variant(&family::MINISTRAL3, bits, WeightDtype::F32)
    };
    // mlx-lm gives Ministral 3 its own per-layer caches and ignores
    // `max_kv_size`.
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[
            (1, 2048),
            (7, 2048),
            (40, 2048),
            (40, GEMMA_WINDOW),
            (300, 2048),
            (300, SMALL_PREFILL_STEP),
        ],
        max_kv_sizes: &[None],
    };
    let variants = [("f32", windowed(None)), ("q4", windowed(Some(4)))];
    let compared = assert_family_equals_mlx_lm(
        "ministral3",
        &variants,
        &sweep,
        &[7, 40, 300],
        &variant(&family::MINISTRAL3, Some(4), WeightDtype::F32),
    );
    assert_eq!(compared, 2 * 6 * 2);
}

/// Mistral 3's multimodal checkpoints, the text model read from under
/// `language_model.` beside a vision tower, in fp32 and 4-bit: greedy ids
/// equal mlx-lm's at prompts of 1, 7 and 40 tokens, one pass and in
/// chunks, both loops; the first step's log-probabilities; a follow-up
/// turn on the kept cache. The same tensors in transformers 5's spelling
/// (`model.language_model.`, `lm_head`, `model.vision_tower.`) give the
/// same log-probabilities.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn mistral3_equals_mlx_lm() {
    let windowed = |bits| SynthOptions {
        sliding_window: GEMMA_WINDOW,
        ..variant(&family::MISTRAL3, bits, WeightDtype::F32)
    };
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, GEMMA_WINDOW)],
        max_kv_sizes: &[None],
    };
    let variants = [("f32", windowed(None)), ("q4", windowed(Some(4)))];
    let compared = assert_family_equals_mlx_lm(
        "mistral3",
        &variants,
        &sweep,
        &[7],
        &variant(&family::MISTRAL3, Some(4), WeightDtype::F32),
    );
    assert_eq!(compared, 2 * 4 * 2);

    let root = tempfile::tempdir().unwrap();
    // An untied head, so that `lm_head` is respelled too.
    let mut options = windowed(None);
    options.preset.shape.tie_word_embeddings = false;
    let mlx_spelling = synthesize(root.path(), "mlx", &options);
    let transformers_spelling = root.path().join("transformers");
    copy_with_tensors(&mlx_spelling, &transformers_spelling, |tensors| {
        let respelled: NamedTensors = tensors
            .into_iter()
            .map(|(name, array)| {
                let name = if let Some(rest) = name.strip_prefix("language_model.model.") {
                    format!("model.language_model.{rest}")
                } else if let Some(rest) = name.strip_prefix("language_model.") {
                    rest.to_owned()
                } else {
                    format!("model.{name}")
                };
                (name, array)
            })
            .collect();
        assert!(respelled.iter().any(|(n, _)| n == "lm_head.weight"));
        assert!(
            respelled
                .iter()
                .any(|(n, _)| n.starts_with("model.vision_tower."))
        );
        respelled
    });
    let prompt = prompt_of(7);
    assert_eq!(
        ondo_first_logprobs(&transformers_spelling, &prompt, DEFAULT_PREFILL_STEP_SIZE),
        ondo_first_logprobs(&mlx_spelling, &prompt, DEFAULT_PREFILL_STEP_SIZE),
    );
}

/// LFM2 (short-convolution layers beside attention) in floats and 4-bit:
/// greedy ids equal mlx-lm's for a 1-, 7- and 300-token prompt, the last
/// in one pass and in 128-token chunks (each chunk's convolution reads the
/// state the one before left), in both loop shapes, with a growing cache
/// and a rotating one on the attention layers.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn lfm2_greedy_tokens_equal_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    let sweep = Sweep {
        tokens: GENERATE,
        shapes: &[(1, 2048), (7, 2048), (300, 2048), (300, SMALL_PREFILL_STEP)],
        max_kv_sizes: &[None, Some(ROTATING_SIZE)],
    };
    let mut compared = 0;
    for (name, options) in [
        ("lfm2-f32", variant(&family::LFM2, None, WeightDtype::F32)),
        ("lfm2-q4", variant(&family::LFM2, Some(4), WeightDtype::F32)),
    ] {
        compared += sweep.assert_equal_to_mlx_lm(
            &engine,
            &python,
            &synthesize(root.path(), name, &options),
            name,
        );
    }
    assert_eq!(compared, 2 * 4 * 2 * 2);
}

/// LFM2's first step: log-probabilities within 1e-4 of mlx-lm's, for a
/// prompt in one pass and in chunks of 128, in floats and 4-bit.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn lfm2_first_step_log_probabilities_match_mlx_lm() {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for (name, options) in [
        ("lfm2-f32", variant(&family::LFM2, None, WeightDtype::F32)),
        ("lfm2-q4", variant(&family::LFM2, Some(4), WeightDtype::F32)),
    ] {
        let dir = synthesize(root.path(), name, &options);
        for length in [7, 300] {
            let prompt = prompt_of(length);
            let logits_path = root.path().join(format!("{name}-{length}.json"));
            let reference = mlx_lm_first_logprobs(&python, &dir, &prompt, &logits_path);
            for step in [DEFAULT_PREFILL_STEP_SIZE, SMALL_PREFILL_STEP] {
                let ours = ondo_first_logprobs(&dir, &prompt, step);
                let worst = largest_difference(&ours, &reference);
                assert!(
                    worst <= 1e-4,
                    "{name}, prompt {length}, step {step}: largest log-probability \
                     difference {worst} > 1e-4"
                );
            }
        }
    }
}

/// An LFM2 chat's second turn on the kept cache equals mlx-lm's follow-up
/// and a fresh run of the whole conversation (`assert_follow_up_turn_equals_mlx_lm`).
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn lfm2_follow_up_turn_on_the_kept_cache_equals_mlx_lm_and_a_fresh_run() {
    let root = tempfile::tempdir().unwrap();
    let options = variant(&family::LFM2, Some(4), WeightDtype::F32);
    let dir = synthesize(root.path(), "lfm2-q4", &options);
    let engine = EngineHandle::spawn().unwrap();
    assert_follow_up_turn_equals_mlx_lm(
        &engine,
        &python(),
        &dir,
        "lfm2",
        FollowUpReuse::PrefillSnapshot,
    );
}

/// A conversation on LFM2, whose convolution states cannot be trimmed,
/// prefills only what its cache lacks (`assert_conversation_prefills_only_new_tokens`).
#[test]
fn an_lfm2_conversation_prefills_only_what_its_cache_lacks() {
    let root = tempfile::tempdir().unwrap();
    let options = variant(&family::LFM2, None, WeightDtype::F32);
    let dir = synthesize(root.path(), "lfm2-f32", &options);
    assert_conversation_prefills_only_new_tokens(&dir, "lfm2");
}

/// A conversation on a model with state layers: the second turn (the first
/// turn's prompt and answer, then new tokens) prefills only the new tokens,
/// and a turn that branches inside the first answer goes back to the
/// snapshot kept at the end of the first prompt's prefill; each answers
/// token for token as a one-pass run of its whole prompt, in both loop
/// shapes.
fn assert_conversation_prefills_only_new_tokens(dir: &Path, name: &str) {
    let engine = EngineHandle::spawn().unwrap();
    for shape in [LoopShape::Pipelined, LoopShape::Sync] {
        let run = |prompt: &[u32], conversation: Option<String>| {
            let request = GenerateRequest {
                max_tokens: 8,
                ignore_eos: true,
                loop_shape: shape,
                conversation,
                ..GenerateRequest::new(
                    dir,
                    Prompt::Tokens {
                        ids: prompt.to_vec(),
                    },
                )
            };
            engine
                .generate_blocking(request, CancelToken::new(), |_| {})
                .expect("Ondo generates")
        };
        let id = Some(format!("{name}-{shape}"));
        let first = prompt_of(20);
        let turn1 = run(&first, id.clone());
        assert_eq!(turn1.stats.cached_tokens, 0);

        let mut second = first.clone();
        second.extend(&turn1.token_ids);
        second.extend([11, 12, 13, 14, 15]);
        let turn2 = run(&second, id.clone());
        assert_eq!(
            (turn2.stats.cached_tokens, turn2.stats.prefill_tokens),
            (28, 5),
            "{name}, loop {shape}: the first turn's 20 + 8 tokens are reused"
        );
        assert_eq!(
            turn2.token_ids,
            run(&second, None).token_ids,
            "{name}, loop {shape}: turn 2 equals a one-pass run"
        );

        // Branches after the first prompt: the latest snapshot within the
        // common prefix is the first prompt's prefill (all but its last
        // token).
        let mut branch = first.clone();
        branch.extend([21, 22, 23]);
        let turn3 = run(&branch, id);
        assert_eq!(
            (turn3.stats.cached_tokens, turn3.stats.prefill_tokens),
            (19, 4),
            "{name}, loop {shape}: back to the snapshot at the first prompt's prefill"
        );
        assert_eq!(
            turn3.token_ids,
            run(&branch, None).token_ids,
            "{name}, loop {shape}: the branch equals a one-pass run"
        );

        // Ten turns, each the whole conversation so far and five new
        // tokens: every turn after the first prefills only those five, so
        // no token is prefilled twice, and the last turn still answers as a
        // one-pass run of the whole conversation.
        let id = Some(format!("{name}-{shape}-ten"));
        let mut prompt = prompt_of(20);
        let mut prefilled = 0;
        let mut last = None;
        for turn in 1..=10u32 {
            if let Some(reply) = last.take() {
                prompt.extend(reply);
                prompt.extend((0..5).map(|i| 30 + turn * 5 + i));
            }
            let answer = run(&prompt, id.clone());
            let expected_cached = if turn == 1 { 0 } else { prompt.len() - 5 };
            assert_eq!(
                (answer.stats.cached_tokens, answer.stats.prefill_tokens),
                (expected_cached, prompt.len() - expected_cached),
                "{name}, loop {shape}: turn {turn} prefills only its new tokens"
            );
            prefilled += answer.stats.prefill_tokens;
            if turn == 10 {
                assert_eq!(
                    answer.token_ids,
                    run(&prompt, None).token_ids,
                    "{name}, loop {shape}: turn 10 equals a one-pass run"
                );
            }
            last = Some(answer.token_ids);
        }
        assert_eq!(prefilled, 20 + 9 * 5, "{name}, loop {shape}");
    }
}

/// Qwen 3.5 (a gated DeltaNet layer beside a gated attention layer, the
/// text model of a multimodal checkpoint) and its mixture of experts with
/// a shared expert, in floats and 4-bit (the routers and shared-expert
/// gates 8-bit): greedy ids equal mlx-lm's at prompts of 1, 7 and 40
/// tokens, one pass and in chunks of 16 (each chunk's recurrence starts
/// from the state the one before left), in both loop shapes; the first
/// step's log-probabilities within 1e-4, in one pass and in chunks; a
/// follow-up turn on the kept cache.
fn assert_qwen3_5_equals_mlx_lm(arch: &'static Family) {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let engine = EngineHandle::spawn().unwrap();
    // mlx-lm gives Qwen 3.5 its own caches and ignores `max_kv_size`.
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, 16)],
        max_kv_sizes: &[None],
    };
    let name = arch.model_type;
    let mut compared = 0;
    for (variant_name, bits) in [("f32", None), ("q4", Some(4))] {
        let name = format!("{name}-{variant_name}");
        let dir = synthesize(root.path(), &name, &variant(arch, bits, WeightDtype::F32));
        compared += sweep.assert_equal_to_mlx_lm(&engine, &python, &dir, &name);
        for length in [7, 40] {
            let prompt = prompt_of(length);
            let logits_path = root.path().join(format!("{name}-{length}.json"));
            let reference = mlx_lm_first_logprobs(&python, &dir, &prompt, &logits_path);
            for step in [DEFAULT_PREFILL_STEP_SIZE, 16] {
                let worst =
                    largest_difference(&ondo_first_logprobs(&dir, &prompt, step), &reference);
                assert!(
                    worst <= 1e-4,
                    "{name}, prompt {length}, step {step}: largest log-probability \
                     difference {worst} > 1e-4"
                );
            }
        }
    }
    assert_eq!(compared, 2 * 4 * 2);
    drop(engine);
    let dir = synthesize(
        root.path(),
        &format!("{name}-follow-up"),
        &variant(arch, Some(4), WeightDtype::F32),
    );
    assert_follow_up_turn_equals_mlx_lm(
        &EngineHandle::spawn().unwrap(),
        &python,
        &dir,
        name,
        FollowUpReuse::PrefillSnapshot,
    );
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn qwen3_5_equals_mlx_lm() {
    assert_qwen3_5_equals_mlx_lm(&family::QWEN3_5);
}

/// A Qwen 3.5 conversation's second turn prefills only the new tokens and
/// answers token for token as a one-pass run (its recurrent states restored
/// from the snapshot kept at the first turn's end).
#[test]
fn a_qwen3_5_conversation_prefills_only_what_its_cache_lacks() {
    let root = tempfile::tempdir().unwrap();
    let options = variant(&family::QWEN3_5, None, WeightDtype::F32);
    let dir = synthesize(root.path(), "qwen3_5-f32", &options);
    assert_conversation_prefills_only_new_tokens(&dir, "qwen3_5");
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn qwen3_5_moe_equals_mlx_lm() {
    assert_qwen3_5_equals_mlx_lm(&family::QWEN3_5_MOE);
}

/// Qwen 3.5 as transformers saves it (tensors under `model.language_model.`
/// and `lm_head`, convolution kernels `[channels, 1, kernel]`, the layer,
/// q/k and final norms stored minus one; a mixture's experts as one
/// `experts.gate_up_proj` and one `experts.down_proj`) answers exactly as
/// the same model in MLX's layout, and as mlx-lm reading that checkpoint.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn qwen3_5_reads_a_transformers_checkpoint_as_its_mlx_layout() {
    for arch in [&family::QWEN3_5, &family::QWEN3_5_MOE] {
        assert_reads_transformers_layout(arch, experts_gate_up_fused);
    }
}

/// The tensors with each layer's stacked experts saved as transformers
/// saves Qwen 3.5's: gate and up stacked on the rows as one
/// `experts.gate_up_proj`, and `experts.down_proj`.
fn experts_gate_up_fused(mut tensors: Tensors) -> NamedTensors {
    let layers: Vec<String> = tensors
        .keys()
        .filter_map(|name| name.strip_suffix(".mlp.switch_mlp.gate_proj.weight"))
        .map(str::to_owned)
        .collect();
    for layer in layers {
        let switch = format!("{layer}.mlp.switch_mlp");
        let gate = tensors
            .remove(&format!("{switch}.gate_proj.weight"))
            .unwrap();
        let up = tensors.remove(&format!("{switch}.up_proj.weight")).unwrap();
        let down = tensors
            .remove(&format!("{switch}.down_proj.weight"))
            .unwrap();
        let fused = mlx_rs::ops::concatenate(&[gate, up], 1).unwrap();
        tensors.insert(format!("{layer}.mlp.experts.gate_up_proj"), fused);
        tensors.insert(format!("{layer}.mlp.experts.down_proj"), down);
    }
    tensors.into_iter().collect()
}

/// A gated DeltaNet model as transformers saves it (tensors under
/// `model.language_model.` and `lm_head` where the MLX layout has
/// `language_model.`, convolution kernels `[channels, 1, kernel]`, the
/// layer, q/k and final norms stored minus one, a mixture's experts as
/// `save_experts` writes them) answers exactly as the same model in MLX's
/// layout, and as mlx-lm reading that checkpoint.
fn assert_reads_transformers_layout(
    arch: &'static Family,
    save_experts: fn(Tensors) -> NamedTensors,
) {
    let python = python();
    let root = tempfile::tempdir().unwrap();
    let mut options = variant(arch, None, WeightDtype::F32);
    options.preset.shape.tie_word_embeddings = false;
    let mlx_layout = synthesize(root.path(), "mlx", &options);
    let transformers_layout = root.path().join("transformers");
    let shifted = [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    ];
    copy_with_tensors(&mlx_layout, &transformers_layout, |tensors| {
        save_experts(tensors)
            .into_iter()
            .map(|(name, array)| {
                let array = if name.ends_with("conv1d.weight") {
                    array.swap_axes(1, 2).unwrap()
                } else if shifted.iter().any(|end| name.ends_with(end)) {
                    mlx_rs::ops::subtract(&array, mlx_rs::Array::from_f32(1.0)).unwrap()
                } else {
                    array
                };
                let name = if let Some(rest) = name.strip_prefix("language_model.model.") {
                    format!("model.language_model.{rest}")
                } else if let Some(rest) = name.strip_prefix("language_model.") {
                    rest.to_owned()
                } else {
                    name
                };
                (name, array)
            })
            .collect()
    });
    assert_layouts_answer_alike(&python, &mlx_layout, &transformers_layout, arch.model_type);
}

/// GLM-4.5 (q/k/v biases and q/k norms, half of each head rotated, a dense
/// first layer, then 8 experts in two groups, one chosen, 2 per token by
/// corrected sigmoid scores, beside an ungated shared expert) in floats and
/// 4-bit (the router in floats, as mlx-lm keeps it): greedy ids equal
/// mlx-lm's at prompts of 1, 7 and 40 tokens (80 routed pairs: the experts'
/// sorted path), one pass and in chunks of 16, both loops; the first step's
/// log-probabilities within 1e-4; a follow-up turn on the kept cache. The
/// same model as transformers saves it (each expert's projections apart,
/// the multi-token-prediction layer after the last) answers exactly as in
/// MLX's layout, and as mlx-lm reading that checkpoint.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn glm4_moe_equals_mlx_lm() {
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, 16)],
        max_kv_sizes: &[None],
    };
    let variants = [
        ("f32", variant(&family::GLM4_MOE, None, WeightDtype::F32)),
        ("q4", variant(&family::GLM4_MOE, Some(4), WeightDtype::F32)),
    ];
    let compared = assert_family_equals_mlx_lm(
        "glm4_moe",
        &variants,
        &sweep,
        &[7, 40],
        &variant(&family::GLM4_MOE, Some(4), WeightDtype::F32),
    );
    assert_eq!(compared, 2 * 4 * 2);

    let python = python();
    let root = tempfile::tempdir().unwrap();
    let options = variant(&family::GLM4_MOE, None, WeightDtype::F32);
    let (layers, hidden) = (
        options.preset.shape.num_hidden_layers,
        options.preset.shape.hidden_size as i32,
    );
    let mlx_layout = synthesize(root.path(), "mlx", &options);
    let transformers_layout = root.path().join("transformers");
    copy_with_tensors(&mlx_layout, &transformers_layout, |tensors| {
        let mut saved = experts_one_by_one(tensors);
        // The multi-token-prediction layer transformers keeps.
        for name in ["enorm.weight", "eh_proj.bias"] {
            saved.push((
                format!("model.layers.{layers}.{name}"),
                mlx_rs::Array::ones::<f32>(&[hidden]).unwrap(),
            ));
        }
        saved
    });
    assert_layouts_answer_alike(&python, &mlx_layout, &transformers_layout, "glm4_moe");
}

/// The tensors with each stacked `{layer}.switch_mlp.{projection}` saved
/// expert by expert, `{layer}.experts.{e}.{projection}`, as transformers
/// saves Qwen3-MoE, Qwen3-Next and GLM-4.5.
fn experts_one_by_one(tensors: Tensors) -> NamedTensors {
    use mlx_rs::ops::indexing::IndexOp;
    let mut split = Vec::new();
    for (name, array) in tensors {
        match name.split_once(".switch_mlp.") {
            Some((layer, projection)) => {
                for e in 0..array.shape()[0] {
                    split.push((format!("{layer}.experts.{e}.{projection}"), array.index(e)));
                }
            }
            None => split.push((name, array)),
        }
    }
    assert!(
        split
            .iter()
            .any(|(n, _)| n.ends_with("experts.7.down_proj.weight"))
    );
    split
}

/// The same model in MLX's layout and in transformers' gives Ondo the same
/// first-step log-probabilities, bit for bit, and mlx-lm reading the
/// transformers layout gives them within 1e-4 (`name` opens the failure
/// message).
fn assert_layouts_answer_alike(
    python: &Path,
    mlx_layout: &Path,
    transformers_layout: &Path,
    name: &str,
) {
    let prompt = prompt_of(7);
    let ours = ondo_first_logprobs(transformers_layout, &prompt, DEFAULT_PREFILL_STEP_SIZE);
    assert_eq!(
        ours,
        ondo_first_logprobs(mlx_layout, &prompt, DEFAULT_PREFILL_STEP_SIZE),
        "{name}"
    );
    // mlx-lm's answer goes beside the folder, as `{folder}.json`.
    let scratch = transformers_layout.with_extension("json");
    let reference = mlx_lm_first_logprobs(python, transformers_layout, &prompt, &scratch);
    let worst = largest_difference(&ours, &reference);
    assert!(
        worst <= 1e-4,
        "{name}: largest log-probability difference {worst}"
    );
}

/// A Gemma 4 folder with `GEMMA_WINDOW`-position sliding layers: dense (the
/// small models' shape: per-layer inputs, the last two layers reading the
/// first two's keys and values with MLPs twice as wide), or with
/// `experts` (the 26B's: routed experts beside the dense MLP, full layers
/// whose values are their keys).
fn gemma4(arch: &'static Family, experts: bool, bits: Option<u8>) -> SynthOptions {
    SynthOptions {
        experts,
        ..gemma(arch, bits, WeightDtype::F32)
    }
}

/// One Gemma 4 family, dense and with experts, in floats and 4-bit (the
/// routers 8-bit): greedy ids equal mlx-lm's at prompts of 1, 7 and 40
/// tokens (across the window), one pass and in window-sized chunks, both
/// loops; the first step's log-probabilities within 1e-4; a follow-up turn
/// on the kept cache (at the default window, which it does not wrap).
fn assert_gemma4_equals_mlx_lm(arch: &'static Family) {
    // mlx-lm gives Gemma 4 its own per-layer caches and ignores
    // `max_kv_size`.
    let sweep = Sweep {
        tokens: EXPERTS_GENERATE,
        shapes: &[(1, 2048), (7, 2048), (40, 2048), (40, GEMMA_WINDOW)],
        max_kv_sizes: &[None],
    };
    let variants = [
        ("f32", gemma4(arch, false, None)),
        ("q4", gemma4(arch, false, Some(4))),
        ("experts-f32", gemma4(arch, true, None)),
        ("experts-q4", gemma4(arch, true, Some(4))),
    ];
    let compared = assert_family_equals_mlx_lm(
        arch.model_type,
        &variants,
        &sweep,
        &[7, 40],
        &variant(arch, Some(4), WeightDtype::F32),
    );
    assert_eq!(compared, 4 * 4 * 2);
}

#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn gemma4_text_equals_mlx_lm() {
    assert_gemma4_equals_mlx_lm(&family::GEMMA4_TEXT);
}

/// The multimodal Gemma 4 checkpoints as every family is compared
/// (`assert_gemma4_equals_mlx_lm`); and as transformers saves them (the
/// text model under `model.language_model.`, the towers under `model.`,
/// the KV-shared layers' unread `k_proj`, `v_proj` and `k_norm` kept, a
/// mixture's experts as one `experts.gate_up_proj` and one
/// `experts.down_proj`) they answer exactly as in MLX's layout, and as
/// mlx-lm reading that checkpoint.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn gemma4_equals_mlx_lm() {
    assert_gemma4_equals_mlx_lm(&family::GEMMA4);
    let python = python();
    let root = tempfile::tempdir().unwrap();
    for experts in [false, true] {
        let name = if experts { "experts" } else { "dense" };
        let mlx_layout = synthesize(
            root.path(),
            &format!("{name}-mlx"),
            &gemma4(&family::GEMMA4, experts, None),
        );
        let transformers_layout = root.path().join(format!("{name}-transformers"));
        copy_with_tensors(&mlx_layout, &transformers_layout, |mut tensors| {
            let layer_of = |name: &str, end: &str| name.strip_suffix(end).map(str::to_owned);
            // The experts' gate and up stacked on the rows, as one tensor.
            let switched: Vec<String> = tensors
                .keys()
                .filter_map(|n| layer_of(n, ".experts.switch_glu.gate_proj.weight"))
                .collect();
            for layer in switched {
                let switch = format!("{layer}.experts.switch_glu");
                let mut take =
                    |proj: &str| tensors.remove(&format!("{switch}.{proj}.weight")).unwrap();
                let (gate, up, down) = (take("gate_proj"), take("up_proj"), take("down_proj"));
                let fused = mlx_rs::ops::concatenate(&[gate, up], 1).unwrap();
                tensors.insert(format!("{layer}.experts.gate_up_proj"), fused);
                tensors.insert(format!("{layer}.experts.down_proj"), down);
            }
            // The shared layers (those without a `k_norm`) get the keys'
            // and values' tensors of the layer two before them.
            let shared: Vec<String> = tensors
                .keys()
                .filter_map(|n| layer_of(n, ".self_attn.q_norm.weight"))
                .filter(|layer| !tensors.contains_key(&format!("{layer}.self_attn.k_norm.weight")))
                .collect();
            for layer in &shared {
                let (stem, index) = layer.rsplit_once('.').unwrap();
                let source = format!("{stem}.{}", index.parse::<usize>().unwrap() - 2);
                for part in ["k_proj.weight", "v_proj.weight", "k_norm.weight"] {
                    let copy = tensors[&format!("{source}.self_attn.{part}")].clone();
                    tensors.insert(format!("{layer}.self_attn.{part}"), copy);
                }
            }
            assert_eq!(shared.is_empty(), experts);
            tensors
                .into_iter()
                .map(|(name, array)| {
                    let name = match name.strip_prefix("language_model.model.") {
                        Some(rest) => format!("model.language_model.{rest}"),
                        None => format!("model.{name}"),
                    };
                    (name, array)
                })
                .collect()
        });
        assert_layouts_answer_alike(&python, &mlx_layout, &transformers_layout, name);
    }
}

/// Qwen3-Next (a gated DeltaNet layer, its projections grouped by key head
/// with two value heads to each, beside a gated attention layer; routed
/// experts beside a gated shared expert) as `assert_qwen3_5_equals_mlx_lm`
/// compares Qwen 3.5; and as transformers saves it (each expert's
/// projections apart, kernels and norms as Qwen 3.5's, a
/// multi-token-prediction head) answering exactly as in MLX's layout, and
/// as mlx-lm reading that checkpoint.
#[test]
#[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
fn qwen3_next_equals_mlx_lm() {
    assert_qwen3_5_equals_mlx_lm(&family::QWEN3_NEXT);
    assert_reads_transformers_layout(&family::QWEN3_NEXT, |tensors| {
        let mut saved = experts_one_by_one(tensors);
        saved.push((
            "mtp.fc.weight".into(),
            mlx_rs::Array::ones::<f32>(&[4, 4]).unwrap(),
        ));
        saved
    });
}
