//! Whether a model will fit in memory before it is loaded: the weights, the KV
//! cache at a chosen context and MLX's working room, against what the machine
//! has free, with advice a user can act on when it does not fit.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::family::{self, ConfigError, ModelConfig};
use crate::units::human_bytes;

/// Why config.json cannot be sized. Names the key, since that is what a user
/// can look for in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error(
        "the model folder's config.json has no `{key}`, so it does not describe a decoder model Ondo can size; check that the folder holds a text-generation model"
    )]
    ConfigKeyMissing { key: String },
    #[error(
        "the model folder's config.json has `{key}` = {found}, {expected}, so it does not describe a decoder model Ondo can size"
    )]
    ConfigKeyInvalid {
        key: String,
        found: String,
        expected: String,
    },
    #[error("the model folder's config.json does not describe a model Ondo can build: {message}")]
    ConfigInvalid { message: String },
}

impl From<ConfigError> for FitError {
    fn from(error: ConfigError) -> Self {
        match error {
            ConfigError::Missing { key } => FitError::ConfigKeyMissing { key },
            ConfigError::Invalid {
                key,
                found,
                expected,
            } => FitError::ConfigKeyInvalid {
                key,
                found,
                expected: expected.to_owned(),
            },
            other => FitError::ConfigInvalid {
                message: other.to_string(),
            },
        }
    }
}

/// The element type of the KV cache: the model's compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub enum KvDtype {
    #[serde(rename = "float32")]
    F32,
    #[serde(rename = "float16")]
    F16,
    #[serde(rename = "bfloat16")]
    BF16,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::BF16 => 2,
        }
    }

    /// The name config.json uses.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "float32",
            KvDtype::F16 => "float16",
            KvDtype::BF16 => "bfloat16",
        }
    }

    /// Reads a config.json name ("bfloat16", "torch.float16") or a safetensors
    /// dtype ("BF16"); `None` for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim().to_ascii_lowercase();
        match name.strip_prefix("torch.").unwrap_or(&name) {
            "float32" | "f32" | "fp32" | "float" => Some(KvDtype::F32),
            "float16" | "f16" | "fp16" | "half" => Some(KvDtype::F16),
            "bfloat16" | "bf16" => Some(KvDtype::BF16),
            _ => None,
        }
    }
}

/// What sizing needs from config.json: the KV cache's shape per token, the
/// layers a sliding window bounds, the experts, and the parameter count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ModelShape {
    pub num_hidden_layers: u64,
    /// KV heads of the layers that attend to everything (the sliding ones
    /// say their own in `sliding_window`).
    pub num_key_value_heads: u64,
    /// Elements per key (and per value) vector, in those layers.
    pub head_dim: u64,
    pub hidden_size: u64,
    /// The longest context the model was trained for, in tokens.
    pub max_position_embeddings: Option<u64>,
    pub kv_dtype: KvDtype,
    /// Layers whose KV cache keeps only the latest positions; `None` when
    /// every layer keeps the whole context.
    pub sliding_window: Option<SlidingWindowLayers>,
    /// Layers that keep a state of constant size instead of a KV cache
    /// (LFM2's short convolutions); `None` when every layer attends.
    pub state_layers: Option<StateLayers>,
    /// Layers that attend over an earlier layer's keys and values and keep
    /// no cache of their own (Gemma 4's KV-shared layers).
    pub kv_shared_layers: u64,
    /// A mixture-of-experts model's experts; `None` for a dense model.
    pub experts: Option<ExpertLayers>,
    /// Parameters counted from the shapes: for a family Ondo runs, every
    /// tensor the engine loads (`family::tensors`); for another model type,
    /// the embeddings (and the output matrix unless tied), attention and
    /// MLPs, norms and biases left out (well under 1%). `None` when such a
    /// config lacks `vocab_size` or `intermediate_size`.
    pub parameters: Option<u64>,
}

/// Sliding-window attention: `layers` of the model's layers attend to (and
/// cache) at most the latest `window_tokens` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SlidingWindowLayers {
    pub layers: u64,
    pub window_tokens: u64,
    /// KV heads and head size of these layers (Gemma 4's are narrower than
    /// its full layers'; most models' are the same).
    pub num_key_value_heads: u64,
    pub head_dim: u64,
}

/// Layers without a KV cache: each keeps `bytes_per_layer` of state (a
/// convolution's last inputs) whatever the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct StateLayers {
    pub layers: u64,
    pub bytes_per_layer: u64,
}

/// A mixture of experts: in each of `moe_layers` layers a router picks
/// `experts_per_token` of `num_experts` MLPs for every token. All of them
/// stay in memory; only the picked ones are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ExpertLayers {
    pub num_experts: u64,
    pub experts_per_token: u64,
    pub moe_layers: u64,
    /// Parameters of one expert in one layer: its gate, up and down matrices.
    pub parameters_per_expert: u64,
}

impl ModelShape {
    /// Reads a parsed config.json. `weights_float_dtype` is the dtype of the
    /// checkpoint's unquantized tensors ("BF16", "F16", "F32"; see
    /// [`safetensors_float_dtype`]), used when the config names no dtype.
    ///
    /// A family Ondo runs is sized from the config its description settles,
    /// the same one the engine builds (`crate::family`): its defaults, its
    /// sliding windows, its experts, and the tensors it has. Any other
    /// `model_type` is sized from the keys every decoder shares.
    ///
    /// A quantized MLX checkpoint's config also carries a `quantization`
    /// object; it changes the weights, not the cache, which stays in the
    /// compute dtype.
    pub fn from_config(
        config: &Value,
        weights_float_dtype: Option<&str>,
    ) -> Result<Self, FitError> {
        // transformers 5 writes `dtype`, older versions `torch_dtype`. With
        // neither, the weights' float tensors say what MLX will compute in.
        // Both 16-bit types are 2 bytes, so the fallback only matters for
        // float32 models.
        let kv_dtype = ["dtype", "torch_dtype"]
            .iter()
            .filter_map(|key| config_value(config, key)?.as_str())
            .find_map(KvDtype::parse)
            .or_else(|| weights_float_dtype.and_then(KvDtype::parse))
            .unwrap_or(KvDtype::F16);
        match family::of_config(config) {
            Ok(family) => Ok(Self::of_settled(&(family.settle)(config)?, kv_dtype)),
            Err(_) => Self::from_shared_keys(config, kv_dtype),
        }
    }

