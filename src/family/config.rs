//! A family's config.json settled into what shapes the computation: the
//! keys every decoder shares (`ConfigKeys`, read with their names in every
//! error), and `ModelConfig`, where what differs between families is a
//! field each family's `settle` fills in.

use serde::Deserialize;
use serde_json::Value;

use super::quant::{QuantConfig, QuantError};

/// Why a config.json does not describe a model Ondo can build. Names the
/// key, since that is what a user can look for in the file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("`{key}` is missing")]
    Missing { key: String },
    #[error("`{key}` is {found}, {expected}")]
    Invalid {
        key: String,
        found: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Inconsistent(String),
    #[error("model_type `{model_type}` is not supported yet; Ondo runs: {supported}")]
    UnsupportedModelType {
        model_type: String,
        supported: String,
    },
    #[error(
        "quantization {detail} is not supported; Ondo reads affine 4- and 8-bit with group size 32, 64 or 128, and mxfp4"
    )]
    UnsupportedQuantization { detail: String },
}

impl From<QuantError> for ConfigError {
    fn from(error: QuantError) -> Self {
        match error {
            QuantError::Unsupported { detail } => ConfigError::UnsupportedQuantization { detail },
            QuantError::Invalid(message) => ConfigError::Invalid {
                key: "quantization".into(),
                found: message,
                expected: "an MLX quantization block",
            },
        }
    }
}

/// Reads typed keys of one config object, naming the key in every error.
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    value: &'a Value,
}

impl<'a> Keys<'a> {
    pub fn of(value: &'a Value) -> Self {
        Self { value }
    }

    /// The key's value, `None` when absent or null (configs write `null`
    /// for "the default").
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    fn invalid(&self, key: &str, expected: &'static str) -> ConfigError {
        ConfigError::Invalid {
            key: key.to_owned(),
            found: self.get(key).map(Value::to_string).unwrap_or_default(),
            expected,
        }
    }

    /// A number, when present.
    pub fn number(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "not a number")),
        }
    }

    /// A whole number of at least one, when present.
    pub fn count(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| self.invalid(key, "not a positive whole number")),
        }
    }

    /// A whole number that may be zero, when present.
    pub fn whole(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "not a whole number")),
        }
    }

    /// A true/false key, when present.
    pub fn flag(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.invalid(key, "not true or false")),
        }
    }

    /// A required positive whole number.
    pub fn required_count(&self, key: &str) -> Result<u64, ConfigError> {
        self.count(key)?.ok_or_else(|| missing(key))
    }

    /// A required whole number (zero allowed) as a tensor dimension.
    pub fn required_dim(&self, key: &str) -> Result<i32, ConfigError> {
        let value = self.whole(key)?.ok_or_else(|| missing(key))?;
        shape(self, key, value)
    }

    /// A required number.
    pub fn required_number(&self, key: &str) -> Result<f64, ConfigError> {
        self.number(key)?.ok_or_else(|| missing(key))
    }

    /// A list of whole numbers (`mlp_only_layers`), empty when absent.
    pub fn whole_list(&self, key: &str) -> Result<Vec<usize>, ConfigError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_u64().map(|n| n as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.invalid(key, "not a list of whole numbers")),
            Some(_) => Err(self.invalid(key, "not a list of whole numbers")),
        }
    }

    /// Deserializes a key into a typed value, when present.
    pub fn parsed<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone())
                .map(Some)
                .map_err(|_| self.invalid(key, expected)),
        }
    }
}

/// A required key that is absent.
pub fn missing(key: &str) -> ConfigError {
    ConfigError::Missing {
        key: key.to_owned(),
    }
}

/// `rope_scaling` of config.json.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// longrope (`su`): per-frequency factors; mlx-lm applies the long ones
    /// at every length, and so does Ondo.
    #[serde(default)]
    pub long_factor: Option<Vec<f32>>,
    #[serde(default)]
    pub short_factor: Option<Vec<f32>>,
    /// yarn's correction range and attention scale.
    #[serde(default)]
    pub beta_fast: Option<f32>,
    #[serde(default)]
    pub beta_slow: Option<f32>,
    #[serde(default)]
    pub mscale: Option<f32>,
    #[serde(default)]
    pub mscale_all_dim: Option<f32>,
    /// proportional (Gemma 4): the share of each head's frequencies that
    /// turn; the rest stay still.
    #[serde(default)]
    pub partial_rotary_factor: Option<f32>,
}

