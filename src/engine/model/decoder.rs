//! The dense decoder that llama, mistral, qwen2 and qwen3 share: RMSNorm,
//! grouped-query attention with rope (llama3 scaling included), SwiGLU MLP.
//! What differs between them (projection biases, q/k norms, defaults) is a
//! field of `DecoderConfig`, filled in by each `model_type`'s own file.

use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{Array, ops};
use serde::Deserialize;

use super::experts::{ExpertsConfig, SparseExperts};
use super::{Linear, QuantConfig};
use crate::engine::LoadError;
use crate::engine::cache::{AttentionMask, LayerCache};
use crate::engine::weights::WeightMap;

/// `rope_scaling` of config.json.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    #[serde(default)]
    pub rope_type: Option<String>,
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    #[serde(default = "one")]
    pub factor: f32,
    #[serde(default)]
    pub low_freq_factor: Option<f32>,
    #[serde(default)]
    pub high_freq_factor: Option<f32>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<f32>,
}

fn one() -> f32 {
    1.0
}

/// The config.json keys the dense decoders share. Keys whose default differs
/// between architectures are optional here and settled by each model file.
#[derive(Debug, Clone, Deserialize)]
pub struct ConfigKeys {
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    #[serde(default)]
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub head_dim: Option<i32>,
    pub vocab_size: i32,
    pub rms_norm_eps: f32,
    #[serde(default)]
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// transformers 5 nests `rope_theta` and the scaling here.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub mlp_bias: Option<bool>,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub quantization: Option<QuantConfig>,
}

impl ConfigKeys {
    /// Parses config.json's value; a missing or mistyped key names the file.
    pub fn parse(value: &serde_json::Value, path: &Path) -> Result<Self, LoadError> {
        let mut keys: Self =
            serde_json::from_value(value.clone()).map_err(|e| LoadError::ConfigInvalid {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        if let Some(params) = keys.rope_parameters.clone() {
            if keys.rope_theta.is_none() {
                keys.rope_theta = params["rope_theta"].as_f64().map(|v| v as f32);
            }
            if keys.rope_scaling.is_none() && params.get("rope_type").is_some() {
                keys.rope_scaling = serde_json::from_value(params).ok();
            }
        }
        Ok(keys)
    }

    /// `rope_theta`, or a named error when an architecture requires it.
    pub fn require_rope_theta(&self, path: &Path) -> Result<f32, LoadError> {
        self.rope_theta.ok_or_else(|| LoadError::ConfigInvalid {
            path: path.to_owned(),
            message: "rope_theta is missing".into(),
        })
    }
}

/// Everything that shapes a dense decoder's computation, settled.
#[derive(Debug, Clone)]
pub struct DecoderConfig {
    pub model_type: String,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub vocab_size: i32,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_traditional: bool,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm of each head's queries and keys before rope (qwen3).
    pub qk_norm: bool,
    pub quantization: Option<QuantConfig>,
    /// The longest context the model was trained for, when config.json says.
    pub max_position_embeddings: Option<usize>,
    /// Routed experts in place of the dense MLP, in the layers they name.
    pub experts: Option<ExpertsConfig>,
}

impl DecoderConfig {
    /// The shared keys with an architecture's choices for the rest.
    pub fn from_keys(model_type: &str, keys: ConfigKeys, rope_theta: f32, tie: bool) -> Self {
        Self {
            model_type: model_type.to_owned(),
            hidden_size: keys.hidden_size,
            intermediate_size: keys.intermediate_size,
            num_hidden_layers: keys.num_hidden_layers,
            num_attention_heads: keys.num_attention_heads,
            num_key_value_heads: keys.num_key_value_heads.unwrap_or(keys.num_attention_heads),
            head_dim: keys
                .head_dim
                .unwrap_or(keys.hidden_size / keys.num_attention_heads.max(1)),
            vocab_size: keys.vocab_size,
            rms_norm_eps: keys.rms_norm_eps,
            rope_theta,
            rope_traditional: keys.rope_traditional,
            rope_scaling: keys.rope_scaling,
            tie_word_embeddings: tie,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: keys.mlp_bias.unwrap_or(false),
            qk_norm: false,
            quantization: keys.quantization,
            max_position_embeddings: keys.max_position_embeddings,
            experts: None,
        }
    }
}

/// Rotary position embedding with optional llama3 frequency scaling.
struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    /// Set for llama3 scaling; then `base` is unused.
    freqs: Option<Array>,
}

impl Rope {
    fn new(config: &DecoderConfig, config_path: &Path) -> Result<Self, LoadError> {
        let dims = config.head_dim;
        let freqs = match &config.rope_scaling {
            None => None,
            Some(s) => {
                let kind = s.rope_type.as_deref().or(s.legacy_type.as_deref());
                match kind {
                    Some("llama3") => Some(llama3_freqs(dims, config.rope_theta, s)?),
                    // "default" and linear scaling with factor 1 are plain rope.
                    Some("default") | None => None,
                    Some(other) => {
                        return Err(LoadError::ConfigInvalid {
                            path: config_path.to_owned(),
                            message: format!("rope_scaling type `{other}` is not supported yet"),
                        });
                    }
                }
            }
        };
        Ok(Self {
            dims,
            traditional: config.rope_traditional,
            base: config.rope_theta,
            freqs,
        })
    }