    /// The shape of a config its family settled.
    pub fn of_settled(config: &ModelConfig, kv_dtype: KvDtype) -> Self {
        let hidden_size = config.hidden_size.max(0) as u64;
        let experts = config.experts.as_ref().and_then(|experts| {
            let moe_layers = config.expert_layers() as u64;
            let num_experts = experts.num_experts.max(0) as u64;
            (moe_layers > 0 && num_experts > 0).then(|| ExpertLayers {
                num_experts,
                experts_per_token: (experts.num_experts_per_tok.max(0) as u64).min(num_experts),
                moe_layers,
                parameters_per_expert: 3
                    * hidden_size
                    * experts.moe_intermediate_size.max(0) as u64,
            })
        });
        // The heads of the first layer of each kind that keeps a KV cache.
        let first_of_kind = |sliding: bool| {
            (0..config.num_hidden_layers)
                .find(|&i| config.keeps_kv(i) && config.window_of(i).is_some() == sliding)
        };
        let heads_of = |layer: Option<usize>| {
            layer.map_or((config.num_key_value_heads, config.head_dim), |i| {
                (config.kv_heads_of(i), config.head_dim_of(i))
            })
        };
        let (full_heads, full_dim) = heads_of(first_of_kind(false));
        let (sliding_heads, sliding_dim) = heads_of(first_of_kind(true));
        ModelShape {
            num_hidden_layers: config.num_hidden_layers as u64,
            num_key_value_heads: full_heads.max(0) as u64,
            head_dim: full_dim.max(0) as u64,
            hidden_size,
            max_position_embeddings: config.max_position_embeddings.map(|n| n as u64),
            kv_dtype,
            sliding_window: config
                .sliding_layers()
                .map(|(layers, window)| SlidingWindowLayers {
                    layers: layers as u64,
                    window_tokens: window.max(0) as u64,
                    num_key_value_heads: sliding_heads.max(0) as u64,
                    head_dim: sliding_dim.max(0) as u64,
                }),
            kv_shared_layers: (0..config.num_hidden_layers)
                .filter(|&i| config.attends(i) && config.shares_kv(i))
                .count() as u64,
            state_layers: config
                .state_layers()
                .map(|(layers, elements, f32_elements)| StateLayers {
                    layers: layers as u64,
                    bytes_per_layer: elements * kv_dtype.bytes() + f32_elements * 4,
                }),
            experts,
            parameters: Some(family::tensors::parameters(config)),
        }
    }

    /// A `model_type` Ondo does not run: the keys every decoder shares,
    /// without any family's defaults; no sliding windows or experts.
    fn from_shared_keys(config: &Value, kv_dtype: KvDtype) -> Result<Self, FitError> {
        let read = |key: &'static str| positive(config, key);
        let num_hidden_layers =
            read("num_hidden_layers")?.ok_or_else(|| missing("num_hidden_layers"))?;
        let hidden_size = read("hidden_size")?.ok_or_else(|| missing("hidden_size"))?;
        let attention_heads = read("num_attention_heads")?;
        let attention_heads = || attention_heads.ok_or_else(|| missing("num_attention_heads"));
        // Without grouped-query attention every query head has its own K and V.
        let num_key_value_heads = match read("num_key_value_heads")? {
            Some(heads) => heads,
            None => attention_heads()?,
        };
        let head_dim = match read("head_dim")? {
            Some(dim) => dim,
            None => hidden_size / attention_heads()?,
        };
        let parameters = match (
            read("vocab_size")?,
            attention_heads().ok(),
            read("intermediate_size")?,
        ) {
            (Some(vocab_size), Some(heads), Some(intermediate_size)) => {
                let tied = config_value(config, "tie_word_embeddings")
                    .and_then(Value::as_bool)
                    // transformers' default, which the configs rely on.
                    .unwrap_or(true);
                let embeddings = vocab_size.saturating_mul(hidden_size);
                let output = if tied { 0 } else { embeddings };
                // q and o: heads * head_dim by hidden; k and v: kv heads * head_dim.
                let attention = 2 * hidden_size * head_dim * (heads + num_key_value_heads);
                let mlp = 3 * hidden_size * intermediate_size;
                Some(
                    embeddings
                        .saturating_add(output)
                        .saturating_add(num_hidden_layers.saturating_mul(attention + mlp)),
                )
            }
            _ => None,
        };
        Ok(ModelShape {
            num_hidden_layers,
            num_key_value_heads,
            head_dim,
            hidden_size,
            max_position_embeddings: read("max_position_embeddings")?,
            kv_dtype,
            sliding_window: None,
            state_layers: None,
            kv_shared_layers: 0,
            experts: None,
            parameters,
        })
    }

    /// Bytes of KV cache one full-attention layer holds per position: a
    /// key and a value vector per KV head.
    pub fn kv_bytes_per_layer_position(&self) -> u64 {
        self.kv_bytes_per_position(self.num_key_value_heads, self.head_dim)
    }

    fn kv_bytes_per_position(&self, heads: u64, head_dim: u64) -> u64 {
        // Saturating: the factors come from a file.
        heads
            .saturating_mul(head_dim)
            .saturating_mul(2 * self.kv_dtype.bytes())
    }

    /// Layers with a KV cache of their own (the others keep a constant
    /// state, or read an earlier layer's cache).
    fn kv_layers(&self) -> u64 {
        let state = self.state_layers.map_or(0, |s| s.layers);
        self.num_hidden_layers
            .saturating_sub(state)
            .saturating_sub(self.kv_shared_layers)
    }

    /// The sliding-window layers with a KV cache, their window, and the
    /// bytes each caches per position; none without a window.
    fn sliding(&self) -> (u64, u64, u64) {
        self.sliding_window.map_or((0, 0, 0), |s| {
            (
                s.layers.min(self.kv_layers()),
                s.window_tokens,
                self.kv_bytes_per_position(s.num_key_value_heads, s.head_dim),
            )
        })
    }

    /// Bytes of KV cache per token of context while every layer still keeps
    /// every position (below any sliding window).
    pub fn kv_bytes_per_token(&self) -> u64 {
        let (sliding_layers, _, sliding_bytes) = self.sliding();
        (self.kv_layers() - sliding_layers)
            .saturating_mul(self.kv_bytes_per_layer_position())
            .saturating_add(sliding_layers.saturating_mul(sliding_bytes))
    }

    /// Bytes of cache when it holds `positions`: full-attention layers keep
    /// them all, sliding-window layers at most their window, state layers
    /// their constant state.
    pub fn kv_cache_bytes(&self, positions: u64) -> u64 {
        self.kv_cache_bytes_held_in(positions, None)
    }

    /// `kv_cache_bytes`, with the full-attention layers held in `kv_bits`
    /// once the cache has its start's positions (the whole cache is
    /// quantized then; sliding-window layers stay in floats).
    pub fn kv_cache_bytes_held_in(&self, positions: u64, kv_bits: Option<KvCacheBits>) -> u64 {
        let (sliding_layers, window, sliding_bytes) = self.sliding();
        let full_layers = self.kv_layers() - sliding_layers;
        let per_position = match kv_bits {
            Some(q) if positions > 0 && positions >= q.start => {
                let elements = self.num_key_value_heads.saturating_mul(self.head_dim) * 2;
                q.bytes_for(elements, self.kv_dtype.bytes())
            }
            _ => self.kv_bytes_per_layer_position(),
        };
        let full = full_layers
            .saturating_mul(positions)
            .saturating_mul(per_position);
        let sliding = sliding_layers
            .saturating_mul(positions.min(window))
            .saturating_mul(sliding_bytes);
        let state = self
            .state_layers
            .map_or(0, |s| s.layers.saturating_mul(s.bytes_per_layer));
        full.saturating_add(sliding).saturating_add(state)
    }

