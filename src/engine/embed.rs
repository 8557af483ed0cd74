//! Embeddings: inputs (texts or token ids) in, one vector per input out.
//! The inputs of a request run as one padded forward pass (in a few passes
//! only when they would not fit a bounded number of positions), pooled the
//! way the folder's sentence-transformers files say and normalized when
//! they say so. Runs on the engine thread, on a model of the same pool as
//! the chat models.

use std::path::PathBuf;
use std::time::Instant;

use mlx_rs::Array;
use mlx_rs::ops;
use serde::{Deserialize, Serialize};

use super::load::LoadedModel;
use super::request::RunError;
use super::stats::RunStats;
use crate::family::embedding::{EmbeddingSetup, Pooling};
use crate::run_kinds::LoadKind;

/// One thing to embed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    /// Text, tokenized with the model's tokenizer and its special tokens
    /// (Qwen3-Embedding's appends `<|endoftext|>`, BERT's wraps in
    /// `[CLS] ... [SEP]`), as sentence-transformers feeds it.
    Text(String),
    /// Token ids, taken as they are.
    Tokens(Vec<u32>),
}

/// A request for embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    pub model_dir: PathBuf,
    pub inputs: Vec<EmbedInput>,
    /// An input longer than the model's context is cut to it (its last
    /// token, the appended special one, kept); otherwise it is refused.
    pub truncate: bool,
    /// Keep only the first this many dimensions (then normalize again):
    /// only for a Matryoshka-trained model.
    pub dimensions: Option<usize>,
}

/// What an embedding request gave back.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedOutcome {
    /// One vector per input, in the request's order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens each input ran as (after truncation).
    pub tokens_per_input: Vec<usize>,
    /// Inputs cut to the context.
    pub truncated_inputs: usize,
    /// The run's record: `prompt_tokens` the real tokens of every input,
    /// `prefill_ms` the forward passes (tokenizing to reading the vectors),
    /// `batch` the rows of the widest pass.
    pub stats: RunStats,
}

/// Most positions (rows times padded length) in one forward pass: a
/// request beyond it runs as a few passes, so a large batch of long inputs
/// does not hold every layer's attention at once.
const MAX_POSITIONS_PER_PASS: usize = 16_384;

/// The setup of `model`, or the refusal a chat model earns.
pub fn setup_of(model: &LoadedModel) -> Result<&EmbeddingSetup, RunError> {
    model.embedding.as_ref().ok_or_else(|| {
        RunError::InvalidSettings(format!(
            "{} is not an embedding model (its folder has no sentence-transformers pooling in modules.json and 1_Pooling/config.json); pick an embedding model such as Qwen3-Embedding, or use this one for chat",
            model.dir.display()
        ))
    })
}

/// The context an input may fill, in tokens.
fn context_of(model: &LoadedModel) -> usize {
    model.config.max_position_embeddings.unwrap_or(usize::MAX)
}

/// Embeds `request.inputs` with `model`, already resident.
pub fn embed(
    model: &LoadedModel,
    request: &EmbedRequest,
    load_kind: LoadKind,
    load_ms: f64,
) -> Result<EmbedOutcome, RunError> {
    let setup = setup_of(model)?;
    if request.inputs.is_empty() {
        return Err(RunError::InvalidSettings(
            "there is nothing to embed; send at least one input".into(),
        ));
    }
    if let Some(dimensions) = request.dimensions {
        check_dimensions(model, setup, dimensions)?;
    }
    mlx_rs::memory::reset_peak_memory()?;
    let started = Instant::now();
    let context = context_of(model);
    let mut truncated_inputs = 0;
    let mut rows: Vec<Vec<u32>> = Vec::with_capacity(request.inputs.len());
    for (index, input) in request.inputs.iter().enumerate() {
        let mut ids = match input {
            EmbedInput::Text(text) => model
                .tokenizer
                .encode(text.as_str(), true)
                .map_err(|e| RunError::Tokenizer(e.to_string()))?
                .get_ids()
                .to_vec(),
            EmbedInput::Tokens(ids) => ids.clone(),
        };
        if ids.is_empty() {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= model.config.vocab_size as usize) {
            return Err(RunError::InvalidSettings(format!(
                "input {index} has token id {bad}, beyond this model's vocabulary of {}; send ids below it",
                model.config.vocab_size
            )));
        }
        if ids.len() > context {
            if !request.truncate {
                return Err(RunError::PromptTooLong(format!(
                    "input {index} is {} tokens, longer than this model's context of {context}; shorten it or ask for truncation",
                    ids.len()
                )));
            }
            // Keep the head and the last token: the special token the
            // tokenizer appends (`<|endoftext|>`, `[SEP]`) stays last.
            let last = ids[ids.len() - 1];
            ids.truncate(context - 1);
            ids.push(last);
            truncated_inputs += 1;
        }
        rows.push(ids);
    }

    // Longest first, so each pass pads its rows to a similar length.
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].len()));
    let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
    let mut widest_pass = 0;
    let mut passes = 0;
    let mut start = 0;
    while start < order.len() {
        let length = rows[order[start]].len();
        let fit = (MAX_POSITIONS_PER_PASS / length).max(1);
        let end = (start + fit).min(order.len());
        let group: Vec<&[u32]> = order[start..end].iter().map(|&i| &rows[i][..]).collect();
        let pooled = forward_pooled(model, setup.pooling, &group)?;
        for (&i, vector) in order[start..end].iter().zip(pooled) {
            vectors[i] = vector;
        }
        widest_pass = widest_pass.max(end - start);
        passes += 1;
        start = end;
    }
    for vector in &mut vectors {
        if let Some(dimensions) = request.dimensions {
            vector.truncate(dimensions);
        }
        // A Matryoshka prefix is normalized again, as the model card says.
        if setup.normalize || request.dimensions.is_some() {
            normalize(vector);
        }
    }
    let forward_ms = started.elapsed().as_secs_f64() * 1e3;
    let tokens_per_input: Vec<usize> = rows.iter().map(Vec::len).collect();
    let total: usize = tokens_per_input.iter().sum();
    let stats = RunStats {
        model_dir: model.dir.display().to_string(),
        model_type: model.model_type.clone(),
        quantization: model.quantization_label(),
        weights_bytes: model.weights_bytes as u64,
        load_kind,
        load_ms,
        ttft_ms: forward_ms,
        prefill_ms: forward_ms,
        prompt_tokens: total,
        prefill_tokens: total,
        prefill_tps: rate(total, forward_ms),
        prompt_tps: rate(total, forward_ms),
        prefill_step_size: MAX_POSITIONS_PER_PASS,
        mlx_peak_bytes: mlx_rs::memory::peak_memory()? as u64,
        mlx_active_bytes: mlx_rs::memory::active_memory()? as u64,
        mlx_cache_bytes: mlx_rs::memory::cache_memory()? as u64,
        batch: Some(super::stats::BatchShare {
            min_rows: widest_pass,
            median_rows: widest_pass,
            max_rows: widest_pass,
            prefill_chunks: passes,
            ..Default::default()
        }),
        ..RunStats::default()
    };
    Ok(EmbedOutcome {
        vectors,
        tokens_per_input,
        truncated_inputs,
        stats,
    })
}

