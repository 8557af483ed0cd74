//! `model_type: smollm3` (SmolLM3): a Llama whose every fourth layer rotates
//! nothing (NoPE). `no_rope_layers` lists, per layer, 1 for a layer with
//! rope and 0 for one without; when absent it follows from
//! `no_rope_layer_interval` (default 4): layer `i` has rope unless
//! `(i + 1) % interval == 0`, as mlx-lm and transformers derive it.
//! SmolLM3 reasons in a `<think>` block it opens itself and calls tools in
//! `<tool_call>` tags.

use serde_json::{Value, json};

use super::config::{ConfigError, Keys, ModelConfig, windows_of_layer_types};
use super::qwen3::THINKING_QWEN;
use super::synth::{Shape, SynthChoices, SynthRecipe};
use super::{Family, every_layout_readable};

pub const SMOLLM3: Family = Family {
    model_type: "smollm3",
    class_name: "SmolLM3ForCausalLM",
    about: "SmolLM3 (Llama with rope left out of every fourth layer)",
    settle,
    unreadable_layout: every_layout_readable,
    reply: THINKING_QWEN,
    synth: SynthRecipe {
        adjust,
        config: synth_config,
        extra_tensors: &[],
        vision: None,
    },
};

/// mlx-lm's default `no_rope_layer_interval`.
const DEFAULT_INTERVAL: u64 = 4;

/// Settles a SmolLM3 config: Llama's, with the layers without rope.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let mut config = super::llama::settle(value)?;
    config.model_type = "smollm3".into();
    let layers = config.num_hidden_layers;
    config.layers_without_rope = layers_without_rope(value, layers)?;
    config.layer_windows = windows_of_layer_types(value, layers)?;
    Ok(config)
}

/// The layers whose attention takes no rope.
fn layers_without_rope(value: &Value, layers: usize) -> Result<Vec<usize>, ConfigError> {
    let keys = Keys::of(value);
    let listed = keys.whole_list("no_rope_layers")?;
    if keys.get("no_rope_layers").is_none() {
        let interval = keys
            .count("no_rope_layer_interval")?
            .unwrap_or(DEFAULT_INTERVAL) as usize;
        return Ok((0..layers).filter(|i| (i + 1) % interval == 0).collect());
    }
    if listed.len() != layers {
        return Err(ConfigError::Inconsistent(format!(
            "`no_rope_layers` has {} entries, one per layer is needed (`num_hidden_layers` is {layers})",
            listed.len()
        )));
    }
    if listed.iter().any(|&flag| flag > 1) {
        return Err(ConfigError::Invalid {
            key: "no_rope_layers".into(),
            found: format!("{listed:?}"),
            expected: "a list of 1 (rope) and 0 (no rope) per layer",
        });
    }
    Ok((0..layers).filter(|&i| listed[i] == 0).collect())
}

/// SmolLM3's rope base (SmolLM3-3B's `rope_theta`), unscaled.
fn adjust(shape: &mut Shape) {
    shape.rope_theta = 5_000_000.0;
    shape.rope_scaling = None;
}

/// Both keys, as SmolLM3-3B's config.json has them. The interval is the
/// published 4 where the shape has that many layers, else 2, so that a
/// small shape still has a layer without rope.
fn synth_config(config: &mut Value, shape: &Shape, _: &SynthChoices) {
    let layers = shape.num_hidden_layers;
    let interval = if layers >= DEFAULT_INTERVAL as usize {
        DEFAULT_INTERVAL as usize
    } else {
        2
    };
    let flags: Vec<u8> = (0..layers)
        .map(|i| u8::from((i + 1) % interval != 0))
        .collect();
    config["no_rope_layer_interval"] = json!(interval);
    config["no_rope_layers"] = json!(flags);
    config["use_sliding_window"] = json!(false);
    config["sliding_window"] = Value::Null;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm3(extra: Value) -> Value {
        let mut config = json!({
            "model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": 100,
            "rms_norm_eps": 1e-6, "rope_theta": 5e6,
        });
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        config
    }

    #[test]
    fn every_fourth_layer_has_no_rope_unless_listed_otherwise() {
        let config = settle(&smollm3(json!({}))).unwrap();
        assert_eq!(config.layers_without_rope, [3, 7]);
        assert!(config.uses_rope(2) && !config.uses_rope(3));
        let config = settle(&smollm3(json!({"no_rope_layer_interval": 3}))).unwrap();
        assert_eq!(config.layers_without_rope, [2, 5]);
        // The list decides over the interval.
        let config = settle(&smollm3(json!({
            "no_rope_layer_interval": 4,
            "no_rope_layers": [0, 1, 1, 1, 1, 1, 1, 0],
        })))
        .unwrap();
        assert_eq!(config.layers_without_rope, [0, 7]);
        assert!(config.tie_word_embeddings);
        assert_eq!(config.rope_theta, 5e6);
    }

    #[test]
    fn a_rope_list_of_the_wrong_length_is_refused_by_name() {
        let error = settle(&smollm3(json!({"no_rope_layers": [1, 1, 1, 0]}))).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("`no_rope_layers` has 4 entries") && text.contains("is 8"),
            "{text}"
        );
        let error = settle(&smollm3(
            json!({"no_rope_layers": [1, 1, 1, 2, 1, 1, 1, 0]}),
        ));
        assert!(matches!(error, Err(ConfigError::Invalid { .. })));
    }
}
