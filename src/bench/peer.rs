//! Python mlx-lm as a benchmark peer: a child process that loads the same
//! model folder once and answers generation requests line by line. The
//! worker script ships inside the binary and is written to a temporary file.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::{Deserialize, Serialize};

const WORKER: &str = include_str!("mlx_lm_peer.py");
const VLM_WORKER: &str = include_str!("mlx_vlm_peer.py");

/// Why the peer could not run.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error(
        "could not start {python} for the {peer} peer: {message}; point Ondo at a Python \
         that has {peer} (make setup installs one into .venv)"
    )]
    Start {
        peer: &'static str,
        python: PathBuf,
        message: String,
    },
    #[error("the mlx-lm peer failed: {0}")]
    Failed(String),
    #[error("the mlx-vlm peer failed: {0}")]
    VlmFailed(String),
}

/// One measurement by mlx-lm, in the worker's field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PeerRun {
    pub generated_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub ttft_ms: f64,
    pub decode_ms: f64,
    pub decode_tps: Option<f64>,
    pub prefill_tps: f64,
    pub prompt_tps: f64,
    pub generation_tps: f64,
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub process_to_first_token_ms: Option<f64>,
}

/// How mlx-lm scores two candidate next tokens (`MlxLmPeer::score`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerScore {
    /// The two tokens' logits in the model's own dtype.
    pub logits: [f64; 2],
    /// The same with every floating-point weight in float32.
    pub logits_f32: [f64; 2],
    /// Root mean square over the vocabulary of the model's own logits minus
    /// the float32 ones at that position: how far rounding moves a logit.
    pub rounding: f64,
    /// For a model with routed experts, the expert choice nearest to a tie
    /// from `route_from` on; `None` for a model without them (or a worker
    /// that does not measure it).
    #[serde(default)]
    pub routing: Option<PeerRouting>,
}

/// The expert choice nearest to a tie over the positions a score request
/// fed one at a time (`MlxLmPeer::score`), in the worker's field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerRouting {
    /// The decoder layer of the expert block.
    pub layer: usize,
    /// The position in `ids` whose step made the choice.
    pub position: usize,
    /// The float32 model's k-th best router score minus its (k+1)-th.
    pub margin_f32: f64,
    /// Root mean square of that layer's router scores in the model's own
    /// dtype minus float32's, over those positions and every expert.
    pub rounding: f64,
    pub top_k: usize,
    pub experts: usize,
    /// What the block ranks.
    pub ranks: super::token_check::RouterScores,
    /// How many layers have routed experts.
    pub routed_layers: usize,
}

/// Versions the worker reports once loaded.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct PeerInfo {
    pub mlx_version: String,
    pub mlx_lm_version: String,
    pub load_ms: f64,
}

/// The Python to use: `--python`, `ONDO_PYTHON`, the project venv, python3.
pub fn find_python(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    if let Some(p) = crate::environment::PYTHON.os_value() {
        return PathBuf::from(p);
    }
    let venv = Path::new(".venv/bin/python");
    if venv.is_file() {
        return venv.to_owned();
    }
    PathBuf::from("python3")
}

/// `script` written to a temporary file for Python to run.
fn script_file(peer: &str, script: &str) -> Result<tempfile::NamedTempFile, PeerError> {
    let failed = |e: std::io::Error| PeerError::Failed(format!("could not write the worker: {e}"));
    let mut file = tempfile::Builder::new()
        .prefix(&format!("ondo-{peer}-peer"))
        .suffix(".py")
        .tempfile()
        .map_err(failed)?;
    file.write_all(script.as_bytes()).map_err(failed)?;
    Ok(file)
}

/// Nanoseconds since the Unix epoch, for a child to measure from its spawn.
pub fn wall_clock_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// `python` as a command with the user's environment: without the MLX
/// settings Ondo chose for its own process (`engine::mlx_settings`), so
/// mlx-lm runs as users run it.
fn peer_command(python: &Path) -> Command {
    let mut command = Command::new(python);
    for name in crate::engine::mlx_settings::set_by_ondo() {
        command.env_remove(name);
    }
    command
}

/// mlx-lm's `kv_bits`, `kv_group_size` and `quantized_kv_start`, passed
/// to `stream_generate` as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerKv {
    pub kv_bits: Option<u8>,
    pub kv_group_size: u32,
    pub quantized_kv_start: usize,
}

/// A Python worker speaking JSON lines: one request a line on its stdin,
/// one answer a line on its stdout; an empty line asks it to exit.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Wraps what went wrong in the error naming this worker's peer.
    failed: fn(String) -> PeerError,
    _script: tempfile::NamedTempFile,
}

impl Worker {
    /// Starts `script` on `model_dir` and returns it with its first line,
    /// which must be its `ready` event.
    fn start(
        python: &Path,
        peer: &'static str,
        script: &str,
        model_dir: &Path,
        failed: fn(String) -> PeerError,
    ) -> Result<(Self, serde_json::Value), PeerError> {
        let file = script_file(peer, script)?;
        let mut child = peer_command(python)
            .arg(file.path())
            .arg(model_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| PeerError::Start {
                peer,
                python: python.to_owned(),
                message: e.to_string(),
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failed("no pipes to the worker".into()));
        };
        let mut worker = Self {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            failed,
            _script: file,
        };
        let ready = worker.read_line()?;
        if ready["event"] != "ready" {
            return Err(failed(ready.to_string()));
        }
        Ok((worker, ready))
    }

