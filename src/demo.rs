//! A test generation: load (cold the first time), prefill (time to first
//! token) and decode of a raw prompt, through the session pool like every
//! run. Serves `ondo demo`, `make demo` and the app's "Run a test generation".

use std::path::{Path, PathBuf};

use crate::engine::{CancelToken, GenerateRequest, Prompt, RunError};
use crate::resolve::ResolvedModel;
use crate::run_kinds::{LoopShape, RunKind};
use crate::session::SessionPool;

/// The timings of one generation, with the run record's field names
/// (docs/ARCHITECTURE.md, "What the timings mean").
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

/// One test generation of `model` through the pool: cold the first time,
/// warm while the pool keeps the model; recorded in the history as a
/// `demo` run. Greedy with EOS ignored, so every run decodes the same
/// number of tokens.
pub fn run_demo(
    pool: &SessionPool,
    model: &ResolvedModel,
    prompt: &str,
    max_tokens: usize,
    loop_shape: LoopShape,
) -> Result<DemoRun, RunError> {
    let request = GenerateRequest {
        max_tokens,
        loop_shape,
        ignore_eos: true,
        ..GenerateRequest::new(
            &model.dir,
            Prompt::Raw {
                text: prompt.to_owned(),
            },
        )
    };
    let (outcome, _) = pool.run(
        request,
        model.run_context(RunKind::Demo),
        CancelToken::new(),
        |_| {},
    )?;
    Ok(DemoRun::from_outcome(&model.dir, outcome))
}