impl RopeScaling {
    /// The scaling's type: `rope_type`, or the older `type`.
    pub fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.legacy_type.as_deref())
    }
}

fn one() -> f32 {
    1.0
}

/// The config.json keys the decoders share. Keys whose default differs
/// between families are optional here and settled by each family.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigKeys {
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub head_dim: Option<i32>,
    pub vocab_size: i32,
    pub rms_norm_eps: f32,
    pub rope_theta: Option<f32>,
    pub rope_traditional: bool,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub max_position_embeddings: Option<usize>,
    pub quantization: Option<QuantConfig>,
}

/// A count as the engine's `i32` shapes hold it.
fn shape(keys: &Keys, key: &str, value: u64) -> Result<i32, ConfigError> {
    i32::try_from(value).map_err(|_| keys.invalid(key, "too large for a tensor dimension"))
}

impl ConfigKeys {
    /// Reads the shared keys; a missing or mistyped one is named.
    pub fn parse(value: &Value) -> Result<Self, ConfigError> {
        let keys = Keys::of(value);
        let dim = |key: &str| -> Result<i32, ConfigError> {
            shape(&keys, key, keys.required_count(key)?)
        };
        let optional_dim = |key: &str| -> Result<Option<i32>, ConfigError> {
            keys.count(key)?.map(|n| shape(&keys, key, n)).transpose()
        };
        let mut rope_theta = keys.number("rope_theta")?.map(|v| v as f32);
        let mut rope_scaling: Option<RopeScaling> =
            keys.parsed("rope_scaling", "not a rope scaling object")?;
        // transformers 5 nests `rope_theta` and the scaling here.
        if let Some(params) = keys.get("rope_parameters") {
            if rope_theta.is_none() {
                rope_theta = params["rope_theta"].as_f64().map(|v| v as f32);
            }
            if rope_scaling.is_none() && params.get("rope_type").is_some() {
                rope_scaling = serde_json::from_value(params.clone()).ok();
            }
        }
        let quantization = match keys.get("quantization") {
            Some(block) => Some(QuantConfig::from_value(block)?),
            None => None,
        };
        Ok(Self {
            hidden_size: dim("hidden_size")?,
            intermediate_size: dim("intermediate_size")?,
            num_hidden_layers: keys.required_count("num_hidden_layers")? as usize,
            num_attention_heads: dim("num_attention_heads")?,
            num_key_value_heads: optional_dim("num_key_value_heads")?,
            head_dim: optional_dim("head_dim")?,
            vocab_size: dim("vocab_size")?,
            rms_norm_eps: keys.required_number("rms_norm_eps")? as f32,
            rope_theta,
            rope_traditional: keys.flag("rope_traditional")?.unwrap_or(false),
            rope_scaling,
            tie_word_embeddings: keys.flag("tie_word_embeddings")?,
            attention_bias: keys.flag("attention_bias")?,
            mlp_bias: keys.flag("mlp_bias")?,
            max_position_embeddings: keys.count("max_position_embeddings")?.map(|n| n as usize),
            quantization,
        })
    }

    /// `tie_word_embeddings`, for a family that has no default for it
    /// (mlx-lm's Qwen3 families require it).
    pub fn require_tie_word_embeddings(&self) -> Result<bool, ConfigError> {
        self.tie_word_embeddings
            .ok_or_else(|| missing("tie_word_embeddings"))
    }

    /// `rope_theta`, for a family that has no default for it.
    pub fn require_rope_theta(&self) -> Result<f32, ConfigError> {
        self.rope_theta.ok_or_else(|| missing("rope_theta"))
    }
}

