//! Whether a model folder is an embedding model, and how it pools: read the
//! way sentence-transformers reads a folder (`modules.json` naming a
//! `Pooling` module whose folder holds `config.json` with `pooling_mode_*`
//! keys, an optional `Normalize` module; `config_sentence_transformers.json`
//! marks a folder made for it). No MLX here: the engine, the library and the
//! catalog all read this.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The model types that are encoders (attending both ways): the engine
/// loads them apart from the decoder families, and they only embed.
pub const ENCODER_MODEL_TYPES: [&str; 1] = ["bert"];

/// How one vector is made from a sequence's hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The mean over the real (unpadded) tokens.
    Mean,
    /// The last real token's state (decoders read causally: Qwen3-Embedding).
    LastToken,
}

impl Pooling {
    /// The name sentence-transformers' pooling config uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::LastToken => "lasttoken",
        }
    }
}

/// What makes a folder an embedding model, and how its vectors are made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingSetup {
    pub pooling: Pooling,
    /// Vectors are scaled to unit length (a `Normalize` module).
    pub normalize: bool,
    /// The model was trained so that a prefix of its vector is itself an
    /// embedding (Matryoshka): a client may ask for fewer dimensions.
    pub matryoshka: bool,
}

/// Reads the sentence-transformers files of `dir`; `None` when it has none
/// (a chat model) or they name no pooling Ondo knows.
///
/// A converted folder may keep `modules.json` (and
/// `config_sentence_transformers.json`) but not the `1_Pooling/` folder
/// (conversions copy the top-level files): its pooling is then the one
/// sentence-transformers gives such a model, last token for a decoder
/// (every decoder embedding model pools so: Qwen3-Embedding, gte-Qwen2),
/// the mean for an encoder (sentence-transformers' default).
pub fn detect(dir: &Path, model_type: &str) -> Option<EmbeddingSetup> {
    let modules: Vec<serde_json::Value> = read_json(&dir.join("modules.json"))
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let module_of = |kind: &str| {
        modules.iter().find(|m| {
            m["type"]
                .as_str()
                .is_some_and(|t| t.ends_with(&format!(".{kind}")) || t == kind)
        })
    };
    let made_for_sentence_transformers =
        module_of("Pooling").is_some() || dir.join("config_sentence_transformers.json").is_file();
    if !made_for_sentence_transformers {
        return None;
    }
    let pooling_dir = module_of("Pooling")
        .and_then(|m| m["path"].as_str())
        .unwrap_or("1_Pooling");
    let pooling = match read_json(&dir.join(pooling_dir).join("config.json")) {
        Some(config) => {
            let on = |key: &str| config[key].as_bool().unwrap_or(false);
            // Real folders set exactly one mode.
            if on("pooling_mode_lasttoken") {
                Pooling::LastToken
            } else if on("pooling_mode_cls_token") {
                Pooling::Cls
            } else if on("pooling_mode_mean_tokens") {
                Pooling::Mean
            } else {
                return None;
            }
        }
        None if ENCODER_MODEL_TYPES.contains(&model_type) => Pooling::Mean,
        None => Pooling::LastToken,
    };
    // Qwen3-Embedding is trained with Matryoshka representation learning
    // (its model card: "MRL support"); its folder does not say so, so the
    // family does.
    let matryoshka = pooling == Pooling::LastToken && model_type.starts_with("qwen3");
    Some(EmbeddingSetup {
        pooling,
        normalize: module_of("Normalize").is_some(),
        matryoshka,
    })
}

/// Whether `dir` looks like an embedding model without settling its config
/// (for the library's listing).
pub fn is_embedding_folder(dir: &Path) -> bool {
    let model_type = read_json(&dir.join("config.json"))
        .and_then(|c| c["model_type"].as_str().map(str::to_owned))
        .unwrap_or_default();
    detect(dir, &model_type).is_some()
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// The sentence-transformers files for a folder pooled as `pooling`:
/// `(relative path, contents)`, as sentence-transformers writes them.
pub fn sentence_transformers_files(
    pooling: Pooling,
    hidden_size: usize,
    normalize: bool,
) -> Vec<(&'static str, serde_json::Value)> {
    let mut modules = vec![
        serde_json::json!({"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}),
        serde_json::json!({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
    ];
    if normalize {
        modules.push(serde_json::json!({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}));
    }
    let pooling_config = serde_json::json!({
        "word_embedding_dimension": hidden_size,
        "pooling_mode_cls_token": pooling == Pooling::Cls,
        "pooling_mode_mean_tokens": pooling == Pooling::Mean,
        "pooling_mode_max_tokens": false,
        "pooling_mode_mean_sqrt_len_tokens": false,
        "pooling_mode_weightedmean_tokens": false,
        "pooling_mode_lasttoken": pooling == Pooling::LastToken,
        "include_prompt": true,
    });
    let st_config = serde_json::json!({
        "__version__": {"sentence_transformers": "3.0.1"},
        "prompts": {},
        "default_prompt_name": null,
        "similarity_fn_name": "cosine",
    });
    vec![
        ("modules.json", serde_json::Value::Array(modules)),
        ("1_Pooling/config.json", pooling_config),
        ("config_sentence_transformers.json", st_config),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        for (pooling, normalize) in [
            (Pooling::LastToken, true),
            (Pooling::Cls, false),
            (Pooling::Mean, true),
        ] {
            for (path, value) in sentence_transformers_files(pooling, 64, normalize) {
                let path = dir.path().join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, value.to_string()).unwrap();
            }
            let setup = detect(dir.path(), "qwen3").unwrap();
            assert_eq!(setup.pooling, pooling);
            assert_eq!(setup.normalize, normalize);
            assert_eq!(setup.matryoshka, pooling == Pooling::LastToken);
        }
    }

    #[test]
    fn a_converted_folder_without_its_pooling_folder_pools_as_its_kind_does() {
        let dir = tempfile::tempdir().unwrap();
        for (path, value) in sentence_transformers_files(Pooling::Cls, 64, true) {
            if path.starts_with("1_Pooling") {
                continue;
            }
            std::fs::write(dir.path().join(path), value.to_string()).unwrap();
        }
        let decoder = detect(dir.path(), "qwen3").unwrap();
        assert_eq!(decoder.pooling, Pooling::LastToken);
        assert!(decoder.normalize && decoder.matryoshka);
        assert_eq!(detect(dir.path(), "bert").unwrap().pooling, Pooling::Mean);
    }

    #[test]
    fn a_chat_folder_is_not_one() {
        let dir = tempfile::tempdir().unwrap();
        assert!(detect(dir.path(), "llama").is_none());
    }
}
