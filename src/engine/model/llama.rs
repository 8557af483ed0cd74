//! Llama (2, 3, 3.1, 3.2) as `model_type: llama`: RMSNorm, grouped-query
//! attention with rope (llama3 scaling included), SwiGLU MLP.

use std::path::Path;

use mlx_rs::error::Exception;
use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::{Array, ops};
use serde::Deserialize;

use super::{Linear, QuantConfig};
use crate::engine::LoadError;
use crate::engine::cache::KvCache;
use crate::engine::weights::WeightMap;

fn default_rope_theta() -> f32 {
    10000.0
}

fn default_true() -> bool {
    true
}

/// `rope_scaling` for `rope_type: llama3`.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    #[serde(default)]
    pub rope_type: Option<String>,
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    pub factor: f32,
    #[serde(default)]
    pub low_freq_factor: Option<f32>,
    #[serde(default)]
    pub high_freq_factor: Option<f32>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<f32>,
}

/// The keys of a Llama `config.json` that shape the computation.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
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
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// mlx-lm's default for llama is a tied head.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub quantization: Option<QuantConfig>,
}

impl LlamaConfig {
    fn kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> i32 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
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
    fn new(config: &LlamaConfig, config_path: &Path) -> Result<Self, LoadError> {
        let dims = config.head_dim();
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
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

struct Layer {
    input_layernorm: Array,
    self_attn: Attention,
    post_attention_layernorm: Array,
    mlp: Mlp,
}

/// A loaded Llama model. The KV cache lives outside, one `KvCache` per layer.
pub struct Llama {
    embed_tokens: Linear,
    layers: Vec<Layer>,
    norm: Array,
    /// `None` when the head is tied to the embedding.
    lm_head: Option<Linear>,
    rope: Rope,
    eps: f32,
}

impl Llama {
    /// Builds the model from a config and takes exactly its tensors from
    /// `weights` (anything left over is an error).
    pub fn load(
        config: &LlamaConfig,
        config_path: &Path,
        mut weights: WeightMap,
    ) -> Result<Self, LoadError> {
        if let Some(q) = &config.quantization {
            q.validate(config_path)?;
        }
        let quant = config.quantization;
        let hidden = config.hidden_size;
        let (heads, kv_heads, head_dim) = (
            config.num_attention_heads,
            config.kv_heads(),
            config.head_dim(),
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
            let attn_bias = config.attention_bias;
            let mlp_bias = config.mlp_bias;
            layers.push(Layer {
                input_layernorm: w.take_float(&format!("{p}.input_layernorm.weight"), &[hidden])?,
                self_attn: Attention {
                    q_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.q_proj"),
                        heads * head_dim,
                        hidden,
                        quant,
                        attn_bias,
                    )?,
                    k_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.k_proj"),
                        kv_heads * head_dim,
                        hidden,
                        quant,
                        attn_bias,
                    )?,
                    v_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.v_proj"),
                        kv_heads * head_dim,
                        hidden,
                        quant,
                        attn_bias,
                    )?,
                    o_proj: Linear::load(
                        w,
                        &format!("{p}.self_attn.o_proj"),
                        hidden,
                        heads * head_dim,
                        quant,
                        attn_bias,
                    )?,
                    heads,
                    kv_heads,
                    head_dim,
                    scale: (head_dim as f32).powf(-0.5),
                },
                post_attention_layernorm: w
                    .take_float(&format!("{p}.post_attention_layernorm.weight"), &[hidden])?,
                mlp: Mlp {
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
                },
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
        weights.finish("llama")?;
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope: Rope::new(config, config_path)?,
            eps: config.rms_norm_eps,
        })
    }

    /// One cache per layer, empty.
    pub fn make_cache(&self) -> Vec<KvCache> {
        self.layers.iter().map(|_| KvCache::default()).collect()
    }

    /// Every weight array, to evaluate (make resident) after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed_tokens.arrays();
        for layer in &self.layers {
            out.push(&layer.input_layernorm);
            out.push(&layer.post_attention_layernorm);
            for linear in [
                &layer.self_attn.q_proj,
                &layer.self_attn.k_proj,
                &layer.self_attn.v_proj,
                &layer.self_attn.o_proj,
                &layer.mlp.gate_proj,
                &layer.mlp.up_proj,
                &layer.mlp.down_proj,
            ] {
                out.extend(linear.arrays());
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
    pub fn hidden(&self, tokens: &Array, cache: &mut [KvCache]) -> Result<Array, Exception> {
        let mut h = self.embed_tokens.embed(tokens)?;
        for (layer, kv) in self.layers.iter().zip(cache.iter_mut()) {
            let normed = fast::rms_norm(&h, Some(&layer.input_layernorm), self.eps)?;
            let attn = layer.self_attn.forward(&normed, kv, &self.rope)?;
            h = ops::add(&h, &attn)?;
            let normed = fast::rms_norm(&h, Some(&layer.post_attention_layernorm), self.eps)?;
            let mlp = layer.mlp.forward(&normed)?;
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
    fn forward(&self, x: &Array, kv: &mut KvCache, rope: &Rope) -> Result<Array, Exception> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let split = |y: Array, heads: i32| -> Result<Array, Exception> {
            y.reshape(&[b, l, heads, self.head_dim])?
                .transpose_axes(&[0, 2, 1, 3])
        };
        let q = split(self.q_proj.forward(x)?, self.heads)?;
        let k = split(self.k_proj.forward(x)?, self.kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.kv_heads)?;
        let q = rope.apply(&q, kv.offset())?;
        let k = rope.apply(&k, kv.offset())?;
        let (k, v) = kv.update_and_fetch(&k, &v)?;
        // Causal masking only matters when several query positions attend at
        // once (prefill); MLX aligns the mask to the end of the keys.
        let mask = (l > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let o = fast::scaled_dot_product_attention(&q, &k, &v, self.scale, mask, None)?;
        let o = o
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[b, l, self.heads * self.head_dim])?;
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