    fn apply(&self, x: &Array, offset: i32) -> Result<Array, Exception> {
        match &self.freqs {
            Some(freqs) => fast::rope(x, self.dims, self.traditional, None, 1.0, offset, freqs),
            None => fast::rope(x, self.dims, self.traditional, self.base, 1.0, offset, None),
        }
    }
}

/// Llama 3's scaled rope frequencies, computed with the same f32 operations
/// in the same order as mlx-lm so both runs rotate identically.
fn llama3_freqs(dims: i32, base: f32, s: &RopeScaling) -> Result<Array, Exception> {
    let low_freq_factor = s.low_freq_factor.unwrap_or(1.0);
    let high_freq_factor = s.high_freq_factor.unwrap_or(4.0);
    let old_context = s.original_max_position_embeddings.unwrap_or(8192.0);
    let low_freq_wavelen = old_context / low_freq_factor;
    let high_freq_wavelen = old_context / high_freq_factor;

    let exponents = ops::divide(Array::arange::<_, i32>(0, dims, 2)?, Array::from_int(dims))?;
    let freqs = ops::power(Array::from_f32(base), &exponents)?;
    let wavelens = ops::multiply(Array::from_f32(2.0 * std::f32::consts::PI), &freqs)?;
    let scaled = ops::multiply(&freqs, Array::from_f32(s.factor))?;
    let freqs = ops::select(
        &ops::gt(&wavelens, Array::from_f32(low_freq_wavelen))?,
        &scaled,
        &freqs,
    )?;
    let is_medium = ops::logical_and(
        &ops::gt(&wavelens, Array::from_f32(high_freq_wavelen))?,
        &ops::lt(&wavelens, Array::from_f32(low_freq_wavelen))?,
    )?;
    let smooth = ops::divide(
        ops::subtract(
            ops::divide(Array::from_f32(old_context), &wavelens)?,
            Array::from_f32(low_freq_factor),
        )?,
        Array::from_f32(high_freq_factor - low_freq_factor),
    )?;
    let denominator = ops::add(
        ops::divide(
            ops::subtract(Array::from_f32(1.0), &smooth)?,
            Array::from_f32(s.factor),
        )?,
        &smooth,
    )?;
    let smooth_freqs = ops::divide(&freqs, &denominator)?;
    let out = ops::select(&is_medium, &smooth_freqs, &freqs)?;
    out.eval()?;
    Ok(out)
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    scale: f32,
    /// Per-head RMSNorm weights of queries and keys (qwen3).
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    eps: f32,
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// A layer's feed-forward: one dense MLP, or routed experts.
enum FeedForward {
    Dense(Mlp),
    Experts(SparseExperts),
}

struct Layer {
    input_layernorm: Array,
    self_attn: Attention,
    post_attention_layernorm: Array,
    mlp: FeedForward,
}

/// A loaded dense decoder. The KV cache lives outside, one per layer.
pub struct Decoder {
    embed_tokens: Linear,
    layers: Vec<Layer>,
    norm: Array,
    /// `None` when the head is tied to the embedding.
    lm_head: Option<Linear>,
    rope: Rope,
    eps: f32,
}

impl Decoder {
    /// Builds the model from a config and takes exactly its tensors from
    /// `weights` (anything left over is an error).
    pub fn load(
        config: &DecoderConfig,
        config_path: &Path,
        mut weights: WeightMap,
    ) -> Result<Self, LoadError> {
        if let Some(q) = &config.quantization {
            q.validate(config_path)?;
        }
        let quant = config.quantization.as_ref();
        let hidden = config.hidden_size;
        let (heads, kv_heads, head_dim) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let w = &mut weights;
        let embed_tokens = Linear::load(
            w,
            "model.embed_tokens",
            config.vocab_size,
            hidden,
            quant,
            false,
        )?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let (qkv_bias, o_bias, mlp_bias) = (config.qkv_bias, config.o_bias, config.mlp_bias);
            let (q_norm, k_norm) = if config.qk_norm {
                (
                    Some(w.take_float(&format!("{p}.self_attn.q_norm.weight"), &[head_dim])?),
                    Some(w.take_float(&format!("{p}.self_attn.k_norm.weight"), &[head_dim])?),
                )
            } else {
                (None, None)
            };
            let mlp =
                match &config.experts {
                    Some(experts) if experts.is_sparse(i) => FeedForward::Experts(
                        SparseExperts::load(w, &format!("{p}.mlp"), hidden, experts, quant)?,
                    ),
                    _ => FeedForward::Dense(Mlp {
                        gate_proj: Linear::load(
                            w,
                            &format!("{p}.mlp.gate_proj"),
                            config.intermediate_size,
                            hidden,
                            quant,
                            mlp_bias,
                        )?,
                        up_proj: Linear::load(
                            w,
                            &format!("{p}.mlp.up_proj"),
                            config.intermediate_size,
                            hidden,
                            quant,
                            mlp_bias,
                        )?,
                        down_proj: Linear::load(
                            w,
                            &format!("{p}.mlp.down_proj"),
                            hidden,
                            config.intermediate_size,
                            quant,
                            mlp_bias,
                        )?,
                    }),
                };
            layers.push(Layer {
                input_layernorm: w.take_float(&format!("{p}.input_layernorm.weight"), &[hidden])?,
                self_attn: Attention {
                    q_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.q_proj"),
                        heads * head_dim,
                        hidden,
                        quant,
                        qkv_bias,
                    )?,
                    k_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.k_proj"),
                        kv_heads * head_dim,
                        hidden,
                        quant,
                        qkv_bias,
                    )?,
                    v_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.v_proj"),
                        kv_heads * head_dim,
                        hidden,
                        quant,
                        qkv_bias,
                    )?,
                    o_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.o_proj"),
                        hidden,
                        heads * head_dim,
                        quant,
                        o_bias,
                    )?,
                    heads,
                    kv_heads,
                    head_dim,
                    scale: (head_dim as f32).powf(-0.5),
                    q_norm,
                    k_norm,
                    eps: config.rms_norm_eps,
                },
                post_attention_layernorm: w
                    .take_float(&format!("{p}.post_attention_layernorm.weight"), &[hidden])?,
                mlp,
            });
        }
        let norm = w.take_float("model.norm.weight", &[hidden])?;
        let lm_head = if config.tie_word_embeddings {
            // Some exports keep a copy of the tied head; mlx-lm drops it too.
            w.discard("lm_head.weight");
            None
        } else {
            Some(Linear::load(
                w,
                "lm_head",
                config.vocab_size,
                hidden,
                quant,
                false,
            )?)
        };
        // Precomputed rope tables that some exports carry are not weights.
        let rotary: Vec<String> = w
            .tensors
            .keys()
            .filter(|k| k.contains("rotary_emb.inv_freq"))
            .cloned()
            .collect();
        for k in rotary {
            w.discard(&k);
        }
        weights.finish(&config.model_type)?;
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Rope::new(config, config_path)?,
            eps: config.rms_norm_eps,
        })
    }

    /// The dtype of the norm weights: the model's compute dtype.
    pub fn float_dtype(&self) -> String {
        format!("{:?}", self.norm.dtype()).to_lowercase()
    }

    /// One empty cache per layer: growing, or rotating at `max_kv_size`
    /// positions (keeping the first `ROTATING_KEEP` tokens, as mlx-lm does).
    pub fn make_cache(&self, max_kv_size: Option<usize>) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|_| LayerCache::new(max_kv_size))
            .collect()
    }

    /// Number of layers (one cache each).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Every weight array, to evaluate (make resident) after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed_tokens.arrays();
        for layer in &self.layers {
            out.push(&layer.input_layernorm);
            out.push(&layer.post_attention_layernorm);
            out.extend(layer.self_attn.q_norm.iter());
            out.extend(layer.self_attn.k_norm.iter());
            for linear in [
                &layer.self_attn.q_proj,
                &layer.self_attn.k_proj,
                &layer.self_attn.v_proj,
                &layer.self_attn.o_proj,
            ] {
                out.extend(linear.arrays());
            }
            match &layer.mlp {
                FeedForward::Dense(mlp) => {
                    for linear in [&mlp.gate_proj, &mlp.up_proj, &mlp.down_proj] {
                        out.extend(linear.arrays());
                    }
                }
                FeedForward::Experts(experts) => out.extend(experts.arrays()),
            }
        }
        out.push(&self.norm);
        if let Some(head) = &self.lm_head {
            out.extend(head.arrays());
        }
        out
    }

    /// Hidden states of the last layer (after the final norm) for `tokens`
    /// `[batch, length]`, extending `cache` by `length` positions.
    pub fn hidden(&self, tokens: &Array, cache: &mut [LayerCache]) -> Result<Array, Exception> {
        let length = tokens.shape()[1];
        // Every layer's cache holds the same positions, so one mask serves all.
        let mask = match cache.first() {
            Some(first) => first.mask(length)?,
            None => AttentionMask::None,
        };
        let mut h = self.embed_tokens.embed(tokens)?;
        for (layer, kv) in self.layers.iter().zip(cache.iter_mut()) {
            let normed = fast::rms_norm(&h, Some(&layer.input_layernorm), self.eps)?;
            let attn = layer.self_attn.forward(&normed, kv, &self.rope, &mask)?;
            h = ops::add(&h, &attn)?;
            let normed = fast::rms_norm(&h, Some(&layer.post_attention_layernorm), self.eps)?;
            let mlp = match &layer.mlp {
                FeedForward::Dense(mlp) => mlp.forward(&normed)?,
                FeedForward::Experts(experts) => experts.forward(&normed)?,
            };
            h = ops::add(&h, &mlp)?;
        }
        fast::rms_norm(&h, Some(&self.norm), self.eps)
    }

    /// Logits over the vocabulary for hidden states `[.., hidden]`.
    pub fn logits(&self, hidden: &Array) -> Result<Array, Exception> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => self.embed_tokens.forward(hidden),
        }
    }
}

