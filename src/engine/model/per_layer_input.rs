//! Gemma 4's per-layer inputs. Beside the token embedding, a second one
//! (`embed_tokens_per_layer`) gives each token `width` values for every
//! layer; they are mixed with a projection of the scaled embedding
//! (`per_layer_model_projection`, RMS-normed per layer). Each layer, after
//! its feed-forward, gates its slice by its own output
//! (`per_layer_input_gate` through the tanh GELU), projects the product back
//! to the hidden size (`per_layer_projection`), norms it and adds it to the
//! residual stream. The operations and their order are mlx-lm's
//! `gemma4_text`, so both compute the same floats.

use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype, fast, ops};

use super::decoder::norm_scale;
use super::{Linear, QuantConfig, activation};
use crate::engine::LoadError;
use crate::engine::weights::WeightMap;
use crate::family::{ModelConfig, PerLayerInputConfig};

/// A constant factor, made once in the model's float dtype: mlx-lm's
/// Python floats take the dtype of the array they multiply.
struct Factor {
    value: f32,
    made: Array,
}

impl Factor {
    fn new(value: f64, dtype: Dtype) -> Result<Self, Exception> {
        let value = value as f32;
        let made = Array::from_f32(value).as_dtype(dtype)?;
        made.eval()?;
        Ok(Self { value, made })
    }

    /// `x` times the factor, in x's dtype.
    fn times(&self, x: &Array) -> Result<Array, Exception> {
        if x.dtype() == self.made.dtype() {
            return ops::multiply(x, &self.made);
        }
        ops::multiply(x, Array::from_f32(self.value).as_dtype(x.dtype())?)
    }
}

/// The model's part: the second embedding, and its mix with the first.
pub struct PerLayerInputs {
    /// `[vocab, layers * width]`.
    embed: Linear,
    /// `[layers * width, hidden]`, of the scaled embedding.
    projection: Linear,
    /// `[width]`: the projection's norm, per layer.
    norm: Array,
    layers: i32,
    width: i32,
    eps: f32,
    /// The second embedding times `sqrt(width)`.
    embed_scale: Factor,
    /// The projection times `hidden^-0.5`.
    projection_scale: Factor,
    /// Their sum times `2^-0.5`.
    mix_scale: Factor,
}

impl PerLayerInputs {
    /// Loads `embed_tokens_per_layer`, `per_layer_model_projection` and
    /// `per_layer_projection_norm` under the model's prefix.
    pub fn load(
        w: &mut WeightMap,
        config: &ModelConfig,
        per_layer: &PerLayerInputConfig,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let root = &config.weight_prefix;
        let layers = i32::try_from(config.num_hidden_layers).unwrap_or(i32::MAX);
        let width = per_layer.width;
        let all = layers.saturating_mul(width);
        let hidden = config.hidden_size;
        let embed = Linear::load(
            w,
            &format!("{root}.embed_tokens_per_layer"),
            per_layer.vocab_size,
            all,
            quant,
            false,
        )?;
        let projection = Linear::load(
            w,
            &format!("{root}.per_layer_model_projection"),
            all,
            hidden,
            quant,
            false,
        )?;
        let norm = norm_scale(
            w.take_float(
                &format!("{root}.per_layer_projection_norm.weight"),
                &[width],
            )?,
            config.norms_add_one,
        )?;
        let dtype = norm.dtype();
        Ok(Self {
            embed,
            projection,
            norm,
            layers,
            width,
            eps: config.rms_norm_eps,
            embed_scale: Factor::new(f64::from(width).sqrt(), dtype)?,
            projection_scale: Factor::new(f64::from(hidden).powf(-0.5), dtype)?,
            mix_scale: Factor::new(0.5f64.sqrt(), dtype)?,
        })
    }

    /// Every layer's input for `tokens` `[B, L]`, `[B, L, layers, width]`,
    /// from the tokens and their scaled embeddings `embedded`.
    pub fn inputs(&self, tokens: &Array, embedded: &Array) -> Result<Array, Exception> {
        let shape = tokens.shape();
        let per_layer_shape = [shape[0], shape[1], self.layers, self.width];
        let own = self
            .embed_scale
            .times(&self.embed.embed(tokens)?)?
            .reshape(&per_layer_shape)?;
        let projected = self
            .projection_scale
            .times(&self.projection.forward(embedded)?)?
            .reshape(&per_layer_shape)?;
        let projected = fast::rms_norm(&projected, Some(&self.norm), self.eps)?;
        self.mix_scale.times(&ops::add(&projected, &own)?)
    }

    /// Parameters: both matrices and the norm.
    pub fn parameters(&self) -> u64 {
        self.embed.parameters() + self.projection.parameters() + self.norm.size() as u64
    }

    /// Every array, for evaluation after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.embed.arrays();
        out.extend(self.projection.arrays());
        out.push(&self.norm);
        out
    }
}

/// One layer's part: its gate on its slice of the inputs.
pub struct PerLayerGate {
    /// `[width, hidden]`: the gate, from the layer's output.
    gate: Linear,
    /// `[hidden, width]`: the gated input back to the hidden size.
    projection: Linear,
    /// `[hidden]`: the projection's norm.
    norm: Array,
}

impl PerLayerGate {
    /// Loads `{p}.per_layer_input_gate`, `{p}.per_layer_projection` and
    /// `{p}.post_per_layer_input_norm`.
    pub fn load(
        w: &mut WeightMap,
        p: &str,
        config: &ModelConfig,
        per_layer: &PerLayerInputConfig,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let (hidden, width) = (config.hidden_size, per_layer.width);
        Ok(Self {
            gate: Linear::load(
                w,
                &format!("{p}.per_layer_input_gate"),
                width,
                hidden,
                quant,
                false,
            )?,
            projection: Linear::load(
                w,
                &format!("{p}.per_layer_projection"),
                hidden,
                width,
                quant,
                false,
            )?,
            norm: norm_scale(
                w.take_float(&format!("{p}.post_per_layer_input_norm.weight"), &[hidden])?,
                config.norms_add_one,
            )?,
        })
    }

    /// `h` plus its gated input: `h + norm(projection(gelu(gate(h)) *
    /// input))`.
    pub fn apply(&self, h: &Array, input: &Array, eps: f32) -> Result<Array, Exception> {
        let gate = activation::gelu_approx(&self.gate.forward(h)?)?;
        let gated = self.projection.forward(&ops::multiply(&gate, input)?)?;
        ops::add(h, &fast::rms_norm(&gated, Some(&self.norm), eps)?)
    }

    /// The matrices a one-position step multiplies by.
    pub fn decode_layers(&self) -> Vec<&Linear> {
        vec![&self.gate, &self.projection]
    }

    /// Parameters: both matrices and the norm.
    pub fn parameters(&self) -> u64 {
        self.gate.parameters() + self.projection.parameters() + self.norm.size() as u64
    }

    /// Every array, for evaluation after loading.
    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.gate.arrays();
        out.extend(self.projection.arrays());
        out.push(&self.norm);
        out
    }
}