fn rate(tokens: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        tokens as f64 / (ms / 1e3)
    } else {
        0.0
    }
}

/// Refuses a `dimensions` the model cannot give.
pub fn check_dimensions(
    model: &LoadedModel,
    setup: &EmbeddingSetup,
    dimensions: usize,
) -> Result<(), RunError> {
    let full = model.config.hidden_size as usize;
    if !setup.matryoshka && dimensions != full {
        return Err(RunError::InvalidSettings(format!(
            "this model gives {full}-dimensional vectors and was not trained to be cut shorter; leave out dimensions (or ask for {full})"
        )));
    }
    if dimensions == 0 || dimensions > full {
        return Err(RunError::InvalidSettings(format!(
            "dimensions must be between 1 and this model's {full}; {dimensions} is not"
        )));
    }
    Ok(())
}

/// Scales `vector` to unit length (a zero vector stays zero).
fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in vector {
            *x /= norm;
        }
    }
}

/// One padded forward pass over `rows`, pooled: one vector per row.
fn forward_pooled(
    model: &LoadedModel,
    pooling: Pooling,
    rows: &[&[u32]],
) -> Result<Vec<Vec<f32>>, RunError> {
    let batch = rows.len();
    let length = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    // Rows are padded on the right. The decoder attends causally, so a real
    // token never sees the padding after it: the causal mask is the padding
    // mask, and each row's states equal those of the row run alone.
    let pad = model.eos_token_ids.first().copied().unwrap_or(0);
    let mut ids: Vec<u32> = Vec::with_capacity(batch * length);
    for row in rows {
        ids.extend_from_slice(row);
        ids.extend(std::iter::repeat_n(pad, length - row.len()));
    }
    let tokens = Array::from_slice(&ids, &[batch as i32, length as i32]);
    let mut cache = model.model.make_cache(None);
    let hidden = model.model.hidden(&tokens, &mut cache)?;
    let hidden = hidden.as_dtype(mlx_rs::Dtype::Float32)?;
    let width = hidden.shape()[2];
    let pooled = match pooling {
        Pooling::LastToken => {
            let last: Vec<i32> = rows.iter().map(|r| r.len() as i32 - 1).collect();
            let index = Array::from_slice(&last, &[batch as i32, 1, 1]);
            let index = ops::broadcast_to(&index, &[batch as i32, 1, width])?;
            hidden.take_along_axis(&index, 1)?
        }
        Pooling::Cls => hidden.take_along_axis(ops::zeros::<i32>(&[batch as i32, 1, width])?, 1)?,
        Pooling::Mean => {
            let mask: Vec<f32> = rows
                .iter()
                .flat_map(|r| (0..length).map(move |p| if p < r.len() { 1.0 } else { 0.0 }))
                .collect();
            let mask = Array::from_slice(&mask, &[batch as i32, length as i32, 1]);
            let summed = ops::multiply(&hidden, &mask)?.sum_axis(1, true)?;
            let counts = mask.sum_axis(1, true)?;
            ops::divide(&summed, &counts)?
        }
    };
    let pooled = pooled.reshape(&[batch as i32, width])?;
    pooled.eval()?;
    let flat: &[f32] = pooled.as_slice();
    Ok(flat
        .chunks(width as usize)
        .map(<[f32]>::to_vec)
        .collect())
}
