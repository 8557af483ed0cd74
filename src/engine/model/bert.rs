//! BERT, the encoder behind bge, all-MiniLM and e5 embeddings: learned
//! absolute positions and token types added to the word embeddings, then
//! layers that attend in both directions (padding hidden by a mask), each
//! sublayer's output added to its input and then LayerNorm-ed (post-norm),
//! and an exact (erf) GELU between the feed-forward's two matrices. Weight
//! names are the checkpoint's (`embeddings.word_embeddings.weight`,
//! `encoder.layer.N.attention.self.query.weight`, ...), with or without the
//! `bert.` prefix a pretraining checkpoint carries.

use mlx_rs::error::Exception;
use mlx_rs::{Array, fast, ops};
use serde::Deserialize;

use crate::engine::LoadError;
use crate::engine::weights::WeightMap;

use super::activation::gelu_exact;

/// The config.json keys BERT reads, with transformers' defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_token_types")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f32,
    #[serde(default = "default_act")]
    pub hidden_act: String,
}

fn default_positions() -> usize {
    512
}
fn default_token_types() -> usize {
    2
}
fn default_eps() -> f32 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}

/// A dense layer: `x @ weight.T + bias`.
pub(crate) struct Dense {
    pub(crate) weight: Array,
    pub(crate) bias: Array,
}

impl Dense {
    pub(crate) fn take(
        w: &mut WeightMap,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Result<Self, LoadError> {
        Ok(Self {
            weight: w.take_float(&format!("{name}.weight"), &[out as i32, inp as i32])?,
            bias: w.take_float(&format!("{name}.bias"), &[out as i32])?,
        })
    }

    pub(crate) fn forward(&self, x: &Array) -> Result<Array, Exception> {
        ops::addmm(&self.bias, x, self.weight.t(), None, None)
    }
}

pub(crate) struct LayerNorm {
    pub(crate) weight: Array,
    pub(crate) bias: Array,
}

impl LayerNorm {
    pub(crate) fn take(w: &mut WeightMap, name: &str, size: usize) -> Result<Self, LoadError> {
        Ok(Self {
            weight: w.take_float(&format!("{name}.weight"), &[size as i32])?,
            bias: w.take_float(&format!("{name}.bias"), &[size as i32])?,
        })
    }

    pub(crate) fn forward(&self, x: &Array, eps: f32) -> Result<Array, Exception> {
        fast::layer_norm(x, &self.weight, &self.bias, eps)
    }
}

struct BertLayer {
    query: Dense,
    key: Dense,
    value: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

/// A loaded BERT encoder.
pub struct Bert {
    pub config: BertConfig,
    word_embeddings: Array,
    position_embeddings: Array,
    token_type_embeddings: Array,
    embeddings_norm: LayerNorm,
    layers: Vec<BertLayer>,
}

impl Bert {
    /// Builds the encoder from `weights`, strictly: every tensor of the
    /// config is there with its shape, and nothing else is (the pooler's
    /// dense layer, which sentence embeddings do not use, and the
    /// `position_ids` buffer old checkpoints saved are set aside).
    pub fn load(config: BertConfig, mut weights: WeightMap) -> Result<Self, LoadError> {
        // A pretraining checkpoint names everything under `bert.`.
        let names: Vec<String> = weights.tensors.keys().cloned().collect();
        for name in names {
            if let Some(stripped) = name.strip_prefix("bert.")
                && let Some(stored) = weights.tensors.remove(&name)
            {
                weights.tensors.insert(stripped.to_owned(), stored);
            }
        }
        for unused in [
            "pooler.dense.weight",
            "pooler.dense.bias",
            "embeddings.position_ids",
        ] {
            weights.discard(unused);
        }
        let h = config.hidden_size;
        let i = config.intermediate_size;
        let w = &mut weights;
        let word_embeddings = w.take_float(
            "embeddings.word_embeddings.weight",
            &[config.vocab_size as i32, h as i32],
        )?;
        let position_embeddings = w.take_float(
            "embeddings.position_embeddings.weight",
            &[config.max_position_embeddings as i32, h as i32],
        )?;
        let token_type_embeddings = w.take_float(
            "embeddings.token_type_embeddings.weight",
            &[config.type_vocab_size as i32, h as i32],
        )?;
        let embeddings_norm = LayerNorm::take(w, "embeddings.LayerNorm", h)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for n in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{n}");
            layers.push(BertLayer {
                query: Dense::take(w, &format!("{p}.attention.self.query"), h, h)?,
                key: Dense::take(w, &format!("{p}.attention.self.key"), h, h)?,
                value: Dense::take(w, &format!("{p}.attention.self.value"), h, h)?,
                attention_out: Dense::take(w, &format!("{p}.attention.output.dense"), h, h)?,
                attention_norm: LayerNorm::take(w, &format!("{p}.attention.output.LayerNorm"), h)?,
                intermediate: Dense::take(w, &format!("{p}.intermediate.dense"), i, h)?,
                output: Dense::take(w, &format!("{p}.output.dense"), h, i)?,
                output_norm: LayerNorm::take(w, &format!("{p}.output.LayerNorm"), h)?,
            });
        }
        weights.finish("bert")?;
        Ok(Self {
            config,
            word_embeddings,
            position_embeddings,
            token_type_embeddings,
            embeddings_norm,
            layers,
        })
    }