/// Everything that shapes a decoder's computation, settled from config.json
/// by its family.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
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
    /// The head is the embedding's matrix, not a tensor of its own.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// RMSNorm of each head's queries and keys before rope (qwen3).
    pub qk_norm: bool,
    pub quantization: Option<QuantConfig>,
    /// The longest context the model was trained for: prompts beyond it are
    /// refused, and the fit estimate caps the context there.
    pub max_position_embeddings: Option<usize>,
    /// Where the text model's tensors are: `model`, or
    /// `language_model.model` inside a multimodal checkpoint (gemma3).
    pub weight_prefix: String,
    /// The untied head's tensor prefix (`lm_head`).
    pub head_prefix: String,
    /// Tensors of other parts of the checkpoint that are not read (a vision
    /// tower): every tensor whose name starts with one is dropped.
    pub skipped_prefixes: Vec<String>,
    /// q, k and v in one `qkv_proj`, gate and up in one `gate_up_proj` (phi3).
    pub fused_projections: bool,
    /// RMSNorm scales are stored minus one and applied as `1 + w` (gemma).
    pub norms_add_one: bool,
    /// Embeddings are multiplied by this, in the model's float dtype,
    /// before the first layer (gemma: the square root of the hidden size).
    pub embed_scale: Option<f32>,
    /// Each sublayer's output is normed too before the residual add, and the
    /// MLP has its own pre-norm (gemma's four norms per layer).
    pub sandwich_norms: bool,
    pub activation: Activation,
    /// Attention's softmax scale; `head_dim^-0.5` unless a family says
    /// otherwise (gemma's `query_pre_attn_scalar`).
    pub attention_scale: f32,
    /// Leading dimensions of each head that rope rotates (`partial_rotary_factor`).
    pub rotary_dims: i32,
    /// Per layer, the sliding window it attends over, `None` for full
    /// attention. Empty means every layer is full.
    pub layer_windows: Vec<Option<i32>>,
    /// Rope base of the sliding-window layers, when it differs (gemma's
    /// `rope_local_base_freq`; those layers take no rope scaling).
    pub local_rope_theta: Option<f32>,
    /// A learned logit per head that joins each softmax (gpt-oss's sinks).
    pub attention_sinks: bool,
    /// The head is tied to the embedding exactly when the checkpoint has no
    /// head tensor (gemma), whatever `tie_word_embeddings` says; the tensor
    /// plan expects the layout `tie_word_embeddings` names.
    pub tie_when_no_head: bool,
    /// Routed experts in place of the dense MLP, in the layers they name.
    pub experts: Option<ExpertsConfig>,
    /// Layers whose attention rotates nothing (smollm3's NoPE layers).
    pub layers_without_rope: Vec<usize>,
    /// Queries multiplied by a factor that grows with the position past
    /// the original context (ministral3's llama 4 attention scale).
    pub query_scale: Option<PositionQueryScale>,
    /// Tensor name prefixes read as another (`model.language_model.` as
    /// `language_model.model.`): the spellings of one checkpoint layout.
    pub renamed_prefixes: Vec<(String, String)>,
    /// Short-convolution layers in place of attention (LFM2), in the layers
    /// they name.
    pub short_conv: Option<ShortConvConfig>,
    /// Gated DeltaNet layers in place of attention (Qwen 3.5), in the
    /// layers they name.
    pub gated_delta: Option<GatedDeltaConfig>,
    /// `q_proj` gives each head's queries and as many gate values, and the
    /// attention's output is multiplied by their sigmoid before `o_proj`
    /// (Qwen 3.5's gated attention).
    pub attention_output_gate: bool,
    /// The checkpoint's names of a layer's modules.
    pub names: TensorNames,
    /// The full-attention layers' own heads where they differ from the
    /// others' (Gemma 4: wider heads, their own KV heads, values that are
    /// the keys); `None` where every layer's are the config's.
    pub full_attention: Option<FullAttention>,
    /// RMSNorm without a scale over each head's values before attention
    /// (Gemma 4's `v_norm`).
    pub value_norm: bool,
    /// The last this many layers compute no keys and values: each attends
    /// over those of the last earlier layer of its kind (full or sliding)
    /// and keeps no cache (Gemma 4's `num_kv_shared_layers`).
    pub kv_shared_layers: usize,
    /// Those layers' MLPs are twice `intermediate_size` wide (Gemma 4's
    /// `use_double_wide_mlp`).
    pub kv_shared_layers_double_mlp: bool,
    /// Each layer's output is multiplied by its own learned `layer_scalar`
    /// (Gemma 4).
    pub layer_scalar: bool,
    /// Logits are `tanh(x / c) * c` for this `c` (Gemma 4's
    /// `final_logit_softcapping`).
    pub final_logit_softcapping: Option<f32>,
    /// A second embedding of each token, one slice per layer, mixed with a
    /// projection of the first and added after each layer through a gated
    /// projection (Gemma 4's per-layer inputs).
    pub per_layer_input: Option<PerLayerInputConfig>,
    /// Image tokens turn by a 3-D position (time, row, column): the rotated
    /// frequencies of each axis, interleaved (Qwen3-VL's
    /// `mrope_section`). Text turns all three alike, as plain rope.
    pub mrope_section: Option<[usize; 3]>,
}

/// The full-attention layers' heads, where they differ from the sliding
/// layers' (Gemma 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FullAttention {
    pub head_dim: i32,
    pub num_key_value_heads: i32,
    /// The layer has no `v_proj`: its values are the keys as `k_proj` gives
    /// them, before the keys' norm and rope (`attention_k_eq_v`).
    pub values_are_keys: bool,
}

