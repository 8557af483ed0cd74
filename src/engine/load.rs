//! Loading a model folder: config, weights (strictly), tokenizer, EOS ids.

use std::fs;
use std::path::{Path, PathBuf};

use super::LoadError;
use super::chat_template::ChatTemplate;
use super::constrain::{Grammars, OutputConstraint, TokenConstraint};
use super::model::decoder::Decoder;
use super::reply::ReplyFormat;
use super::request::RunError;
use super::weights::load_weight_map_read;
use crate::family::{self, ModelConfig};

/// A model ready to run: weights resident, tokenizer loaded.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub model_type: String,
    pub config: ModelConfig,
    pub model: Decoder,
    /// Shared with the runs that stream text from it.
    pub tokenizer: std::sync::Arc<tokenizers::Tokenizer>,
    /// Token ids that end an answer (from generation_config.json, config.json
    /// and the tokenizer's EOS token).
    pub eos_token_ids: Vec<u32>,
    /// Bytes of all weight arrays once resident.
    pub weights_bytes: usize,
    /// The chat template, when the folder has one.
    pub chat_template: Option<ChatTemplate>,
    /// The dtype of the unquantized weights ("float32", "bfloat16", ...).
    pub float_dtype: String,
    /// The vocabulary as the grammar engine sees it, built the first time
    /// a reply is held to a grammar.
    grammars: std::sync::OnceLock<Result<std::sync::Arc<Grammars>, String>>,
    /// How it pools its vectors, when the folder is an embedding model
    /// (sentence-transformers files); `None` for a chat model.
    pub embedding: Option<family::embedding::EmbeddingSetup>,
    /// The vision tower and projector, for a multimodal checkpoint that
    /// has them.
    pub vision: Option<super::vision::VisionModel>,
    /// This rank's share of a split model, timed alone when it loaded.
    pub share_compute: Option<crate::engine::distributed::compute::ShareCompute>,
}

fn read_json(path: &Path) -> Result<serde_json::Value, LoadError> {
    let text = fs::read_to_string(path).map_err(|e| LoadError::ConfigInvalid {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| LoadError::ConfigInvalid {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// `eos_token_id` may be one id or a list.
fn ids_of(value: &serde_json::Value) -> Vec<u32> {
    match value {
        serde_json::Value::Number(n) => n.as_u64().map(|v| v as u32).into_iter().collect(),
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_u64().map(|v| v as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl LoadedModel {
    /// Loads `dir` and evaluates every weight so the model is resident.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(LoadError::ConfigMissing {
                dir: dir.to_owned(),
            });
        }
        let config_value = read_json(&config_path)?;
        let config = family::settle(&config_value)
            .map_err(|error| LoadError::from_config(error, &config_path))?;
        let model_type = config.model_type.clone();
        // A rank of a model split by layers opens only the files holding
        // its layers: it may have downloaded no others.
        let share = crate::engine::distributed::part_of_this_process(dir);
        let reads = |name: &str| share.is_none_or(|share| share.reads(&config, name));
        let mut weights =
            load_weight_map_read(dir, share.map(|_| &reads as &dyn Fn(&str) -> bool))?;
        let vision = super::vision::load(
            &model_type,
            &config_value,
            config.hidden_size as usize,
            &mut weights,
            config.quantization.as_ref(),
        )?;
        // A rank of a split model keeps only its own layers.
        let split = crate::engine::distributed::Split::of_this_process(&config, dir)
            .map_err(LoadError::Split)?;
        let model = Decoder::load_split(&config, &config_path, weights, split)?;
        let mut arrays = model.arrays();
        if let Some(vision) = &vision {
            arrays.extend(vision.arrays());
        }
        mlx_rs::transforms::eval(arrays.iter().copied())?;
        let weights_bytes = arrays.iter().map(|a| a.nbytes()).sum();
        let float_dtype = model.float_dtype();

        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).map_err(|e| {
            LoadError::ConfigInvalid {
                path: tokenizer_path.clone(),
                message: e.to_string(),
            }
        })?;
        let mut eos_token_ids = ids_of(&config_value["eos_token_id"]);
        let generation_path = dir.join("generation_config.json");
        if generation_path.is_file() {
            eos_token_ids.extend(ids_of(&read_json(&generation_path)?["eos_token_id"]));
        }
        let tokenizer_config = dir.join("tokenizer_config.json");
        if tokenizer_config.is_file() {
            let value = read_json(&tokenizer_config)?;
            let eos = match &value["eos_token"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Object(o) => {
                    o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
                }
                _ => None,
            };
            if let Some(id) = eos.and_then(|t| tokenizer.token_to_id(&t)) {
                eos_token_ids.push(id);
            }
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        // A broken template is reported at load, not at the first message.
        let chat_template =
            ChatTemplate::from_model_dir(dir).map_err(|e| LoadError::ConfigInvalid {
                path: dir.join("tokenizer_config.json"),
                message: e.to_string(),
            })?;
        let embedding = family::embedding::detect(dir, &model_type);
        // A rank's share of a split model is timed alone once, here: what
        // its layers cost apart from the links (`distributed::compute`).
        let share_compute = match share {
            Some(_) => Some(
                crate::engine::distributed::compute::time_share(&model, config.vocab_size as usize)
                    .map_err(|e| {
                        LoadError::Split(format!("timing this rank's share: {}", e.what()))
                    })?,
            ),
            None => None,
        };
        Ok(Self {
            dir: dir.to_owned(),
            model_type,
            config,
            model,
            tokenizer: std::sync::Arc::new(tokenizer),
            eos_token_ids,
            weights_bytes,
            chat_template,
            float_dtype,
            grammars: std::sync::OnceLock::new(),
            embedding,
            vision,
            share_compute,
        })
    }

    /// A walker of `constraint`'s grammar over this model's vocabulary; a
    /// grammar that cannot be compiled is a request to change.
    pub fn constraint(
        &self,
        constraint: &OutputConstraint,
        format: ReplyFormat,
    ) -> Result<Option<TokenConstraint>, RunError> {
        let built_now = self.grammars.get().is_none();
        let grammars = self
            .grammars
            .get_or_init(|| {
                Grammars::new(
                    &self.dir.join("tokenizer.json"),
                    &self.eos_token_ids,
                    self.config.vocab_size.max(0) as usize,
                )
                .map(std::sync::Arc::new)
            })
            .as_ref()
            .map_err(|e| {
                RunError::InvalidSettings(format!("this model's output cannot be constrained: {e}"))
            })?;
        let syntax = match format {
            ReplyFormat::Marked { tool_calls, .. } => tool_calls,
            ReplyFormat::Harmony { .. } => None,
        };
        let mut walker = grammars.start(constraint, syntax).map_err(|e| {
            RunError::InvalidSettings(format!("the {} cannot be enforced: {e}", constraint.kind()))
        })?;
        if built_now && let Some(walker) = &mut walker {
            walker.add_setup_ms(grammars.build_ms);
        }
        Ok(walker)
    }

    /// "4bit", "8bit", or the float dtype when the weights are not quantized.
    /// With per-module formats, each distinct one, the default's first:
    /// "8bit+mxfp4" for 8-bit affine with experts in mxfp4.
    pub fn quantization_label(&self) -> String {
        match &self.config.quantization {
            Some(q) => q.label(),
            None => self.float_dtype.clone(),
        }
    }
}
