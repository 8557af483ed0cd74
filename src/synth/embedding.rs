//! `ondo synth --embedding`: turns a synthesized folder into an embedding
//! model the way sentence-transformers lays one out: `modules.json`,
//! `1_Pooling/config.json`, `config_sentence_transformers.json`, and a
//! tokenizer whose post-processor marks the end of each input. For a
//! decoder (Qwen3-Embedding's form) that is last-token pooling over the
//! `<|end_of_text|>` appended to every input, normalized.

use std::path::Path;

use tokenizers::Tokenizer;
use tokenizers::processors::template::TemplateProcessing;

use super::SynthError;
use super::tokenizer::{END_OF_TEXT, TokenizerSynthError};
use crate::family::embedding::{Pooling, sentence_transformers_files};

/// Adds the sentence-transformers files for `pooling` (normalized) to the
/// model folder `dir`, and for last-token pooling makes the tokenizer
/// append the end-of-text token to every input, as Qwen3-Embedding's does.
pub fn make_embedding_folder(dir: &Path, pooling: Pooling) -> Result<(), SynthError> {
    let config_path = dir.join("config.json");
    let config: serde_json::Value = std::fs::read_to_string(&config_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| SynthError::Config {
            model_type: "embedding".into(),
            message: format!("{} is missing or not JSON", config_path.display()),
        })?;
    let hidden_size = config["hidden_size"].as_u64().unwrap_or(0) as usize;
    for (relative, value) in sentence_transformers_files(pooling, hidden_size, true) {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SynthError::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        super::write_json(&path, &value)?;
    }
    if pooling == Pooling::LastToken {
        append_end_of_text(&dir.join("tokenizer.json"))?;
    }
    Ok(())
}

/// Replaces the tokenizer's post-processor with one that appends
/// `<|end_of_text|>` (and prepends nothing).
fn append_end_of_text(path: &Path) -> Result<(), SynthError> {
    let step = "making the tokenizer append the end-of-text token";
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| TokenizerSynthError::Build {
        step,
        reason: e.to_string(),
    })?;
    let end = tokenizer
        .token_to_id(END_OF_TEXT)
        .ok_or_else(|| TokenizerSynthError::Build {
            step,
            reason: format!("{END_OF_TEXT} has no id"),
        })?;
    let build = |e: &dyn std::fmt::Display| TokenizerSynthError::Build {
        step,
        reason: e.to_string(),
    };
    let template = TemplateProcessing::builder()
        .try_single(format!("$A {END_OF_TEXT}"))
        .map_err(|e| build(&e))?
        .try_pair(format!("$A {END_OF_TEXT} $B:1 {END_OF_TEXT}:1"))
        .map_err(|e| build(&e))?
        .special_tokens(vec![(END_OF_TEXT, end)])
        .build()
        .map_err(|e| build(&e))?;
    tokenizer.with_post_processor(Some(template));
    tokenizer
        .save(path, true)
        .map_err(|source| TokenizerSynthError::WriteFile {
            path: path.to_owned(),
            source,
        })?;
    Ok(())
}