/// Gemma 4's per-layer inputs: `embed_tokens_per_layer` gives each token
/// `width` values per layer (from a vocabulary of `vocab_size`), which are
/// mixed with `per_layer_model_projection` of the scaled embeddings; each
/// layer gates its slice by its output and adds it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInputConfig {
    /// Values per token and layer (`hidden_size_per_layer_input`).
    pub width: i32,
    /// Rows of the per-layer embedding (`vocab_size_per_layer_input`).
    pub vocab_size: i32,
}

/// A gated short causal convolution over time that some layers have in
/// place of attention (LFM2): `in_proj` to three chunks (two gates and the
/// input), a depthwise convolution of `kernel` positions, `out_proj`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortConvConfig {
    /// Positions the convolution spans (`conv_L_cache`); its state keeps
    /// `kernel - 1` inputs.
    pub kernel: i32,
    /// Biases on both projections and the convolution (`conv_bias`).
    pub bias: bool,
    /// Per layer: whether it is a convolution layer.
    pub layers: Vec<bool>,
}

/// A gated DeltaNet layer (Qwen 3.5's and Qwen3-Next's linear attention):
/// queries and keys of `key_heads` heads and values of `value_heads`,
/// through a depthwise causal convolution of `conv_kernel` positions, then a
/// gated delta-rule recurrence whose state is a `[value_heads,
/// value_head_dim, key_head_dim]` float32 matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct GatedDeltaConfig {
    pub key_heads: i32,
    pub value_heads: i32,
    pub key_head_dim: i32,
    pub value_head_dim: i32,
    /// Positions the convolution spans; its state keeps `conv_kernel - 1`
    /// inputs.
    pub conv_kernel: i32,
    /// How the checkpoint stores the input projections.
    pub projections: DeltaProjections,
    /// Per layer: whether it is a gated DeltaNet layer.
    pub layers: Vec<bool>,
}

/// How a gated DeltaNet layer's checkpoint stores the projections of its
/// input: the same outputs, in other tensors and order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaProjections {
    /// Four tensors: `in_proj_qkv` (every query head, then every key head,
    /// then every value head), `in_proj_z`, `in_proj_b` and `in_proj_a`
    /// (Qwen 3.5).
    Apart,
    /// Two tensors whose rows are grouped by key head: `in_proj_qkvz` gives
    /// for each key head its query, its key, then the values and the
    /// output gates `z` of the value heads that share it; `in_proj_ba`
    /// likewise their `b`, then their `a` (Qwen3-Next).
    GroupedByKeyHead,
}

impl GatedDeltaConfig {
    /// Width of the queries (and of the keys).
    pub fn key_dim(&self) -> i32 {
        self.key_heads * self.key_head_dim
    }

    /// Width of the values, and of the recurrence's output.
    pub fn value_dim(&self) -> i32 {
        self.value_heads * self.value_head_dim
    }

    /// Channels the convolution mixes: queries, keys and values.
    pub fn conv_dim(&self) -> i32 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// What a family's checkpoint calls the modules of a layer and the final
/// norm (the engine and the tensor plan read the same names, so loading
/// needs no rename table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorNames {
    /// The norm before attention (or the layer's other mixer).
    pub input_norm: &'static str,
    /// The norm before the MLP.
    pub mlp_norm: &'static str,
    /// Attention's output projection.
    pub o_proj: &'static str,
    /// The per-head norms of queries and keys.
    pub q_norm: &'static str,
    pub k_norm: &'static str,
    /// The MLP's module, and its gate, up and down projections.
    pub mlp: &'static str,
    pub gate_up_down: [&'static str; 3],
    /// The norm after the last layer.
    pub final_norm: &'static str,
}

impl TensorNames {
    /// Llama's names, which most families keep.
    pub const LLAMA: TensorNames = TensorNames {
        input_norm: "input_layernorm",
        mlp_norm: "post_attention_layernorm",
        o_proj: "o_proj",
        q_norm: "q_norm",
        k_norm: "k_norm",
        mlp: "mlp",
        gate_up_down: ["gate_proj", "up_proj", "down_proj"],
        final_norm: "norm",
    };
}

/// Queries multiplied, at absolute position `p`, by
/// `1 + beta * ln(1 + floor(p / original_max_position_embeddings))`: one
/// below the original context, growing slowly past it (Llama 4's and
/// Ministral 3's `llama_4_scaling_beta`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionQueryScale {
    pub beta: f32,
    pub original_max_position_embeddings: u32,
}