impl Attention {
    fn forward(
        &self,
        x: &Array,
        kv: &mut LayerCache,
        rope: &Rope,
        mask: &AttentionMask,
    ) -> Result<Array, Exception> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        // A decode step has one position, and then `[B, 1, H, D]` and
        // `[B, H, 1, D]` list the same values in the same order: one reshape
        // does what reshape-then-transpose does, one primitive fewer for each
        // of q, k, v and the output, per layer and token (the host's dispatch
        // of primitives is what bounds decoding on a GPU).
        let split = |y: Array, heads: i32| -> Result<Array, Exception> {
            if l == 1 {
                y.reshape(&[b, heads, 1, self.head_dim])
            } else {
                y.reshape(&[b, l, heads, self.head_dim])?
                    .transpose_axes(&[0, 2, 1, 3])
            }
        };
        let mut q = split(self.q_proj.forward(x)?, self.heads)?;
        let mut k = split(self.k_proj.forward(x)?, self.kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.kv_heads)?;
        if let Some(weight) = &self.q_norm {
            q = fast::rms_norm(&q, Some(weight), self.eps)?;
        }
        if let Some(weight) = &self.k_norm {
            k = fast::rms_norm(&k, Some(weight), self.eps)?;
        }
        // Rope positions count every token seen, also those a rotating
        // cache has dropped.
        let q = rope.apply(&q, kv.offset())?;
        let k = rope.apply(&k, kv.offset())?;
        let (k, v) = kv.update_and_fetch(&k, &v)?;
        let mask = match mask {
            AttentionMask::None => None,
            AttentionMask::Causal => Some(ScaledDotProductAttentionMask::Causal),
            AttentionMask::Array(m) => Some(ScaledDotProductAttentionMask::Array(m)),
        };
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask, None)?;
        let o = if l == 1 {
            o.reshape(&[b, 1, self.heads * self.head_dim])?
        } else {
            o.transpose_axes(&[0, 2, 1, 3])?
                .reshape(&[b, l, self.heads * self.head_dim])?
        };
        self.o_proj.forward(&o)
    }
}

impl Mlp {
    fn forward(&self, x: &Array) -> Result<Array, Exception> {
        let gate = mlx_rs::nn::silu(self.gate_proj.forward(x)?)?;
        let up = self.up_proj.forward(x)?;
        self.down_proj.forward(&ops::multiply(&gate, &up)?)
    }
}