    /// For a mixture of experts, the parameters one token works through:
    /// everything but the experts the router did not pick.
    pub fn active_parameters(&self) -> Option<u64> {
        let experts = self.experts?;
        let idle = (experts.num_experts - experts.experts_per_token)
            .saturating_mul(experts.parameters_per_expert)
            .saturating_mul(experts.moe_layers);
        Some(self.parameters?.saturating_sub(idle))
    }

    /// "22 of 26 layers keep at most 512 positions", "10 of 16 layers keep
    /// a state of 8 KiB whatever the context", "20 of 35 layers read an
    /// earlier layer's cache": what bounds the cache.
    pub fn kv_cache_note(&self) -> Option<String> {
        let sliding = self.sliding_window.filter(|s| s.layers > 0).map(|sliding| {
            format!(
                "{} of {} layers keep at most {} positions",
                sliding.layers.min(self.num_hidden_layers),
                self.num_hidden_layers,
                sliding.window_tokens
            )
        });
        let state = self.state_layers.filter(|s| s.layers > 0).map(|state| {
            format!(
                "{} of {} layers keep a state of {} whatever the context",
                state.layers.min(self.num_hidden_layers),
                self.num_hidden_layers,
                binary_size(state.bytes_per_layer)
            )
        });
        let shared = (self.kv_shared_layers > 0).then(|| {
            format!(
                "{} of {} layers read an earlier layer's cache",
                self.kv_shared_layers.min(self.num_hidden_layers),
                self.num_hidden_layers
            )
        });
        let notes: Vec<String> = [sliding, state, shared].into_iter().flatten().collect();
        (!notes.is_empty()).then(|| notes.join("; "))
    }

    /// "all 128 experts stay in memory; 8 of them work on each token".
    pub fn experts_note(&self) -> Option<String> {
        let experts = self.experts?;
        Some(format!(
            "all {} experts stay in memory; {} of them work on each token",
            experts.num_experts, experts.experts_per_token
        ))
    }
}

/// Bytes in the largest binary unit that keeps a whole number ("8 KiB").
fn binary_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && value >= 1024 && value.is_multiple_of(1024) {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

fn missing(key: &str) -> FitError {
    FitError::ConfigKeyMissing {
        key: key.to_owned(),
    }
}

/// A key of the language model's config. Multimodal configs keep it under
/// `text_config`, which then describes the decoder better than the top level.
fn config_value<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    let present = |v: &&Value| !v.is_null();
    config
        .get("text_config")
        .and_then(|text| text.get(key))
        .filter(present)
        .or_else(|| config.get(key).filter(present))
}

fn positive(config: &Value, key: &'static str) -> Result<Option<u64>, FitError> {
    let Some(value) = config_value(config, key) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(n) if n > 0 => Ok(Some(n)),
        _ => Err(FitError::ConfigKeyInvalid {
            key: key.to_owned(),
            found: value.to_string(),
            expected: "not a positive whole number".to_owned(),
        }),
    }
}

/// The safetensors format caps its JSON header at 100 MB; a larger length
/// means the file is not safetensors or is damaged.
const MAX_SAFETENSORS_HEADER_BYTES: u64 = 100_000_000;

/// Reads the JSON header of a safetensors file: an 8-byte little-endian
/// length, then that many bytes of JSON. Reads nothing of the tensor data.
pub fn read_safetensors_header(path: &Path) -> io::Result<Vec<u8>> {
    let incomplete = |error: io::Error| {
        if error.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} ends inside its safetensors header; the download is incomplete (download it again)",
                    path.display()
                ),
            )
        } else {
            error
        }
    };
    let mut file = File::open(path)?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length).map_err(incomplete)?;
    let length = u64::from_le_bytes(length);
    if length > MAX_SAFETENSORS_HEADER_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} claims a safetensors header of {length} bytes, over the format's 100 MB limit; the file is damaged or not safetensors (download it again)",
                path.display()
            ),
        ));
    }
    let mut header = Vec::new();
    file.take(length).read_to_end(&mut header)?;
    if (header.len() as u64) < length {
        return Err(incomplete(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(header)
}

/// The float dtype of a checkpoint's unquantized tensors ("BF16", "F16" or
/// "F32"), from a safetensors JSON header: the most common of the three,
/// ties going to BF16, then F16. Quantization scales and biases are left out
/// because a conversion may store them in another type than the compute one.
/// `None` when the header is not JSON or has no such tensor.
pub fn safetensors_float_dtype(header_json: &[u8]) -> Option<String> {
    let header: serde_json::Map<String, Value> = serde_json::from_slice(header_json).ok()?;
    let mut counts = [("BF16", 0usize), ("F16", 0), ("F32", 0)];
    for (name, tensor) in &header {
        if name == "__metadata__" || name.ends_with(".scales") || name.ends_with(".biases") {
            continue;
        }
        let Some(dtype) = tensor.get("dtype").and_then(Value::as_str) else {
            continue;
        };
        if let Some((_, count)) = counts.iter_mut().find(|(known, _)| *known == dtype) {
            *count += 1;
        }
    }
    // max_by_key keeps the last of equals; reversed, that is the first listed.
    counts
        .iter()
        .rev()
        .filter(|(_, count)| *count > 0)
        .max_by_key(|(_, count)| *count)
        .map(|(dtype, _)| dtype.to_string())
}

/// A KV cache held in fewer bits once it has `start` positions: the
/// engine's `kv_bits`, `kv_group_size` and `quantized_kv_start` (repeated
/// here: the hub does not depend on the engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheBits {
    /// Bits per element: 4 or 8.
    pub bits: u64,
    /// Elements sharing a scale and a bias (each in the float dtype).
    pub group_size: u64,
    pub start: u64,
}

impl KvCacheBits {
    /// Bytes `elements` float elements of `float_bytes` take quantized:
    /// `bits / 8` each, and a scale and a bias per group.
    pub fn bytes_for(&self, elements: u64, float_bytes: u64) -> u64 {
        let groups = elements / self.group_size.max(1);
        elements
            .saturating_mul(self.bits)
            .div_ceil(8)
            .saturating_add(groups.saturating_mul(2 * float_bytes))
    }
}

/// What is known before loading: the model, the context wanted and the
/// machine's memory, all in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitInput {
    /// Size of the weight files.
    pub weights_bytes: u64,
    pub shape: ModelShape,
    /// Context the user wants to run with, prompt and reply together.
    pub context_tokens: u64,
    /// Memory free for a new process now.
    pub available_bytes: u64,
    /// Physical memory of the machine.
    pub total_bytes: u64,
    /// macOS: MLX's recommended GPU working set; None elsewhere.
    pub working_set_bytes: Option<u64>,
    /// The KV cache held in fewer bits, when the settings ask for it.
    pub kv_bits: Option<KvCacheBits>,
}