/// The gate's activation in the gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// The tanh approximation of GELU (gemma's `gelu_pytorch_tanh`).
    GeluApprox,
    /// The same, with the multiply by `up` in the one compiled function
    /// (Gemma 4's `geglu`, where Gemma 3 compiles the GELU alone).
    GeluApproxFused,
}

impl ModelConfig {
    /// The shared keys with a family's choices for the rest.
    pub fn from_keys(model_type: &str, keys: ConfigKeys, rope_theta: f32, tie: bool) -> Self {
        let head_dim = keys
            .head_dim
            .unwrap_or(keys.hidden_size / keys.num_attention_heads.max(1));
        Self {
            model_type: model_type.to_owned(),
            hidden_size: keys.hidden_size,
            intermediate_size: keys.intermediate_size,
            num_hidden_layers: keys.num_hidden_layers,
            num_attention_heads: keys.num_attention_heads,
            num_key_value_heads: keys.num_key_value_heads.unwrap_or(keys.num_attention_heads),
            head_dim,
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
            weight_prefix: "model".into(),
            head_prefix: "lm_head".into(),
            skipped_prefixes: Vec::new(),
            fused_projections: false,
            norms_add_one: false,
            embed_scale: None,
            sandwich_norms: false,
            activation: Activation::Silu,
            attention_scale: (head_dim as f32).powf(-0.5),
            rotary_dims: head_dim,
            layer_windows: Vec::new(),
            local_rope_theta: None,
            attention_sinks: false,
            tie_when_no_head: false,
            experts: None,
            layers_without_rope: Vec::new(),
            query_scale: None,
            renamed_prefixes: Vec::new(),
            short_conv: None,
            gated_delta: None,
            attention_output_gate: false,
            names: TensorNames::LLAMA,
            full_attention: None,
            value_norm: false,
            kv_shared_layers: 0,
            kv_shared_layers_double_mlp: false,
            layer_scalar: false,
            final_logit_softcapping: None,
            per_layer_input: None,
            mrope_section: None,
        }
    }

    /// Whether layer `index` is a short-convolution layer (no KV cache).
    pub fn is_conv_layer(&self, index: usize) -> bool {
        self.short_conv
            .as_ref()
            .is_some_and(|conv| conv.layers.get(index).copied().unwrap_or(false))
    }

    /// Whether layer `index` is a gated DeltaNet layer (no KV cache).
    pub fn is_delta_layer(&self, index: usize) -> bool {
        self.gated_delta
            .as_ref()
            .is_some_and(|delta| delta.layers.get(index).copied().unwrap_or(false))
    }

    /// Whether layer `index` attends over a KV cache (the others keep a
    /// state of constant size).
    pub fn attends(&self, index: usize) -> bool {
        !self.is_conv_layer(index) && !self.is_delta_layer(index)
    }

    /// The layers that keep a state of constant size rather than a KV cache:
    /// how many, and the elements of each one's state held in the model's
    /// float dtype and in float32 (a recurrent matrix is float32 whatever
    /// the weights).
    pub fn state_layers(&self) -> Option<(usize, u64, u64)> {
        let layers = (0..self.num_hidden_layers)
            .filter(|&i| !self.attends(i))
            .count();
        let (elements, f32_elements) = if let Some(conv) = &self.short_conv {
            (
                (conv.kernel.max(1) - 1) as u64 * self.hidden_size.max(0) as u64,
                0,
            )
        } else {
            let delta = self.gated_delta.as_ref()?;
            let conv = (delta.conv_kernel.max(1) - 1) as u64 * delta.conv_dim().max(0) as u64;
            let matrix = delta.value_heads.max(0) as u64
                * delta.value_head_dim.max(0) as u64
                * delta.key_head_dim.max(0) as u64;
            (conv, matrix)
        };
        (layers > 0).then_some((layers, elements, f32_elements))
    }

    /// The text model of a multimodal checkpoint: its tensors under
    /// `language_model.model.` and its head `language_model.lm_head`, read
    /// also in the spelling transformers 5 saves (`model.language_model.`,
    /// `lm_head.`), and the other parts' tensors (`skipped`) dropped.
    pub fn read_inside_language_model(&mut self, skipped: &[&str]) {
        self.weight_prefix = "language_model.model".into();
        self.head_prefix = "language_model.lm_head".into();
        self.renamed_prefixes = vec![
            (
                "model.language_model.".into(),
                "language_model.model.".into(),
            ),
            ("lm_head.".into(), "language_model.lm_head.".into()),
        ];
        self.skipped_prefixes = skipped.iter().map(|p| (*p).to_owned()).collect();
    }

