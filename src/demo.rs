//! A test generation: load (cold the first time), prefill (time to first
//! token) and decode of a raw prompt, timed by the engine thread. Serves
//! `ondo demo`, `make demo` and the app's "Run a test generation".

use std::path::{Path, PathBuf};

use crate::engine::generate::LoopShape;
use crate::engine::{CancelToken, EngineHandle, GenerateRequest, Prompt, RunError};

/// The timings of one generation, with DESIGN.md's field names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
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
    Run(#[from] RunError),
}

/// A model kept resident by an engine thread for repeated (warm) runs.
pub struct DemoSession {
    engine: EngineHandle,
    model_dir: PathBuf,
}

impl DemoSession {
    /// Starts an engine of its own; the model loads with the first run (cold).
    pub fn load(dir: &Path) -> Result<Self, DemoError> {
        Ok(Self::with_engine(EngineHandle::spawn()?, dir))
    }

    /// Uses a running engine (the app's), where the model may already be warm.
    pub fn with_engine(engine: EngineHandle, dir: &Path) -> Self {
        Self {
            engine,
            model_dir: dir.to_owned(),
        }
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
        let request = GenerateRequest {
            max_tokens,
            loop_shape,
            ignore_eos: true,
            ..GenerateRequest::new(
                &self.model_dir,
                Prompt::Raw {
                    text: prompt.to_owned(),
                },
            )
        };
        let outcome = self
            .engine
            .generate_blocking(request, CancelToken::new(), |_| {})?;
        Ok(DemoRun::from_outcome(&self.model_dir, outcome))
    }
}

impl DemoRun {
    fn from_outcome(model_dir: &Path, outcome: crate::engine::stream::RunOutcome) -> Self {
        let s = outcome.stats;
        DemoRun {
            model_dir: model_dir.to_owned(),
            load_kind: s.load_kind.to_string(),
            loop_shape: s.loop_shape,
            load_ms: s.load_ms,
            prompt_tokens: s.prompt_tokens,
            ttft_ms: s.ttft_ms,
            prefill_ms: s.prefill_ms,
            prefill_tps: s.prefill_tps,
            generated_tokens: s.generated_tokens,
            decode_ms: s.decode_ms,
            decode_tps: s.decode_tps,
            kv_cache_bytes: s.kv_cache_bytes as usize,
            mlx_peak_bytes: s.mlx_peak_bytes as usize,
            text: outcome.text,
        }
    }
}

/// Runs one test generation of the model at `model_dir` on `engine`: cold
/// the first time, warm once the engine holds the model.
pub fn run_test_generation(
    engine: &EngineHandle,
    model_dir: &Path,
    prompt: &str,
    max_tokens: usize,
) -> Result<DemoRun, DemoError> {
    DemoSession::with_engine(engine.clone(), model_dir).run(prompt, max_tokens)
}

/// The same test generation through a session pool, which keeps the model
/// warm by its policy and records the run in the history.
pub fn run_test_generation_in(
    pool: &crate::session::SessionPool,
    model_id: &str,
    model_dir: &Path,
    prompt: &str,
    max_tokens: usize,
) -> Result<DemoRun, DemoError> {
    let request = GenerateRequest {
        max_tokens,
        ignore_eos: true,
        ..GenerateRequest::new(
            model_dir,
            Prompt::Raw {
                text: prompt.to_owned(),
            },
        )
    };
    let context = crate::session::record::RunContext {
        kind: "run".into(),
        model_id: model_id.to_owned(),
        ..Default::default()
    };
    let (outcome, _) = pool.run(request, context, CancelToken::new(), |_| {})?;
    Ok(DemoRun::from_outcome(model_dir, outcome))
}
