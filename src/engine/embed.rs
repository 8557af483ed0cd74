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

use super::LoadError;
use super::load::LoadedModel;
use super::model::bert::{Bert, BertConfig};
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

pub use crate::family::embedding::ENCODER_MODEL_TYPES;

/// Whether the folder `dir` holds an encoder (by its config's model_type).
pub fn is_encoder_folder(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|c| c["model_type"].as_str().map(str::to_owned))
        .is_some_and(|t| ENCODER_MODEL_TYPES.contains(&t.as_str()))
}

/// An encoder ready to embed: weights resident, tokenizer loaded.
pub struct LoadedEncoder {
    pub dir: PathBuf,
    pub model_type: String,
    pub model: Bert,
    pub tokenizer: tokenizers::Tokenizer,
    pub weights_bytes: usize,
    pub float_dtype: String,
    pub embedding: Option<EmbeddingSetup>,
    /// The id rows are padded with (`[PAD]`, else 0); the mask hides it.
    pub pad_id: u32,
}

impl LoadedEncoder {
    /// Loads `dir` (a BERT folder) and evaluates every weight.
    pub fn load(dir: &std::path::Path) -> Result<Self, LoadError> {
        let config_path = dir.join("config.json");
        let invalid = |message: String| LoadError::ConfigInvalid {
            path: config_path.clone(),
            message,
        };
        let text = std::fs::read_to_string(&config_path).map_err(|e| invalid(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let model_type = value["model_type"].as_str().unwrap_or_default().to_owned();
        let config: BertConfig =
            serde_json::from_value(value.clone()).map_err(|e| invalid(e.to_string()))?;
        if !matches!(config.hidden_act.as_str(), "gelu" | "gelu_python") {
            return Err(invalid(format!(
                "hidden_act {} is not one Ondo's BERT computes (gelu)",
                config.hidden_act
            )));
        }
        let model = Bert::load(config, super::weights::load_weight_map(dir)?)?;
        let arrays = model.arrays();
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        let weights_bytes = arrays.iter().map(|a| a.nbytes()).sum();
        let float_dtype = format!("{:?}", arrays[0].dtype()).to_lowercase();
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).map_err(|e| {
            LoadError::ConfigInvalid {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            }
        })?;
        let pad_id = tokenizer.token_to_id("[PAD]").unwrap_or(0);
        Ok(Self {
            dir: dir.to_owned(),
            embedding: crate::family::embedding::detect(dir, &model_type),
            model_type,
            model,
            tokenizer,
            weights_bytes,
            float_dtype,
            pad_id,
        })
    }
}

/// A resident model that embeds: a decoder read as one, or an encoder.
#[derive(Clone, Copy)]
pub enum Embedder<'a> {
    Decoder(&'a LoadedModel),
    Encoder(&'a LoadedEncoder),
}

impl Embedder<'_> {
    fn dir(&self) -> &std::path::Path {
        match self {
            Embedder::Decoder(m) => &m.dir,
            Embedder::Encoder(m) => &m.dir,
        }
    }

    fn tokenizer(&self) -> &tokenizers::Tokenizer {
        match self {
            Embedder::Decoder(m) => &m.tokenizer,
            Embedder::Encoder(m) => &m.tokenizer,
        }
    }

    /// The context an input may fill, in tokens.
    fn context(&self) -> usize {
        match self {
            Embedder::Decoder(m) => m.config.max_position_embeddings.unwrap_or(usize::MAX),
            Embedder::Encoder(m) => m.model.config.max_position_embeddings,
        }
    }

    fn vocab_size(&self) -> usize {
        match self {
            Embedder::Decoder(m) => m.config.vocab_size as usize,
            Embedder::Encoder(m) => m.model.config.vocab_size,
        }
    }

    fn hidden_size(&self) -> usize {
        match self {
            Embedder::Decoder(m) => m.config.hidden_size as usize,
            Embedder::Encoder(m) => m.model.config.hidden_size,
        }
    }

    fn model_type(&self) -> &str {
        match self {
            Embedder::Decoder(m) => &m.model_type,
            Embedder::Encoder(m) => &m.model_type,
        }
    }

    fn quantization(&self) -> String {
        match self {
            Embedder::Decoder(m) => m.quantization_label(),
            Embedder::Encoder(m) => m.float_dtype.clone(),
        }
    }

    fn weights_bytes(&self) -> usize {
        match self {
            Embedder::Decoder(m) => m.weights_bytes,
            Embedder::Encoder(m) => m.weights_bytes,
        }
    }

    fn pad_id(&self) -> u32 {
        match self {
            Embedder::Decoder(m) => m.eos_token_ids.first().copied().unwrap_or(0),
            Embedder::Encoder(m) => m.pad_id,
        }
    }

    /// The last layer's states `[batch, length, hidden]` of right-padded
    /// `tokens`, row `r` with `lengths[r]` real tokens.
    fn hidden(&self, tokens: &Array, lengths: &[usize]) -> Result<Array, RunError> {
        match self {
            // The decoder attends causally, so a real token never sees the
            // padding after it: the causal mask is the padding mask, and
            // each row's states equal those of the row run alone.
            Embedder::Decoder(m) => {
                let mut cache = m.model.make_cache(None, None);
                Ok(m.model.hidden(tokens, &mut cache)?)
            }
            // The encoder attends both ways: its mask hides the padding.
            Embedder::Encoder(m) => Ok(m.model.hidden(tokens, lengths)?),
        }
    }
}

/// Most positions (rows times padded length) in one forward pass: a
/// request beyond it runs as a few passes, so a large batch of long inputs
/// does not hold every layer's attention at once.
const MAX_POSITIONS_PER_PASS: usize = 16_384;

/// The setup of `model`, or the refusal a chat model earns.
fn setup_of<'a>(model: &Embedder<'a>) -> Result<&'a EmbeddingSetup, RunError> {
    let setup = match *model {
        Embedder::Decoder(m) => m.embedding.as_ref(),
        Embedder::Encoder(m) => m.embedding.as_ref(),
    };
    setup.ok_or_else(|| {
        RunError::InvalidSettings(format!(
            "{} is not an embedding model (its folder has no sentence-transformers pooling in modules.json and 1_Pooling/config.json); pick an embedding model such as Qwen3-Embedding, or use this one for chat",
            model.dir().display()
        ))
    })
}

