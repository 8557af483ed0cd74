//! A first, honest measurement of one generation: load, prefill (time to
//! first token) and decode, with the clocks around the engine's steps.
//!
//! The session layer (warm pool, run records) grows out of this; for now it
//! serves `ondo demo`, `make demo` and the app's "Run a test generation".

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::engine::LoadError;
use crate::engine::generate::{LoopShape, TokenSteps};
use crate::engine::load::LoadedModel;

/// The timings of one generation, with DESIGN.md's field names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DemoRun {
    pub model_dir: PathBuf,
    /// "cold" when this run loaded the model, "warm" when it was resident.
    pub load_kind: String,
    /// The decode loop's shape: "sync" or "pipelined".
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    pub load_ms: f64,
    pub prompt_tokens: usize,
    pub ttft_ms: f64,
    pub prefill_ms: f64,
    pub prefill_tps: f64,
    pub generated_tokens: usize,
    pub decode_ms: f64,
    /// `(generated_tokens - 1) / decode_s`: the first token belongs to prefill.
    pub decode_tps: f64,
    pub kv_cache_bytes: usize,
    pub mlx_peak_bytes: usize,
    pub text: String,
}

/// Why a test generation failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("the prompt is empty; type something to send")]
    EmptyPrompt,
    #[error("tokenizing failed: {0}")]
    Tokenizer(String),
    #[error("MLX failed while generating: {0}")]
    Mlx(String),
}

impl From<mlx_rs::error::Exception> for DemoError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        DemoError::Mlx(e.to_string())
    }
}

/// A loaded model kept for repeated (warm) runs.
pub struct DemoSession {
    model: LoadedModel,
    load_ms: f64,
    runs: usize,
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

impl DemoSession {
    /// Loads the model; the load time is charged to the first run (cold).
    pub fn load(dir: &Path) -> Result<Self, DemoError> {
        let start = Instant::now();
        let model = LoadedModel::load(dir)?;
        Ok(Self {
            model,
            load_ms: ms_since(start),
            runs: 0,
        })
    }

    /// Generates up to `max_tokens` greedily (EOS ignored, so every run
    /// decodes the same number of tokens) and times each phase.
    pub fn run(&mut self, prompt: &str, max_tokens: usize) -> Result<DemoRun, DemoError> {
        self.run_with(prompt, max_tokens, LoopShape::default())
    }

    /// `run` with a chosen decode loop shape.
    pub fn run_with(
        &mut self,
        prompt: &str,
        max_tokens: usize,
        loop_shape: LoopShape,
    ) -> Result<DemoRun, DemoError> {
        if prompt.trim().is_empty() {
            return Err(DemoError::EmptyPrompt);
        }
        let encoding = self
            .model
            .tokenizer
            .encode(prompt, true)
            .map_err(|e| DemoError::Tokenizer(e.to_string()))?;
        let prompt_ids = encoding.get_ids().to_vec();
        let cold = self.runs == 0;
        self.runs += 1;
        mlx_rs::memory::reset_peak_memory()?;

        let request = Instant::now();
        let mut cache = self.model.model.make_cache(None);
        let mut steps = TokenSteps::new(&self.model.model, &mut cache, &prompt_ids)?
            .with_loop_shape(loop_shape);
        let mut tokens = Vec::with_capacity(max_tokens);
        let mut first_token_at = None;
        for step in steps.by_ref().take(max_tokens.max(1)) {
            tokens.push(step?);
            if first_token_at.is_none() {
                first_token_at = Some(Instant::now());
            }
        }
        let end = Instant::now();
        let first = first_token_at.unwrap_or(end);
        let ttft_ms = (first - request).as_secs_f64() * 1e3;
        let decode_ms = (end - first).as_secs_f64() * 1e3;
        let text = self
            .model
            .tokenizer
            .decode(&tokens, true)
            .map_err(|e| DemoError::Tokenizer(e.to_string()))?;
        let per_second = |count: usize, ms: f64| {
            if ms > 0.0 {
                count as f64 / (ms / 1e3)
            } else {
                0.0
            }
        };
        Ok(DemoRun {
            model_dir: self.model.dir.clone(),
            load_kind: if cold { "cold" } else { "warm" }.to_owned(),
            loop_shape,
            load_ms: if cold { self.load_ms } else { 0.0 },
            prompt_tokens: prompt_ids.len(),
            ttft_ms,
            // This loop has no work between request and prefill, so both
            // spans coincide; the engine separates them.
            prefill_ms: ttft_ms,
            prefill_tps: per_second(prompt_ids.len(), ttft_ms),
            generated_tokens: tokens.len(),
            decode_ms,
            decode_tps: per_second(tokens.len().saturating_sub(1), decode_ms),
            kv_cache_bytes: steps.kv_cache_bytes(),
            mlx_peak_bytes: mlx_rs::memory::peak_memory()?,
            text,
        })
    }
}

/// Loads the model at `model_dir` and runs one (cold) test generation.
pub fn run_test_generation(
    model_dir: &Path,
    prompt: &str,
    max_tokens: usize,
) -> Result<DemoRun, DemoError> {
    DemoSession::load(model_dir)?.run(prompt, max_tokens)
}