    fn read_line(&mut self) -> Result<serde_json::Value, PeerError> {
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| (self.failed)(e.to_string()))?;
        if read == 0 {
            return Err((self.failed)(
                "the worker exited (its error is printed above)".into(),
            ));
        }
        serde_json::from_str(&line).map_err(|e| (self.failed)(format!("{e}: {line}")))
    }

    /// Sends `request` and reads the answer, which must be an `event` one.
    fn ask<T: serde::de::DeserializeOwned>(
        &mut self,
        request: &serde_json::Value,
        event: &str,
    ) -> Result<T, PeerError> {
        writeln!(self.stdin, "{request}").map_err(|e| (self.failed)(e.to_string()))?;
        let answer = self.read_line()?;
        if answer["event"] != event {
            return Err((self.failed)(answer.to_string()));
        }
        serde_json::from_value(answer).map_err(|e| (self.failed)(e.to_string()))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin);
        let _ = self.child.wait();
    }
}

/// A running mlx-lm worker with the model loaded.
pub struct MlxLmPeer {
    worker: Worker,
    pub info: PeerInfo,
}

impl MlxLmPeer {
    /// Starts the worker and waits until the model is loaded.
    pub fn start(python: &Path, model_dir: &Path) -> Result<Self, PeerError> {
        let (worker, ready) =
            Worker::start(python, "mlx-lm", WORKER, model_dir, PeerError::Failed)?;
        let info = serde_json::from_value(ready).map_err(|e| PeerError::Failed(e.to_string()))?;
        Ok(Self { worker, info })
    }

    /// Generates exactly `max_tokens` greedy tokens after `prompt_ids`.
    pub fn generate(
        &mut self,
        prompt_ids: &[u32],
        max_tokens: usize,
        prefill_step_size: usize,
        max_kv_size: Option<usize>,
        kv: &PeerKv,
    ) -> Result<PeerRun, PeerError> {
        let request = serde_json::json!({
            "prompt_ids": prompt_ids,
            "max_tokens": max_tokens,
            "prefill_step_size": prefill_step_size,
            "max_kv_size": max_kv_size,
            "kv_bits": kv.kv_bits,
            "kv_group_size": kv.kv_group_size,
            "quantized_kv_start": kv.quantized_kv_start,
        });
        self.worker.ask(&request, "result")
    }

    /// How the model scores `tokens` as the next token after `ids`, in its
    /// own dtype and in float32 (not timed; `ids` run twice), and for routed
    /// experts the expert choice nearest to a tie at positions `route_from`
    /// onward, which are fed one at a time as decode steps are.
    pub fn score(
        &mut self,
        ids: &[u32],
        tokens: [u32; 2],
        route_from: usize,
    ) -> Result<PeerScore, PeerError> {
        let request = serde_json::json!({
            "score_ids": ids,
            "tokens": tokens,
            "route_from": route_from,
        });
        self.worker.ask(&request, "score")
    }
}

/// One image request answered by mlx-vlm, in the worker's field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VlmRun {
    pub generated_ids: Vec<u32>,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Request read to first token: template, processor, vision tower,
    /// prefill, first step.
    pub ttft_ms: f64,
    pub decode_ms: f64,
    pub decode_tps: Option<f64>,
    pub peak_memory_bytes: u64,
}

/// Versions the mlx-vlm worker reports once loaded.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VlmInfo {
    pub mlx_version: String,
    pub mlx_vlm_version: String,
    pub load_ms: f64,
}

/// A running mlx-vlm worker (`mlx_vlm_peer.py`) with the model loaded.
pub struct MlxVlmPeer {
    worker: Worker,
    pub info: VlmInfo,
}

impl MlxVlmPeer {
    /// Starts the worker and waits until the model is loaded.
    pub fn start(python: &Path, model_dir: &Path) -> Result<Self, PeerError> {
        let (worker, ready) = Worker::start(
            python,
            "mlx-vlm",
            VLM_WORKER,
            model_dir,
            PeerError::VlmFailed,
        )?;
        let info =
            serde_json::from_value(ready).map_err(|e| PeerError::VlmFailed(e.to_string()))?;
        Ok(Self { worker, info })
    }

    /// Answers `question` about `images` after `system`, exactly
    /// `max_tokens` greedy tokens.
    pub fn generate(
        &mut self,
        system: &str,
        question: &str,
        images: &[PathBuf],
        max_tokens: usize,
        prefill_step_size: usize,
    ) -> Result<VlmRun, PeerError> {
        let request = serde_json::json!({
            "system": system,
            "question": question,
            "images": images,
            "max_tokens": max_tokens,
            "prefill_step_size": prefill_step_size,
        });
        self.worker.ask(&request, "result")
    }
}

/// A fresh mlx-lm process: spawn to first token, in milliseconds.
pub fn cold_start(
    python: &Path,
    model_dir: &Path,
    prompt_ids: &[u32],
) -> Result<PeerRun, PeerError> {
    let worker = script_file("mlx-lm", WORKER)?;
    let ids: Vec<String> = prompt_ids.iter().map(u32::to_string).collect();
    let spawned_at = wall_clock_ns();
    let out = peer_command(python)
        .arg(worker.path())
        .arg(model_dir)
        .args([
            "--cold",
            "--max-tokens",
            "1",
            "--prompt-ids",
            &ids.join(","),
        ])
        .args(["--process-start-ns", &spawned_at.to_string()])
        .output()
        .map_err(|e| PeerError::Start {
            peer: "mlx-lm",
            python: python.to_owned(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(PeerError::Failed(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let last = line.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| PeerError::Failed(format!("{e}: {last}")))
}