/// Will it fit: the parts of the estimate, the verdict and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct FitEstimate {
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    /// Activations and MLX's working buffers (see [`estimate_fit`]).
    pub overhead_bytes: u64,
    /// Weights, KV cache and overhead together.
    pub needed_bytes: u64,
    pub available_bytes: u64,
    pub working_set_bytes: Option<u64>,
    /// What the model may use: the available memory, or MLX's working set
    /// where that is smaller.
    pub budget_bytes: u64,
    pub context_tokens: u64,
    /// KV cache bytes per token while every layer keeps every position.
    pub kv_bytes_per_token: u64,
    /// What bounds the KV cache, when sliding windows do: "22 of 26 layers
    /// keep at most 512 positions".
    pub kv_cache_note: Option<String>,
    /// Parameters counted from the config's shapes (see
    /// [`ModelShape::parameters`]); `None` when it does not say enough.
    pub parameters: Option<u64>,
    /// A mixture of experts' parameters that work on each token (the
    /// experts picked, not all of them); `None` for a dense model, where
    /// every parameter does. Memory holds all of them either way.
    pub active_parameters: Option<u64>,
    /// For a mixture of experts: "all 128 experts stay in memory; 8 of them
    /// work on each token".
    pub experts_note: Option<String>,
    pub verdict: Verdict,
    /// The longest context whose estimate is within the budget, capped at
    /// the model's trained context; `None` when not even the weights and the
    /// overhead are.
    pub max_context_that_fits: Option<u64>,
    /// Sentences a user can act on; empty when it fits.
    pub advice: Vec<String>,
}

/// How the estimate compares with the budget, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Needs at most 80% of the budget.
    Fits,
    /// Within the budget but over 80% of it: runs, with little to spare.
    Tight,
    /// Over the budget.
    WillNotFit,
}

// Project decision: what loading needs besides the weights and the KV cache.
//
// - A floor of 256 MiB or 10% of the weights, whichever is larger: MLX's
//   buffers for dequantized matmul tiles, the logits, the tokenizer and the
//   process itself; they grow with the model.
// - One prefill step's activations: the engine runs the prompt in steps of
//   DEFAULT_PREFILL_STEP_SIZE tokens and each step holds several
//   [tokens, hidden_size] tensors at once (residual stream, normed input, Q/K/V,
//   attention output, and the MLP's gate and up projections at 3-4x hidden
//   size). Eight float32 copies cover these with some room; attention scores
//   are not counted because MLX's fused attention does not materialise them.
//
// Verdict: Fits up to 80% of the budget. The fifth left over absorbs what the
// estimate misses (MLX's cache of freed buffers, other apps growing, macOS
// compressing before free memory reaches zero). Over 80% but within the budget
// is Tight: it runs but may swap, and loading is still allowed. Over the
// budget is WillNotFit.
const OVERHEAD_FLOOR_BYTES: u64 = 256 << 20;
const ACTIVATION_BYTES: u64 = 4;
const ACTIVATION_COPIES: u64 = 8;
/// The context a fit verdict assumes when none is given: room for a long
/// conversation with most models.
pub const DEFAULT_CONTEXT_TOKENS: u64 = 4096;

// The hub does not depend on the engine (docs/ARCHITECTURE.md), so the
// engine's two numbers are repeated here; tests/hub.rs checks that
// they still agree. (The list of runnable model types is read, not
// repeated: see `hub::architecture`.)
//
// A mixture of experts needs all its experts in memory: the weights are the
// files' bytes, every expert included, however few work on each token.
/// The engine's default `prefill_step_size`.
pub const PREFILL_STEP_TOKENS: u64 = 2048;
/// The engine's KV cache grows in steps of this many positions.
pub const KV_CACHE_STEP: u64 = 256;

/// Bisection bound when the config gives no trained context.
const UNBOUNDED_CONTEXT_TOKENS: u64 = 1 << 32;

/// Estimates the memory a model needs at `input.context_tokens` and compares
/// it with what the machine can give it (see the decision above).
pub fn estimate_fit(input: &FitInput) -> FitEstimate {
    let context = input.context_tokens;
    let kv_cache_bytes = kv_cache_bytes(input, context);
    let overhead_bytes = overhead_bytes(input, context);
    let needed_bytes = needed_bytes(input, context);
    let budget_bytes = budget(input.available_bytes, input.working_set_bytes);
    let verdict = verdict_for(needed_bytes, budget_bytes);
    let max_context_that_fits = largest_context_within(input, budget_bytes);

    let mut advice = Vec::new();
    if verdict == Verdict::Tight {
        advice.push(
            "it will run but may push the system into swap; Ondo will let you load anyway"
                .to_string(),
        );
    }
    let context_limit = match verdict {
        Verdict::Fits => None,
        Verdict::Tight => largest_context_within(input, comfortable(budget_bytes)),
        Verdict::WillNotFit => max_context_that_fits,
    };
    if let Some(limit) = context_limit.filter(|&limit| limit < context) {
        advice.push(format!(
            "use a context of at most {limit} tokens (at {context} tokens the KV cache alone needs {})",
            human_bytes(kv_cache_bytes)
        ));
    }
    if verdict != Verdict::Fits {
        // Would the verdict improve if everything else quit? Only when free
        // memory, not the machine or the GPU working set, is what limits.
        let budget_when_free = budget(input.total_bytes, input.working_set_bytes);
        let target_available = match verdict {
            Verdict::WillNotFit => needed_bytes,
            // Enough that the estimate is 80% of it.
            _ => needed_bytes.saturating_add(needed_bytes / 4),
        };
        if verdict_for(needed_bytes, budget_when_free) < verdict
            && target_available > input.available_bytes
        {
            advice.push(format!(
                "close other apps to free about {} (Ondo needs {} in all; {} of {} is available now)",
                human_bytes(target_available - input.available_bytes),
                human_bytes(needed_bytes),
                human_bytes(input.available_bytes),
                human_bytes(input.total_bytes)
            ));
        }
        let gpu_limited = input
            .working_set_bytes
            .is_some_and(|working_set| working_set < input.available_bytes);
        advice.push(format!(
            "choose a smaller or more quantized model (this one needs {} of weights, you have {} available{})",
            human_bytes(input.weights_bytes),
            human_bytes(budget_bytes),
            if gpu_limited { " to the GPU" } else { "" }
        ));
    }

    FitEstimate {
        weights_bytes: input.weights_bytes,
        kv_cache_bytes,
        overhead_bytes,
        needed_bytes,
        available_bytes: input.available_bytes,
        working_set_bytes: input.working_set_bytes,
        budget_bytes,
        context_tokens: context,
        kv_bytes_per_token: input.shape.kv_bytes_per_token(),
        kv_cache_note: input.shape.kv_cache_note(),
        parameters: input.shape.parameters,
        active_parameters: input.shape.active_parameters(),
        experts_note: input.shape.experts_note(),
        verdict,
        max_context_that_fits,
        advice,
    }
}

/// The engine's cache grows `KV_CACHE_STEP` positions at a time, so that is
/// what it holds at a given context; a sliding-window layer's stops at its
/// window, as mlx-lm's `RotatingKVCache` does.
/// One rank's side of a split model's fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShareEstimate {
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub needed_bytes: u64,
    pub budget_bytes: u64,
    pub verdict: Verdict,
}