    /// The sliding window of layer `index`, `None` for full attention.
    pub fn window_of(&self, index: usize) -> Option<i32> {
        self.layer_windows.get(index).copied().flatten()
    }

    /// The full-attention layers' own heads, when layer `index` is one of
    /// them and the family gives them their own.
    fn own_full_attention(&self, index: usize) -> Option<&FullAttention> {
        self.full_attention
            .as_ref()
            .filter(|_| self.window_of(index).is_none())
    }

    /// Size of each of layer `index`'s heads.
    pub fn head_dim_of(&self, index: usize) -> i32 {
        self.own_full_attention(index)
            .map_or(self.head_dim, |full| full.head_dim)
    }

    /// Layer `index`'s KV heads.
    pub fn kv_heads_of(&self, index: usize) -> i32 {
        self.own_full_attention(index)
            .map_or(self.num_key_value_heads, |full| full.num_key_value_heads)
    }

    /// Whether layer `index` has no `v_proj`, its values being its keys.
    pub fn values_are_keys(&self, index: usize) -> bool {
        self.own_full_attention(index)
            .is_some_and(|full| full.values_are_keys)
    }

    /// Leading dimensions of each of layer `index`'s heads that rope
    /// rotates: a full-attention layer with its own heads gives its rope the
    /// whole head (a proportional rope leaves the rest unturned itself).
    pub fn rotary_dims_of(&self, index: usize) -> i32 {
        self.own_full_attention(index)
            .map_or(self.rotary_dims, |full| full.head_dim)
    }

    /// For a layer that reads an earlier layer's keys and values (the last
    /// `kv_shared_layers`), that layer: the last of the others of its kind.
    pub fn kv_source(&self, index: usize) -> Option<usize> {
        let first_shared = self.num_hidden_layers.checked_sub(self.kv_shared_layers)?;
        if self.kv_shared_layers == 0 || index < first_shared {
            return None;
        }
        let window = self.window_of(index);
        (0..first_shared)
            .rev()
            .find(|&i| self.attends(i) && self.window_of(i) == window)
    }

    /// Whether layer `index` is one of the last `kv_shared_layers`, which
    /// compute no keys and values of their own.
    pub fn shares_kv(&self, index: usize) -> bool {
        self.kv_shared_layers > 0
            && index >= self.num_hidden_layers.saturating_sub(self.kv_shared_layers)
    }

    /// Whether layer `index` keeps a KV cache of its own: it attends, and
    /// over keys and values it computes itself.
    pub fn keeps_kv(&self, index: usize) -> bool {
        self.attends(index) && !self.shares_kv(index)
    }

    /// Elements of layer `index`'s KV cache per position: a key and a value
    /// vector per KV head; none for a layer that keeps no KV cache.
    pub fn kv_elements_of(&self, index: usize) -> u64 {
        if !self.keeps_kv(index) {
            return 0;
        }
        2 * self.kv_heads_of(index).max(0) as u64 * self.head_dim_of(index).max(0) as u64
    }

    /// Width of layer `index`'s MLP.
    pub fn intermediate_size_of(&self, index: usize) -> i32 {
        if self.kv_shared_layers_double_mlp && self.shares_kv(index) {
            2 * self.intermediate_size
        } else {
            self.intermediate_size
        }
    }

    /// Whether layer `index` rotates its queries and keys.
    pub fn uses_rope(&self, index: usize) -> bool {
        !self.layers_without_rope.contains(&index)
    }

    /// The layers whose cache a sliding window bounds, and that window.
    pub fn sliding_layers(&self) -> Option<(usize, i32)> {
        let windows: Vec<i32> = (0..self.num_hidden_layers)
            .filter(|&i| self.keeps_kv(i))
            .filter_map(|i| self.window_of(i))
            .collect();
        let widest = windows.iter().copied().max()?;
        Some((windows.len(), widest))
    }

    /// Layers whose feed-forward is routed experts.
    pub fn expert_layers(&self) -> usize {
        self.experts.as_ref().map_or(0, |experts| {
            (0..self.num_hidden_layers)
                .filter(|&i| experts.is_sparse(i))
                .count()
        })
    }
}

