//! `model_type: mistral3` (Mistral 3's multimodal checkpoints: Ministral 3,
//! Mistral Small 3.1 and 3.2): the text model only, as `text_config`
//! describes it (`ministral3`, or a Llama-shaped model), its tensors under
//! `language_model.model.` and `language_model.lm_head`, or as transformers
//! 5 spells them, `model.language_model.` and `lm_head`; the vision tower
//! and projector are skipped, so the model answers text only. The text
//! model's head is untied unless its config says otherwise (mlx-lm's
//! default for these checkpoints). Mistral 4's text model is not run yet.

use serde_json::{Value, json};

use super::Family;
use super::config::{ConfigError, ModelConfig, missing};
use super::ministral3::fp8_checkpoint;
use super::synth::{Shape, SynthChoices, SynthRecipe, nest_under_text_config, plain_rope};

pub const MISTRAL3: Family = Family {
    model_type: "mistral3",
    class_name: "Mistral3ForConditionalGeneration",
    about: "Ministral 3 and Mistral Small 3.1 and 3.2 (multimodal checkpoints; Ondo reads the text model)",
    settle,
    unreadable_layout: fp8_checkpoint,
    reply: super::ministral3::MISTRAL_REPLIES,
    synth: SynthRecipe {
        adjust: plain_rope,
        config: synth_config,
        // A vision tower and projector: present in every multimodal
        // checkpoint, read by neither Ondo nor mlx-lm's text model.
        extra_tensors: &[
            "vision_tower.ln_pre.weight",
            "multi_modal_projector.norm.weight",
        ],
        vision: None,
    },
};

/// Settles a Mistral 3 config: its `text_config` with its own family's
/// rules, read from `language_model.`.
pub fn settle(value: &Value) -> Result<ModelConfig, ConfigError> {
    let Some(text) = value.get("text_config").filter(|t| t.is_object()) else {
        return Err(missing("text_config"));
    };
    let mut text = text.clone();
    if text["tie_word_embeddings"].is_null() {
        text["tie_word_embeddings"] = json!(false);
    }
    if let Some(quantization) = value.get("quantization") {
        text["quantization"] = quantization.clone();
    }
    let mut config = match text["model_type"].as_str() {
        Some("ministral3") => super::ministral3::settle(&text)?,
        Some("mistral4") => {
            return Err(ConfigError::Inconsistent(
                "this Mistral 3 checkpoint's text model is Mistral 4 (`text_config.model_type` \
                 mistral4, a mixture of experts), which Ondo does not run yet; Mistral 3 \
                 checkpoints of Ministral 3 or Mistral Small run"
                    .into(),
            ));
        }
        _ => super::llama::settle(&text)?,
    };
    config.model_type = "mistral3".into();
    config.read_inside_language_model(&[
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    ]);
    Ok(config)
}

/// Ministral 3's text keys under `text_config`, and a vision config at the
/// top level, as Mistral's checkpoints have them.
fn synth_config(config: &mut Value, shape: &Shape, choices: &SynthChoices) {
    (super::MINISTRAL3.synth.config)(config, shape, choices);
    nest_under_text_config(
        config,
        "ministral3",
        "mistral3",
        json!({"model_type": "pixtral"}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ministral_3_3b() -> Value {
        json!({
            "model_type": "mistral3",
            "text_config": {
                "model_type": "ministral3", "hidden_size": 3072, "intermediate_size": 9216,
                "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "vocab_size": 131072, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 262144,
                "rope_parameters": {
                    "type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0,
                    "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                    "llama_4_scaling_beta": 0.1,
                },
            },
            "vision_config": {"model_type": "pixtral"},
            "quantization": {"group_size": 64, "bits": 4},
        })
    }

    #[test]
    fn the_text_model_settles_under_language_model_with_an_untied_default() {
        let config = settle(&ministral_3_3b()).unwrap();
        assert_eq!(config.model_type, "mistral3");
        assert_eq!(config.weight_prefix, "language_model.model");
        assert!(!config.tie_word_embeddings, "untied unless said otherwise");
        assert!(config.query_scale.is_some(), "Ministral 3's computation");
        assert_eq!(config.quantization.unwrap().bits, 4);
        let mut tied = ministral_3_3b();
        tied["text_config"]["tie_word_embeddings"] = json!(true);
        assert!(settle(&tied).unwrap().tie_word_embeddings);
    }

    #[test]
    fn a_llama_text_model_runs_and_mistral_4_is_refused_in_words() {
        let mut llama = ministral_3_3b();
        llama["text_config"]["model_type"] = json!("mistral");
        llama["text_config"]["rope_theta"] = json!(1e9);
        let config = settle(&llama).unwrap();
        assert_eq!(config.query_scale, None);
        assert_eq!(config.rope_theta, 1e9);
        let mut four = ministral_3_3b();
        four["text_config"]["model_type"] = json!("mistral4");
        let text = settle(&four).unwrap_err().to_string();
        assert!(text.contains("Mistral 4"), "{text}");
        assert!(matches!(
            settle(&json!({"model_type": "mistral3"})),
            Err(ConfigError::Missing { .. })
        ));
    }
}