/// A rank's share of the model `whole` estimates: `weights_bytes` of its
/// weights and `kv_fraction` of its KV cache, with the overhead of a
/// model that size (the floor holds on every rank) and the whole prefill
/// step's activations (every rank runs every position), against the
/// rank's own `budget_bytes`.
pub fn estimate_share(
    whole: &FitEstimate,
    weights_bytes: u64,
    kv_fraction: f64,
    budget_bytes: u64,
) -> ShareEstimate {
    let activations = whole
        .overhead_bytes
        .saturating_sub(OVERHEAD_FLOOR_BYTES.max(whole.weights_bytes / 10));
    let kv_cache_bytes = (whole.kv_cache_bytes as f64 * kv_fraction.clamp(0.0, 1.0)).ceil() as u64;
    let needed_bytes = weights_bytes
        .saturating_add(kv_cache_bytes)
        .saturating_add(OVERHEAD_FLOOR_BYTES.max(weights_bytes / 10))
        .saturating_add(activations);
    ShareEstimate {
        weights_bytes,
        kv_cache_bytes,
        needed_bytes,
        budget_bytes,
        verdict: verdict_for(needed_bytes, budget_bytes),
    }
}

fn kv_cache_bytes(input: &FitInput, context: u64) -> u64 {
    let step = KV_CACHE_STEP;
    let positions = context.div_ceil(step).saturating_mul(step);
    input.shape.kv_cache_bytes_held_in(positions, input.kv_bits)
}

fn overhead_bytes(input: &FitInput, context: u64) -> u64 {
    // A prompt shorter than one prefill step only has its own activations.
    let prefill_tokens = context.min(PREFILL_STEP_TOKENS);
    let activations = (prefill_tokens * ACTIVATION_BYTES * ACTIVATION_COPIES)
        .saturating_mul(input.shape.hidden_size);
    OVERHEAD_FLOOR_BYTES
        .max(input.weights_bytes / 10)
        .saturating_add(activations)
}

fn needed_bytes(input: &FitInput, context: u64) -> u64 {
    input
        .weights_bytes
        .saturating_add(kv_cache_bytes(input, context))
        .saturating_add(overhead_bytes(input, context))
}

fn budget(memory_bytes: u64, working_set_bytes: Option<u64>) -> u64 {
    working_set_bytes.map_or(memory_bytes, |working_set| working_set.min(memory_bytes))
}

/// 80% of the budget: up to here the estimate Fits.
fn comfortable(budget_bytes: u64) -> u64 {
    budget_bytes - budget_bytes / 5
}

fn verdict_for(needed_bytes: u64, budget_bytes: u64) -> Verdict {
    if needed_bytes <= comfortable(budget_bytes) {
        Verdict::Fits
    } else if needed_bytes <= budget_bytes {
        Verdict::Tight
    } else {
        Verdict::WillNotFit
    }
}