/// Embeds `request.inputs` with `model`, already resident.
pub fn embed(
    model: Embedder<'_>,
    request: &EmbedRequest,
    load_kind: LoadKind,
    load_ms: f64,
) -> Result<EmbedOutcome, RunError> {
    let setup = setup_of(&model)?;
    if request.inputs.is_empty() {
        return Err(RunError::InvalidSettings(
            "there is nothing to embed; send at least one input".into(),
        ));
    }
    if let Some(dimensions) = request.dimensions {
        check_dimensions(model.hidden_size(), setup, dimensions)?;
    }
    mlx_rs::memory::reset_peak_memory()?;
    let started = Instant::now();
    let context = model.context();
    let mut truncated_inputs = 0;
    let mut rows: Vec<Vec<u32>> = Vec::with_capacity(request.inputs.len());
    for (index, input) in request.inputs.iter().enumerate() {
        let mut ids = match input {
            EmbedInput::Text(text) => model
                .tokenizer()
                .encode(text.as_str(), true)
                .map_err(|e| RunError::Tokenizer(e.to_string()))?
                .get_ids()
                .to_vec(),
            EmbedInput::Tokens(ids) => ids.clone(),
        };
        if ids.is_empty() {
            return Err(RunError::EmptyPrompt);
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= model.vocab_size()) {
            return Err(RunError::InvalidSettings(format!(
                "input {index} has token id {bad}, beyond this model's vocabulary of {}; send ids below it",
                model.vocab_size()
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
        model_dir: model.dir().display().to_string(),
        model_type: model.model_type().to_owned(),
        quantization: model.quantization(),
        weights_bytes: model.weights_bytes() as u64,
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
    full: usize,
    setup: &EmbeddingSetup,
    dimensions: usize,
) -> Result<(), RunError> {
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
    model: Embedder<'_>,
    pooling: Pooling,
    rows: &[&[u32]],
) -> Result<Vec<Vec<f32>>, RunError> {
    let batch = rows.len();
    let length = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let pad = model.pad_id();
    let mut ids: Vec<u32> = Vec::with_capacity(batch * length);
    for row in rows {
        ids.extend_from_slice(row);
        ids.extend(std::iter::repeat_n(pad, length - row.len()));
    }
    let lengths: Vec<usize> = rows.iter().map(|r| r.len()).collect();
    let tokens = Array::from_slice(&ids, &[batch as i32, length as i32]);
    let hidden = model.hidden(&tokens, &lengths)?;
    let hidden = hidden.as_dtype(mlx_rs::Dtype::Float32)?;
    let width = hidden.shape()[2];
    let pooled = match pooling {
        Pooling::LastToken => {
            let last: Vec<i32> = lengths.iter().map(|&n| n as i32 - 1).collect();
            let index = Array::from_slice(&last, &[batch as i32, 1, 1]);
            let index = ops::broadcast_to(&index, &[batch as i32, 1, width])?;
            hidden.take_along_axis(&index, 1)?
        }
        Pooling::Cls => hidden.take_along_axis(ops::zeros::<i32>(&[batch as i32, 1, width])?, 1)?,
        Pooling::Mean => {
            let mask: Vec<f32> = lengths
                .iter()
                .flat_map(|&n| (0..length).map(move |p| if p < n { 1.0 } else { 0.0 }))
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
    Ok(flat.chunks(width as usize).map(<[f32]>::to_vec).collect())
}