/// How a family routes tokens and what its experts compute.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ExpertsKind {
    /// Qwen3-MoE: the router `gate` has no bias; a softmax over every
    /// expert, then the top k (rescaled to sum to one with
    /// `norm_topk_prob`); SwiGLU experts under `switch_mlp`, without biases.
    #[default]
    Qwen3Moe,
    /// gpt-oss: the router `router` has a bias; the top k logits, then a
    /// softmax over those k; experts under `experts` with biases, and a
    /// SwiGLU clamped at `swiglu_limit`.
    GptOss { swiglu_limit: f32 },
    /// GLM-4.5 (DeepSeek-V3's routing): the sigmoid of the router `gate`'s
    /// logits in float32, plus its learned `e_score_correction_bias`,
    /// chooses the experts: among the `chosen_groups` of `groups` groups of
    /// experts whose two best corrected scores sum highest, the top k. The
    /// uncorrected sigmoids of those weight them (rescaled to sum to one
    /// with `norm_topk_prob`), times `routed_scaling_factor`. SwiGLU experts
    /// under `switch_mlp`, without biases; the router is never quantized.
    Glm4Moe {
        groups: i32,
        chosen_groups: i32,
        routed_scaling_factor: f32,
    },
    /// Gemma 4: a block beside the dense MLP (each with its own norms, the
    /// two outputs summed). The router `router.proj` reads the layer's
    /// input RMS-normed by its own `router.scale` (times `hidden^-0.5`);
    /// the top k logits, a softmax over those k, each weight times its
    /// expert's `router.per_expert_scale`; GEGLU experts under
    /// `experts.switch_glu`, without biases.
    Gemma4,
}

impl ExpertsKind {
    /// The names of the router and of the experts' module under the
    /// block (`block_prefix`), and whether both have biases.
    pub fn tensor_names(self) -> (&'static str, &'static str, bool) {
        match self {
            ExpertsKind::Qwen3Moe | ExpertsKind::Glm4Moe { .. } => ("gate", "switch_mlp", false),
            ExpertsKind::GptOss { .. } => ("router", "experts", true),
            ExpertsKind::Gemma4 => ("router.proj", "experts.switch_glu", false),
        }
    }

    /// The shared expert's module under a layer's `mlp`, and the one-output
    /// gate whose sigmoid weights it, where it has one: Qwen's
    /// `shared_expert` and `shared_expert_gate`, GLM's ungated
    /// `shared_experts`.
    pub fn shared_expert_names(self) -> (&'static str, Option<&'static str>) {
        match self {
            ExpertsKind::Glm4Moe { .. } => ("shared_experts", None),
            _ => ("shared_expert", Some("shared_expert_gate")),
        }
    }

    /// The router's score-correction bias `[E]` under its module, where
    /// the routing has one (GLM's, kept in float32).
    pub fn score_correction(self) -> Option<&'static str> {
        matches!(self, ExpertsKind::Glm4Moe { .. }).then_some("e_score_correction_bias")
    }

    /// Whether mlx-lm quantizes the router with the other matrices (at 8
    /// bits); GLM's is no Linear layer and stays in floats.
    pub fn router_quantized(self) -> bool {
        !matches!(self, ExpertsKind::Glm4Moe { .. })
    }

    /// The module of layer `layer` (its tensor prefix) that holds the
    /// router and the experts: its `mlp`, or for Gemma 4 the layer itself.
    pub fn block_prefix(self, layer: &str) -> String {
        match self {
            ExpertsKind::Qwen3Moe | ExpertsKind::GptOss { .. } | ExpertsKind::Glm4Moe { .. } => {
                format!("{layer}.mlp")
            }
            ExpertsKind::Gemma4 => layer.to_owned(),
        }
    }

    /// Whether the experts work beside the dense MLP rather than in its
    /// place.
    pub fn beside_dense_mlp(self) -> bool {
        matches!(self, ExpertsKind::Gemma4)
    }
}

/// A family's routed experts.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertsConfig {
    /// Experts per sparse layer.
    pub num_experts: i32,
    /// Experts each token is routed to (top k).
    pub num_experts_per_tok: i32,
    /// Width of each expert's SwiGLU.
    pub moe_intermediate_size: i32,
    /// Rescale the top k scores to sum to one.
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is sparse (1: all of them).
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP whatever the step says.
    pub mlp_only_layers: Vec<usize>,
    pub kind: ExpertsKind,
    /// Width of a dense SwiGLU every token goes through beside its routed
    /// experts (`ExpertsKind::shared_expert_names`): weighted by the
    /// sigmoid of its own one-output gate in Qwen 3.5 and Qwen3-Next, added
    /// as it is in GLM-4.5; `None` without one.
    pub shared_expert_intermediate_size: Option<i32>,
}

