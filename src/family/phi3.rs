//! `model_type: phi3` (Phi-3, Phi-3.5, Phi-4-mini): the dense decoder with
//! q, k and v in one `qkv_proj` and gate and up in one `gate_up_proj`, the
//! head size `hidden_size / num_attention_heads`, rope over the first
//! `partial_rotary_factor` of each head, and longrope (`su`) scaling whose
//! long factors apply at every length, as mlx-lm applies them (transformers
//! uses the short factors below the original context, so its answers to
//! short prompts differ slightly from both).

use serde_json::{Value, json};

use super::config::{ConfigError, ConfigKeys, Keys, ModelConfig};
use super::synth::{Shape, SynthChoices, SynthRecipe, plain_rope};
use super::{Family, ReplyStyle, every_layout_readable};

pub const PHI3: Family = Family {
    model_type: "phi3",
    class_name: "Phi3ForCausalLM",
    about: "Phi-3, Phi-3.5 and Phi-4-mini",
    settle,
    unreadable_layout: every_layout_readable,
    reply: ReplyStyle::PLAIN,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// Settles a Phi-3 config.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut keys = ConfigKeys::parse(value)?;
    let read = Keys::of(value);
    // The head size is always derived; a `head_dim` key is not read.
    keys.head_dim = None;
    let rope_theta = keys.rope_theta.unwrap_or(10_000.0);
    let tie = keys.tie_word_embeddings.unwrap_or(false);
    let partial = read.number("partial_rotary_factor")?.unwrap_or(1.0);
    let original = read
        .number("original_max_position_embeddings")?
        .unwrap_or(4096.0) as f32;
    let mut config = ModelConfig::from_keys("phi3", keys, rope_theta, tie);
    config.max_position_embeddings = Some(config.max_position_embeddings.unwrap_or(131_072));
    config.fused_projections = true;
    config.rotary_dims = (f64::from(config.head_dim) * partial) as i32;
    if let Some(scaling) = config.rope_scaling.as_mut() {
        match scaling.kind() {
            Some("longrope") | Some("su") => {
                if scaling.long_factor.is_none() {
                    return Err(ConfigError::Inconsistent(
                        "rope_scaling `longrope` needs long_factor".into(),
                    ));
                }
                // Phi keeps the original context at the top level.
                scaling.original_max_position_embeddings = Some(original);
            }
            Some("linear") => {}
            // mlx-lm runs other types as plain rope (with a warning).
            _ => config.rope_scaling = None,
        }
    }
    Ok(config)
}

/// longrope's stretch of a synthetic Phi folder: the preset's context is
/// written as 32 times the original one (Phi-4-mini's 131072 over 4096), so
/// the rotated dimensions are scaled as Phi-4-mini's are.
const CONTEXT_STRETCH: usize = 32;

/// Phi-4-mini rotates the first three quarters of each head.
const PARTIAL_ROTARY: f64 = 0.75;

fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    let rotary = (shape.head_dim as f64 * PARTIAL_ROTARY) as usize;
    // Factors that differ per frequency, as real long factors do.
    let factors: Vec<f64> = (0..rotary / 2)
        .map(|i| 1.0 + i as f64 / (rotary / 2) as f64)
        .collect();
    config["partial_rotary_factor"] = json!(PARTIAL_ROTARY);
    config["original_max_position_embeddings"] =
        json!((shape.max_position_embeddings / CONTEXT_STRETCH).max(1));
    config["rope_scaling"] = json!({
        "type": "longrope",
        "long_factor": factors,
        "short_factor": vec![1.0; rotary / 2],
    });
    if let Some(fields) = config.as_object_mut() {
        fields.remove("head_dim");
    }
}