    /// Every weight array (to evaluate at load and count bytes).
    pub fn arrays(&self) -> Vec<&Array> {
        let mut all = vec![
            &self.word_embeddings,
            &self.position_embeddings,
            &self.token_type_embeddings,
            &self.embeddings_norm.weight,
            &self.embeddings_norm.bias,
        ];
        for l in &self.layers {
            for dense in [
                &l.query,
                &l.key,
                &l.value,
                &l.attention_out,
                &l.intermediate,
                &l.output,
            ] {
                all.push(&dense.weight);
                all.push(&dense.bias);
            }
            for norm in [&l.attention_norm, &l.output_norm] {
                all.push(&norm.weight);
                all.push(&norm.bias);
            }
        }
        all
    }

    /// The last layer's states `[batch, length, hidden]` for `tokens`
    /// `[batch, length]`, row `r` holding `lengths[r]` real tokens and
    /// padding after them, which no token attends to. Token types are all
    /// 0 (one segment), as sentence-transformers feeds a single text.
    pub fn hidden(&self, tokens: &Array, lengths: &[usize]) -> Result<Array, Exception> {
        let shape = tokens.shape();
        let (batch, length) = (shape[0], shape[1]);
        let positions = Array::from_iter(0..length, &[1, length]);
        let h = ops::add(
            &ops::add(
                &self.word_embeddings.take_axis(tokens, 0)?,
                &self.position_embeddings.take_axis(&positions, 0)?,
            )?,
            &self.token_type_embeddings.index_row(0)?,
        )?;
        let eps = self.config.layer_norm_eps;
        let mut h = self.embeddings_norm.forward(&h, eps)?;
        // Additive mask over keys: 0 for a real token, a large negative for
        // padding, `[batch, 1, 1, length]` so it spreads over heads and
        // queries.
        let mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&n| (0..length as usize).map(move |p| if p < n { 0.0 } else { -1e9 }))
            .collect();
        let mask = Array::from_slice(&mask, &[batch, 1, 1, length]).as_dtype(h.dtype())?;
        let heads = self.config.num_attention_heads as i32;
        let head_dim = self.config.hidden_size as i32 / heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let split = |x: Array| -> Result<Array, Exception> {
            x.reshape(&[batch, length, heads, head_dim])?
                .transpose_axes(&[0, 2, 1, 3])
        };
        for layer in &self.layers {
            let q = split(layer.query.forward(&h)?)?;
            let k = split(layer.key.forward(&h)?)?;
            let v = split(layer.value.forward(&h)?)?;
            let attended = fast::scaled_dot_product_attention(q, k, v, scale, &mask, None)?
                .transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[batch, length, heads * head_dim])?;
            let attended = layer.attention_out.forward(&attended)?;
            let h1 = layer
                .attention_norm
                .forward(&ops::add(&attended, &h)?, eps)?;
            let inner = gelu_exact(&layer.intermediate.forward(&h1)?)?;
            let out = layer.output.forward(&inner)?;
            h = layer.output_norm.forward(&ops::add(&out, &h1)?, eps)?;
        }
        Ok(h)
    }
}

trait RowOf {
    fn index_row(&self, row: i32) -> Result<Array, Exception>;
}

impl RowOf for Array {
    /// Row `row` of a matrix, as `[1, 1, columns]` to add to every position.
    fn index_row(&self, row: i32) -> Result<Array, Exception> {
        let columns = self.shape()[1];
        self.take_axis(Array::from_int(row), 0)?
            .reshape(&[1, 1, columns])
    }
}
