//! `ondo synth PRESET DIR --encoder bert`: a BERT embedding model of the
//! preset's size (bge-small's form): a WordPiece tokenizer trained on the
//! built-in corpus (lower-cased, `[CLS] ... [SEP]` around every input),
//! random weights under the checkpoint's names, config.json as transformers
//! writes it, and sentence-transformers' files (CLS or mean pooling,
//! normalized). Only float32: the encoder is for tests and benchmarks.

use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, random};
use serde_json::json;
use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{AddedToken, TokenizerImpl};

use super::tokenizer::{TokenizerSynthError, corpus_documents};
use super::{Shape, SynthError, write_json};
use crate::family::embedding::{Pooling, sentence_transformers_files};

/// BERT's special tokens, in the order bert-base's vocabulary has them
/// first.
const SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// BERT's learned positions (bge-small and all-MiniLM have 512).
const MAX_POSITIONS: usize = 512;

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct BertSummary {
    pub vocab_size: usize,
    pub parameters: u64,
}

/// Writes a BERT embedding folder of `shape`'s width, depth and heads into
/// `dir` (created; files in it replaced).
pub fn write_bert(
    shape: &Shape,
    dir: &Path,
    seed: u64,
    pooling: Pooling,
) -> Result<BertSummary, SynthError> {
    std::fs::create_dir_all(dir).map_err(|source| SynthError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let vocab_size = write_wordpiece(dir, shape.tokenizer_vocab_size, seed)?;
    let h = shape.hidden_size as i32;
    let i = shape.intermediate_size as i32;
    let mut tensors: Vec<(String, Vec<i32>)> = vec![
        (
            "embeddings.word_embeddings.weight".into(),
            vec![vocab_size as i32, h],
        ),
        (
            "embeddings.position_embeddings.weight".into(),
            vec![MAX_POSITIONS as i32, h],
        ),
        ("embeddings.token_type_embeddings.weight".into(), vec![2, h]),
        ("embeddings.LayerNorm.weight".into(), vec![h]),
        ("embeddings.LayerNorm.bias".into(), vec![h]),
    ];
    for n in 0..shape.num_hidden_layers {
        let p = format!("encoder.layer.{n}");
        for (name, out, inp) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", i, h),
            ("output.dense", h, i),
        ] {
            tensors.push((format!("{p}.{name}.weight"), vec![out, inp]));
            tensors.push((format!("{p}.{name}.bias"), vec![out]));
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            tensors.push((format!("{p}.{norm}.weight"), vec![h]));
            tensors.push((format!("{p}.{norm}.bias"), vec![h]));
        }
    }
    // The pooler a BertModel checkpoint carries (sentence embeddings do not
    // use it; Ondo's loader sets it aside).
    tensors.push(("pooler.dense.weight".into(), vec![h, h]));
    tensors.push(("pooler.dense.bias".into(), vec![h]));

    let mut arrays: Vec<(String, Array)> = Vec::with_capacity(tensors.len());
    let mut parameters = 0u64;
    for (index, (name, shape)) in tensors.iter().enumerate() {
        let mlx = |e: mlx_rs::error::Exception| SynthError::Mlx {
            tensor: name.clone(),
            message: crate::engine::mlx_failure(&e),
        };
        let key =
            random::key(seed.wrapping_mul(1_000_003).wrapping_add(index as u64)).map_err(mlx)?;
        // LayerNorm scales near 1, biases and matrices small: random, yet
        // every layer visibly changes the states.
        let array = if name.ends_with("LayerNorm.weight") {
            random::uniform::<f32, f32>(0.8, 1.2, &shape[..], &key).map_err(mlx)?
        } else if name.ends_with(".bias") {
            random::normal::<f32>(&shape[..], 0.0, 0.02, &key).map_err(mlx)?
        } else {
            random::normal::<f32>(&shape[..], 0.0, 0.05, &key).map_err(mlx)?
        };
        parameters += shape.iter().map(|&d| d as u64).product::<u64>();
        arrays.push((name.clone(), array));
    }
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let path = dir.join("model.safetensors");
    Array::save_safetensors(arrays.iter().map(|(n, a)| (n, a)), &metadata, &path).map_err(|e| {
        SynthError::Io {
            path: path.clone(),
            source: std::io::Error::other(crate::engine::mlx_failure(&e)),
        }
    })?;
    let config = json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": MAX_POSITIONS,
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": 2,
        "vocab_size": vocab_size,
    });
    write_json(&dir.join("config.json"), &config)?;
    for (relative, value) in sentence_transformers_files(pooling, shape.hidden_size, true) {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| SynthError::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        write_json(&path, &value)?;
    }
    Ok(BertSummary {
        vocab_size,
        parameters,
    })
}

type WordPieceTokenizer =
    TokenizerImpl<WordPiece, BertNormalizer, BertPreTokenizer, BertProcessing, WordPieceDecoder>;

/// Trains a WordPiece vocabulary of at most `vocab_size` on the built-in
/// corpus and writes `tokenizer.json` and `tokenizer_config.json`; returns
/// the vocabulary's size.
fn write_wordpiece(dir: &Path, vocab_size: usize, seed: u64) -> Result<usize, SynthError> {
    let build = |step: &'static str| {
        move |e: &dyn std::fmt::Display| TokenizerSynthError::Build {
            step,
            reason: e.to_string(),
        }
    };
    let mut tokenizer: WordPieceTokenizer = TokenizerImpl::new(WordPiece::default());
    tokenizer.with_normalizer(Some(BertNormalizer::default()));
    tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer.with_decoder(Some(WordPieceDecoder::default()));
    let mut trainer = WordPieceTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .special_tokens(
            SPECIALS
                .iter()
                .map(|t| AddedToken::from(*t, true))
                .collect(),
        )
        .build();
    let documents = corpus_documents(seed);
    tokenizer
        .train(&mut trainer, documents.iter())
        .map_err(|e| build("training the WordPiece vocabulary")(&e))?;
    let id = |token: &str| {
        tokenizer
            .token_to_id(token)
            .ok_or_else(|| TokenizerSynthError::Build {
                step: "adding the special tokens",
                reason: format!("{token} has no id"),
            })
    };
    let (cls, sep) = (id("[CLS]")?, id("[SEP]")?);
    tokenizer.with_post_processor(Some(BertProcessing::new(
        ("[SEP]".into(), sep),
        ("[CLS]".into(), cls),
    )));
    let path = dir.join("tokenizer.json");
    tokenizer
        .save(&path, true)
        .map_err(|source| TokenizerSynthError::WriteFile { path, source })?;
    let config = json!({
        "do_lower_case": true,
        "model_max_length": MAX_POSITIONS,
        "tokenizer_class": "BertTokenizer",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    });
    write_json(&dir.join("tokenizer_config.json"), &config)?;
    Ok(tokenizer.get_vocab_size(true))
}