impl ExpertsConfig {
    /// Whether layer `index` routes to experts (mlx-lm's rule) or keeps a
    /// dense MLP.
    pub fn is_sparse(&self, index: usize) -> bool {
        !self.mlp_only_layers.contains(&index)
            && self.num_experts > 0
            && self.decoder_sparse_step > 0
            && (index + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Each layer's sliding window from `layer_types` (`sliding_attention`
/// layers attend over `sliding_window` positions, `full_attention` ones
/// over everything; all full when absent), as mlx-lm's Llama-shaped models
/// read them: one type per layer, and at least one full layer.
pub fn windows_of_layer_types(
    value: &Value,
    layers: usize,
) -> Result<Vec<Option<i32>>, ConfigError> {
    let keys = Keys::of(value);
    let Some(types) = keys.get("layer_types") else {
        return Ok(Vec::new());
    };
    let invalid = || {
        keys.invalid(
            "layer_types",
            "not a list of `sliding_attention` and `full_attention`",
        )
    };
    let types = types.as_array().ok_or_else(invalid)?;
    if types.len() != layers {
        return Err(ConfigError::Inconsistent(format!(
            "`layer_types` names {} layers, `num_hidden_layers` is {layers}",
            types.len()
        )));
    }
    let window = keys.count("sliding_window")?;
    let mut windows = Vec::with_capacity(layers);
    for kind in types {
        windows.push(match kind.as_str() {
            Some("full_attention") => None,
            Some("sliding_attention") => {
                let window = window.ok_or_else(|| {
                    ConfigError::Inconsistent(
                        "`layer_types` has sliding_attention layers but `sliding_window` is not set"
                            .into(),
                    )
                })?;
                Some(
                    i32::try_from(window)
                        .map_err(|_| keys.invalid("sliding_window", "too large for a window"))?,
                )
            }
            _ => return Err(invalid()),
        });
    }
    if windows.iter().all(Option::is_some) {
        return Err(ConfigError::Inconsistent(
            "`layer_types` has no full_attention layer".into(),
        ));
    }
    Ok(windows)
}

/// `base` with `overrides`' keys laid over it (both objects; a null in
/// `overrides` keeps the base's value).
pub fn merged(base: Value, overrides: &Value) -> Value {
    let mut out = base;
    if let (Some(out_map), Some(over)) = (out.as_object_mut(), overrides.as_object()) {
        for (key, value) in over {
            if !value.is_null() {
                out_map.insert(key.clone(), value.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn llama_like() -> Value {
        json!({
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100, "rms_norm_eps": 1e-5,
        })
    }

    #[test]
    fn a_missing_or_mistyped_key_is_named() {
        let mut config = llama_like();
        config.as_object_mut().unwrap().remove("vocab_size");
        assert_eq!(
            ConfigKeys::parse(&config).unwrap_err(),
            missing("vocab_size")
        );
        let mut config = llama_like();
        config["num_hidden_layers"] = json!("two");
        let error = ConfigKeys::parse(&config).unwrap_err();
        assert_eq!(
            error.to_string(),
            "`num_hidden_layers` is \"two\", not a positive whole number"
        );
    }

    #[test]
    fn null_keys_count_as_absent_and_rope_parameters_are_read() {
        let mut config = llama_like();
        config["head_dim"] = Value::Null;
        config["rope_parameters"] =
            json!({"rope_theta": 5e5, "rope_type": "linear", "factor": 2.0});
        let keys = ConfigKeys::parse(&config).unwrap();
        assert_eq!(keys.head_dim, None);
        assert_eq!(keys.rope_theta, Some(5e5));
        assert_eq!(keys.rope_scaling.unwrap().kind(), Some("linear"));
    }

    #[test]
    fn sparse_layers_follow_the_step_and_the_dense_list() {
        let experts = ExpertsConfig {
            num_experts: 8,
            num_experts_per_tok: 2,
            moe_intermediate_size: 16,
            norm_topk_prob: true,
            decoder_sparse_step: 2,
            mlp_only_layers: vec![3],
            kind: ExpertsKind::Qwen3Moe,
            shared_expert_intermediate_size: None,
        };
        let sparse: Vec<usize> = (0..6).filter(|&i| experts.is_sparse(i)).collect();
        assert_eq!(sparse, [1, 5]);
    }
}