/// The longest context, up to the trained one, whose estimate is within
/// `limit_bytes`; `None` if not even one token's is.
fn largest_context_within(input: &FitInput, limit_bytes: u64) -> Option<u64> {
    let cap = input
        .shape
        .max_position_embeddings
        .unwrap_or(UNBOUNDED_CONTEXT_TOKENS)
        .max(1);
    let within = |context| needed_bytes(input, context) <= limit_bytes;
    if !within(1) {
        return None;
    }
    if within(cap) {
        return Some(cap);
    }
    // The estimate only grows with the context: bisect with
    // within(fits) and !within(too_long).
    let (mut fits, mut too_long) = (1, cap);
    while too_long - fits > 1 {
        let middle = fits + (too_long - fits) / 2;
        if within(middle) {
            fits = middle;
        } else {
            too_long = middle;
        }
    }
    Some(fits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    fn llama_3b_config() -> Value {
        json!({
            "model_type": "llama",
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "hidden_size": 3072,
            "max_position_embeddings": 131072,
            "intermediate_size": 8192,
            "vocab_size": 128256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "torch_dtype": "bfloat16"
        })
    }

    /// Llama-3.2-3B-like, 1.8 GB of weights. Per token: 28*8*128*2*2 =
    /// 114,688 B. Overhead at >= 2048 tokens: 256 MiB floor (10% of the
    /// weights is less) + 2048*3072*4*8 = 268,435,456 + 201,326,592.
    fn llama_3b_input(context_tokens: u64, available_bytes: u64) -> FitInput {
        FitInput {
            weights_bytes: 1_800_000_000,
            shape: ModelShape::from_config(&llama_3b_config(), None).unwrap(),
            context_tokens,
            available_bytes,
            total_bytes: 16 * GIB,
            working_set_bytes: None,
            kv_bits: None,
        }
    }
    const LLAMA_3B_OVERHEAD: u64 = 268_435_456 + 201_326_592;
    /// 1.8e9 + 114,688*4096 + overhead.
    const LLAMA_3B_NEEDED_4096: u64 = 1_800_000_000 + 469_762_048 + LLAMA_3B_OVERHEAD;

    #[test]
    fn a_share_of_a_split_model_keeps_the_overhead_floor_and_the_whole_prefill_step() {
        let whole = estimate_fit(&llama_3b_input(4096, 2 * GIB));
        assert_eq!(whole.verdict, Verdict::WillNotFit);
        // Half the weights and half the KV cache on each of two ranks; the
        // 256 MiB floor and the prefill step's activations on each.
        let half = estimate_share(&whole, 900_000_000, 0.5, 2 * GIB);
        assert_eq!(half.kv_cache_bytes, 469_762_048 / 2);
        assert_eq!(
            half.needed_bytes,
            900_000_000 + 469_762_048 / 2 + LLAMA_3B_OVERHEAD
        );
        assert_eq!(half.verdict, Verdict::Fits);
        assert_eq!(
            estimate_share(&whole, 900_000_000, 0.5, GIB).verdict,
            Verdict::WillNotFit
        );
    }

    #[test]
    fn kv_cache_of_a_llama_3b_at_4096_tokens() {
        let shape = ModelShape::from_config(&llama_3b_config(), None).unwrap();
        assert_eq!(shape.kv_dtype, KvDtype::BF16);
        assert_eq!(shape.max_position_embeddings, Some(131072));
        assert_eq!(shape.kv_bytes_per_token(), 114_688);
        let estimate = estimate_fit(&llama_3b_input(4096, 8 * GIB));
        assert_eq!(estimate.kv_cache_bytes, 469_762_048);
        assert_eq!(estimate.overhead_bytes, LLAMA_3B_OVERHEAD);
        assert_eq!(estimate.needed_bytes, 2_739_524_096);
        assert_eq!(estimate.needed_bytes, LLAMA_3B_NEEDED_4096);
    }

    #[test]
    fn kv_heads_and_head_dim_default_from_attention_heads() {
        let config = json!({
            "num_hidden_layers": 12,
            "num_attention_heads": 16,
            "hidden_size": 2048,
            "torch_dtype": "float16"
        });
        let shape = ModelShape::from_config(&config, None).unwrap();
        assert_eq!(shape.num_key_value_heads, 16);
        assert_eq!(shape.head_dim, 128);
        assert_eq!(shape.max_position_embeddings, None);
        // 12 * 16 * 128 * 2 * 2
        assert_eq!(shape.kv_bytes_per_token(), 98_304);
    }

    #[test]
    fn null_head_dim_counts_as_absent() {
        let mut config = llama_3b_config();
        config["head_dim"] = Value::Null;
        let shape = ModelShape::from_config(&config, None).unwrap();
        assert_eq!(shape.head_dim, 3072 / 24);
    }

    #[test]
    fn multimodal_config_is_read_from_text_config() {
        let config = json!({
            "model_type": "gemma3",
            "torch_dtype": "float32",
            "vision_config": { "hidden_size": 1152, "num_hidden_layers": 27 },
            "text_config": {
                "hidden_size": 2560,
                "num_hidden_layers": 34,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256
            }
        });
        let shape = ModelShape::from_config(&config, Some("BF16")).unwrap();
        assert_eq!(shape.num_hidden_layers, 34);
        assert_eq!(shape.num_key_value_heads, 4);
        assert_eq!(shape.head_dim, 256);
        assert_eq!(shape.hidden_size, 2560);
        // The larger Gemma 3 models' context, as the engine has it too.
        assert_eq!(shape.max_position_embeddings, Some(131072));
        // The top-level dtype still applies to the text model.
        assert_eq!(shape.kv_dtype, KvDtype::F32);
        assert_eq!(shape.kv_bytes_per_token(), 34 * 4 * 256 * 2 * 4);
        // Gemma 3's window: mlx-lm's defaults, 512 positions in five layers of six.
        assert_eq!(
            shape.sliding_window,
            Some(SlidingWindowLayers {
                layers: 29,
                window_tokens: 512,
                num_key_value_heads: 4,
                head_dim: 256
            })
        );
    }

    #[test]
    fn dtype_comes_from_the_weights_when_the_config_has_none() {
        let mut config = llama_3b_config();
        config.as_object_mut().unwrap().remove("torch_dtype");
        let header = br#"{
            "__metadata__": {"format": "mlx"},
            "model.layers.0.mlp.up_proj.weight": {"dtype": "U32", "shape": [8192, 384], "data_offsets": [0, 1]},
            "model.layers.0.mlp.up_proj.scales": {"dtype": "F16", "shape": [8192, 48], "data_offsets": [1, 2]},
            "model.layers.0.mlp.up_proj.biases": {"dtype": "F16", "shape": [8192, 48], "data_offsets": [2, 3]},
            "model.layers.0.input_layernorm.weight": {"dtype": "F32", "shape": [3072], "data_offsets": [3, 4]},
            "model.norm.weight": {"dtype": "F32", "shape": [3072], "data_offsets": [4, 5]}
        }"#;
        let dtype = safetensors_float_dtype(header);
        assert_eq!(dtype.as_deref(), Some("F32"));
        let shape = ModelShape::from_config(&config, dtype.as_deref()).unwrap();
        assert_eq!(shape.kv_dtype, KvDtype::F32);
        assert_eq!(shape.kv_bytes_per_token(), 2 * 114_688);
        // Neither: 2 bytes, like both 16-bit types.
        let shape = ModelShape::from_config(&config, None).unwrap();
        assert_eq!(shape.kv_dtype.bytes(), 2);
    }

    #[test]
    fn config_dtype_wins_over_the_weights_and_both_key_names_work() {
        let mut config = llama_3b_config();
        config["torch_dtype"] = json!("float32");
        let shape = ModelShape::from_config(&config, Some("BF16")).unwrap();
        assert_eq!(shape.kv_dtype, KvDtype::F32);

        config.as_object_mut().unwrap().remove("torch_dtype");
        config["dtype"] = json!("float16");
        let shape = ModelShape::from_config(&config, Some("F32")).unwrap();
        assert_eq!(shape.kv_dtype, KvDtype::F16);
        assert_eq!(shape.kv_dtype.name(), "float16");
    }

    #[test]
    fn quantized_mlx_config_keeps_the_compute_dtype_for_the_cache() {
        let mut config = llama_3b_config();
        config["quantization"] = json!({ "group_size": 64, "bits": 4 });
        let shape = ModelShape::from_config(&config, Some("BF16")).unwrap();
        assert_eq!(shape.kv_bytes_per_token(), 114_688);
    }

    #[test]
    fn missing_key_names_the_key_and_says_why_it_matters() {
        let mut config = llama_3b_config();
        config.as_object_mut().unwrap().remove("num_hidden_layers");
        let error = ModelShape::from_config(&config, None).unwrap_err();
        assert_eq!(
            error,
            FitError::ConfigKeyMissing {
                key: "num_hidden_layers".into()
            }
        );
        let message = error.to_string();
        assert!(message.contains("`num_hidden_layers`"), "{message}");
        assert!(
            message.contains("config.json")
                && message.contains("does not describe a decoder model Ondo can size"),
            "{message}"
        );

        // A model type Ondo does not run is sized from the shared keys, and
        // attention heads are only needed to derive what is missing.
        let config = json!({ "num_hidden_layers": 2, "hidden_size": 64 });
        assert_eq!(
            ModelShape::from_config(&config, None),
            Err(FitError::ConfigKeyMissing {
                key: "num_attention_heads".into()
            })
        );
        // A family Ondo runs needs what its engine needs.
        let mut config = llama_3b_config();
        config.as_object_mut().unwrap().remove("rms_norm_eps");
        assert_eq!(
            ModelShape::from_config(&config, None),
            Err(FitError::ConfigKeyMissing {
                key: "rms_norm_eps".into()
            })
        );
    }

    #[test]
    fn non_numeric_key_is_invalid() {
        let mut config = llama_3b_config();
        config["num_key_value_heads"] = json!("8");
        let error = ModelShape::from_config(&config, None).unwrap_err();
        assert_eq!(
            error,
            FitError::ConfigKeyInvalid {
                key: "num_key_value_heads".into(),
                found: "\"8\"".to_string(),
                expected: "not a positive whole number".into(),
            }
        );
        config["num_key_value_heads"] = json!(0);
        assert!(ModelShape::from_config(&config, None).is_err());
    }

    #[test]
    fn a_quantized_kv_cache_counts_its_bits_scales_and_biases_after_its_start() {
        let four = KvCacheBits {
            bits: 4,
            group_size: 64,
            start: 5000,
        };
        // Per layer and position: 2 * 8 * 128 elements, half a byte each,
        // and 32 groups with a 2-byte scale and bias: 1,024 + 128 B, where
        // bfloat16 takes 4,096 B.
        assert_eq!(four.bytes_for(2 * 8 * 128, 2), 1024 + 128);
        let at = |context, kv_bits| {
            estimate_fit(&FitInput {
                kv_bits,
                ..llama_3b_input(context, 8 * GIB)
            })
            .kv_cache_bytes
        };
        // Below the start the cache is still in floats.
        assert_eq!(at(4096, Some(four)), at(4096, None));
        assert_eq!(at(32768, Some(four)), 28 * 32768 * (1024 + 128));
        assert!(at(32768, Some(four)) * 10 <= at(32768, None) * 3);
    }

    #[test]
    fn fits_with_a_fifth_to_spare() {
        let estimate = estimate_fit(&llama_3b_input(4096, 8 * GIB));
        assert_eq!(estimate.verdict, Verdict::Fits);
        assert_eq!(estimate.budget_bytes, 8 * GIB);
        assert!(estimate.advice.is_empty(), "{:?}", estimate.advice);
    }

    #[test]
    fn tight_within_the_budget_but_over_80_percent() {
        // 80% of 3 GiB is 2,576,980,377 < 2,739,524,096 <= 3 GiB.
        let estimate = estimate_fit(&llama_3b_input(4096, 3 * GIB));
        assert_eq!(estimate.verdict, Verdict::Tight);
        assert_eq!(
            estimate.advice[0],
            "it will run but may push the system into swap; Ondo will let you load anyway"
        );
        // 16 GiB total would fit comfortably: needed * 1.25 - 3 GiB =
        // 3,424,405,120 - 3,221,225,472 = 203,179,648 B = 194 MiB.
        assert!(
            estimate
                .advice
                .iter()
                .any(|a| a.starts_with("close other apps to free about 194 MiB")),
            "{:?}",
            estimate.advice
        );
        // The largest context within 80% of the budget is 2560: it needs
        // 1.8e9 + 114,688*2560 + overhead = 2,563,363,328.
        assert!(
            estimate
                .advice
                .iter()
                .any(|a| a.starts_with("use a context of at most 2560 tokens")),
            "{:?}",
            estimate.advice
        );
        assert!(estimate.max_context_that_fits.unwrap() > 4096);
    }

    #[test]
    fn will_not_fit_over_the_budget() {
        let estimate = estimate_fit(&llama_3b_input(4096, 2 * GIB));
        assert_eq!(estimate.verdict, Verdict::WillNotFit);
        // needed(256) = 1.8e9 + 114,688*256 + 268,435,456 + 256*3072*32 =
        // 2,122,961,408 <= 2 GiB; 257 tokens take a second cache step and
        // need 2,152,419,840.
        assert_eq!(estimate.max_context_that_fits, Some(256));
        assert_eq!(
            estimate.advice,
            vec![
                "use a context of at most 256 tokens (at 4096 tokens the KV cache alone needs 448 MiB)",
                // 2,739,524,096 - 2 GiB = 592,040,448 B = 564.6 MiB.
                "close other apps to free about 565 MiB (Ondo needs 2.55 GiB in all; 2.00 GiB of 16.0 GiB is available now)",
                "choose a smaller or more quantized model (this one needs 1.68 GiB of weights, you have 2.00 GiB available)",
            ]
        );
    }

    #[test]
    fn max_context_that_fits_at_the_boundary() {
        // needed(8192) = 1.8e9 + 114,688*8192 + overhead = 3,209,286,144.
        let needed_8192 = 1_800_000_000 + 939_524_096 + LLAMA_3B_OVERHEAD;
        let estimate = estimate_fit(&llama_3b_input(16384, needed_8192));
        assert_eq!(estimate.verdict, Verdict::WillNotFit);
        assert_eq!(estimate.max_context_that_fits, Some(8192));
        // A byte less: the cache grows in 256-token steps, so 7936.
        let estimate = estimate_fit(&llama_3b_input(16384, needed_8192 - 1));
        assert_eq!(estimate.max_context_that_fits, Some(7936));
    }

    #[test]
    fn max_context_is_none_when_weights_and_overhead_alone_do_not_fit() {
        // needed(1) = 1.8e9 + 114,688*256 + 268,435,456 + 3072*32 = 2,097,893,888.
        let estimate = estimate_fit(&llama_3b_input(4096, 2_097_893_887));
        assert_eq!(estimate.max_context_that_fits, None);
        assert!(
            !estimate
                .advice
                .iter()
                .any(|a| a.starts_with("use a context"))
        );
        let estimate = estimate_fit(&llama_3b_input(4096, 2_097_893_888));
        assert_eq!(estimate.max_context_that_fits, Some(1));
    }

    #[test]
    fn max_context_is_capped_at_the_trained_context() {
        let estimate = estimate_fit(&llama_3b_input(4096, 1024 * GIB));
        assert_eq!(estimate.max_context_that_fits, Some(131072));
    }

    #[test]
    fn short_context_counts_only_its_own_activations() {
        let estimate = estimate_fit(&llama_3b_input(512, 8 * GIB));
        assert_eq!(estimate.overhead_bytes, 268_435_456 + 512 * 3072 * 32);
        // 300 tokens occupy two 256-token cache steps.
        let estimate = estimate_fit(&llama_3b_input(300, 8 * GIB));
        assert_eq!(estimate.kv_cache_bytes, 114_688 * 512);
    }

    #[test]
    fn smaller_gpu_working_set_changes_the_verdict() {
        let mut input = llama_3b_input(4096, 16 * GIB);
        assert_eq!(estimate_fit(&input).verdict, Verdict::Fits);
        input.working_set_bytes = Some(3 * GIB);
        let estimate = estimate_fit(&input);
        assert_eq!(estimate.budget_bytes, 3 * GIB);
        assert_eq!(estimate.verdict, Verdict::Tight);
        // Closing apps cannot raise the working set.
        assert!(
            !estimate
                .advice
                .iter()
                .any(|a| a.starts_with("close other apps"))
        );
        assert!(
            estimate
                .advice
                .iter()
                .any(|a| a.ends_with("you have 3.00 GiB available to the GPU)")),
            "{:?}",
            estimate.advice
        );
    }

    #[test]
    fn verdict_serialises_in_snake_case() {
        assert_eq!(
            serde_json::to_string(&Verdict::WillNotFit).unwrap(),
            "\"will_not_fit\""
        );
        assert_eq!(
            serde_json::to_string(&KvDtype::BF16).unwrap(),
            "\"bfloat16\""
        );
    }

    #[test]
    fn float_dtype_ignores_quantization_scales_and_breaks_ties_to_bf16() {
        let header = br#"{
            "a.weight": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]},
            "a.scales": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            "a.biases": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
            "b.weight": {"dtype": "F16", "shape": [1], "data_offsets": [12, 14]},
            "c.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [14, 16]}
        }"#;
        assert_eq!(safetensors_float_dtype(header).as_deref(), Some("BF16"));
        let only_quantized =
            br#"{"a.weight": {"dtype": "U32", "shape": [1], "data_offsets": [0, 4]}}"#;
        assert_eq!(safetensors_float_dtype(only_quantized), None);
        assert_eq!(safetensors_float_dtype(b"not json"), None);
    }

    #[test]
    fn reads_a_safetensors_header_and_refuses_absurd_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let json = br#"{"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}"#;
        let path = dir.path().join("model.safetensors");
        let mut file = (json.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(json);
        file.extend_from_slice(&[0, 0, 0, 0]);
        std::fs::write(&path, &file).unwrap();
        let header = read_safetensors_header(&path).unwrap();
        assert_eq!(header, json);
        assert_eq!(safetensors_float_dtype(&header).as_deref(), Some("BF16"));

        let absurd = dir.path().join("absurd.safetensors");
        std::fs::write(&absurd, u64::MAX.to_le_bytes()).unwrap();
        let error = read_safetensors_header(&absurd).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("100 MB"), "{error}");

        let truncated = dir.path().join("truncated.safetensors");
        std::fs::write(&truncated, &file[..20]).unwrap();
        let error = read_safetensors_header(&truncated).unwrap_err();
        assert!(error.to_string().contains("incomplete"), "{error}");
    }

    #[test]
    fn qwen3_moe_counts_only_sparse_layers_as_experts() {
        // 4 layers, experts every second layer except layer 3 (mlp_only):
        // layer index 1 is the only MoE layer.
        let config = json!({
            "model_type": "qwen3_moe",
            "hidden_size": 64,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [3],
            "vocab_size": 100,
            "tie_word_embeddings": false,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "torch_dtype": "bfloat16"
        });
        let shape = ModelShape::from_config(&config, None).unwrap();
        let experts = shape.experts.unwrap();
        assert_eq!(experts.moe_layers, 1);
        assert_eq!(experts.parameters_per_expert, 3 * 64 * 32);
        // Embeddings and output 2 * 100 * 64 = 12,800; attention per layer
        // 2 * 64 * 16 * (4 + 2) = 12,288; three dense MLPs 3 * 64 * 128 =
        // 24,576 each; one MoE layer of 8 experts of 6,144 and a 512 router;
        // norms: two of 64 and the q/k norms of 16 per layer, the final 64.
        let norms = 4 * (2 * 64 + 2 * 16) + 64;
        let total = 12_800 + 4 * 12_288 + 3 * 24_576 + 8 * 6_144 + 512 + norms;
        assert_eq!(shape.parameters, Some(total));
        assert_eq!(shape.active_parameters(), Some(total - 6 * 6_144));
        assert_eq!(shape.sliding_window, None);

        // num_experts 0 is a dense model.
        let mut dense = config.clone();
        dense["num_experts"] = json!(0);
        let shape = ModelShape::from_config(&dense, None).unwrap();
        assert_eq!(shape.experts, None);
        assert_eq!(shape.active_parameters(), None);
        assert_eq!(
            shape.parameters,
            Some(12_800 + 4 * 12_288 + 4 * 24_576 + norms)
        );
    }

    #[test]
    fn gpt_oss_without_layer_types_alternates_sliding_first() {
        let config = json!({
            "model_type": "gpt_oss",
            "hidden_size": 64,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "vocab_size": 100,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "bfloat16"
        });
        let shape = ModelShape::from_config(&config, None).unwrap();
        // mlx-lm's default window (128) in half the layers.
        assert_eq!(
            shape.sliding_window,
            Some(SlidingWindowLayers {
                layers: 3,
                window_tokens: 128,
                num_key_value_heads: 2,
                head_dim: 16
            })
        );
        // Per layer and position: 2 KV heads * 16 * K and V * 2 bytes = 128 B.
        // At 1024 positions: 3 full layers hold 1024, 3 sliding ones 128.
        assert_eq!(shape.kv_cache_bytes(1024), 128 * (3 * 1024 + 3 * 128));
        assert_eq!(shape.kv_cache_bytes(100), 128 * 6 * 100);
        assert_eq!(
            shape.kv_cache_note().as_deref(),
            Some("3 of 6 layers keep at most 128 positions")
        );
        // Every layer is a MoE layer.
        assert_eq!(shape.experts.unwrap().moe_layers, 6);
        assert_eq!(
            shape.experts_note().as_deref(),
            Some("all 4 experts stay in memory; 2 of them work on each token")
        );

        // layer_types decides when given; a list that does not name every
        // layer is refused by name.
        let mut listed = config.clone();
        listed["layer_types"] = json!([
            "full_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
            "full_attention",
            "full_attention"
        ]);
        listed["sliding_window"] = json!(256);
        let shape = ModelShape::from_config(&listed, None).unwrap();
        assert_eq!(
            shape.sliding_window,
            Some(SlidingWindowLayers {
                layers: 1,
                window_tokens: 256,
                num_key_value_heads: 2,
                head_dim: 16
            })
        );
        listed["layer_types"] = json!(["full_attention"]);
        let error = ModelShape::from_config(&listed, None).unwrap_err();
        assert!(
            error.to_string().contains("layer_types names 1 layers"),
            "{error}"
        );
    }

    #[test]
    fn lfm2s_convolution_layers_keep_a_constant_state_and_the_verdict_says_so() {
        // LFM2-1.2B: 16 layers, 6 attend; the other 10 keep 2 inputs of
        // 2048 channels in bfloat16 whatever the context.
        let config = json!({
            "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
            "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 128000,
            "norm_eps": 1e-5, "conv_bias": false, "conv_L_cache": 3,
            "block_dim": 2048, "block_ff_dim": 12288, "block_multiple_of": 256,
            "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": true,
            "rope_theta": 1000000.0, "full_attn_idxs": [2, 5, 8, 10, 12, 14],
            "torch_dtype": "bfloat16"
        });
        let shape = ModelShape::from_config(&config, None).unwrap();
        let attention_per_token = 6 * 2 * 8 * 64 * 2;
        assert_eq!(shape.kv_bytes_per_token(), attention_per_token);
        let state = 10 * 2 * 2048 * 2;
        assert_eq!(shape.kv_cache_bytes(0), state);
        assert_eq!(
            shape.kv_cache_bytes(4096),
            4096 * attention_per_token + state
        );
        assert_eq!(
            shape.kv_cache_note().as_deref(),
            Some("10 of 16 layers keep a state of 8 KiB whatever the context")
        );
    }

    #[test]
    fn a_sliding_window_bounds_the_cache_and_the_context_that_fits() {
        // Gemma 3 1B's shape: 26 layers, 22 of them keep at most 512 positions.
        let config = json!({
            "model_type": "gemma3_text",
            "hidden_size": 1152,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "max_position_embeddings": 32768,
            "intermediate_size": 6912,
            "vocab_size": 262144,
            "torch_dtype": "bfloat16"
        });
        let input = |context_tokens, available_bytes| FitInput {
            weights_bytes: 600_000_000,
            shape: ModelShape::from_config(&config, None).unwrap(),
            context_tokens,
            available_bytes,
            total_bytes: 16 * GIB,
            working_set_bytes: None,
            kv_bits: None,
        };
        // 1,024 B per layer and position. At 32768 tokens: 4 * 32768 + 22 *
        // 512 layer-positions, a quarter of the 26 * 32768 a full cache holds.
        let estimate = estimate_fit(&input(32768, 8 * GIB));
        assert_eq!(estimate.kv_cache_bytes, 1024 * (4 * 32768 + 22 * 512));
        assert_eq!(estimate.kv_cache_bytes, 145_752_064);
        assert_eq!(estimate.kv_bytes_per_token, 26 * 1024);
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("22 of 26 layers keep at most 512 positions")
        );
        assert_eq!(estimate.max_context_that_fits, Some(32768));
        // Beyond the window only the 4 global layers grow: the overhead is
        // 268,435,456 + 2048 * 1152 * 32 = 343,932,928, and with 22 * 512 *
        // 1024 = 11,534,336 B of sliding cache, 1 GB leaves
        // 1e9 - 6e8 - 343,932,928 - 11,534,336 = 44,532,736 B for 4 * 1,024 B
        // a position: 10,872 positions, down to a cache step, 10,752.
        let estimate = estimate_fit(&input(32768, 1_000_000_000));
        assert_eq!(estimate.max_context_that_fits, Some(10_752));
    }
}
