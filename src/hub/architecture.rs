//! Which architecture a config.json describes, and whether Ondo's engine runs
//! it: the one rule the library, the catalog, search, sizing and downloads
//! all read, so that "not supported yet" is said before anything is
//! downloaded rather than after gigabytes that cannot load.
//!
//! Two types can be named. The engine, like mlx-lm, picks the model's code by
//! the top-level `model_type`: that decides whether it runs. A multimodal
//! checkpoint (`gemma3`) keeps its language model's own config, with its own
//! `model_type` (`gemma3_text`), under `text_config`; that one decides how
//! the text model is shaped (its sliding windows, its defaults).

use serde_json::Value;

/// The `model_type`s the engine runs: one per family description
/// (`crate::family`), which the engine builds from too, so what the hub
/// offers is what the engine loads.
pub fn runnable_model_types() -> Vec<&'static str> {
    crate::family::model_types()
}

/// The `model_type` the engine picks the model's code by: the top-level one.
pub fn model_type(config: &Value) -> Option<&str> {
    crate::family::model_type(config)
}

/// The language model's part of a config: `text_config` in a multimodal
/// checkpoint, the whole config otherwise.
pub fn text_config(config: &Value) -> &Value {
    config
        .get("text_config")
        .filter(|text| text.is_object())
        .unwrap_or(config)
}

/// A model the engine cannot run, named before it is downloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The config's top-level `model_type`; `None` when it names none.
    pub model_type: Option<String>,
    /// Set when the type runs but this checkpoint's layout does not: what
    /// the layout is and which checkpoint to take instead.
    pub layout: Option<&'static str>,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.layout {
            Some(layout) => write!(f, "not supported yet: {layout}"),
            None => write!(
                f,
                "not supported yet: {} (Ondo runs: {})",
                describe(self.model_type.as_deref()),
                runnable_model_types().join(", ")
            ),
        }
    }
}

impl std::error::Error for Unsupported {}

/// A checkpoint of a runnable type in a layout the engine does not read,
/// as its family tells from the config.
fn unsupported_layout(config: &Value) -> Option<&'static str> {
    let family = crate::family::find(model_type(config)?)?;
    (family.unreadable_layout)(config)
}

fn describe(model_type: Option<&str>) -> String {
    match model_type {
        Some(model_type) => format!("model_type {model_type}"),
        None => "config.json names no model_type".to_owned(),
    }
}

/// Whether the engine runs a model of this top-level `model_type`.
pub fn check_model_type(model_type: Option<&str>) -> Result<(), Unsupported> {
    match model_type {
        Some(name) if crate::family::find(name).is_some() => Ok(()),
        _ => Err(Unsupported {
            model_type: model_type.map(str::to_owned),
            layout: None,
        }),
    }
}

/// Whether the engine runs the model a parsed config.json describes: its
/// type, and for a type that runs, the layout of its tensors where the
/// config tells it.
pub fn check_config(config: &Value) -> Result<(), Unsupported> {
    check_model_type(model_type(config))?;
    match unsupported_layout(config) {
        Some(layout) => Err(Unsupported {
            model_type: model_type(config).map(str::to_owned),
            layout: Some(layout),
        }),
        None => Ok(()),
    }
}

/// The reason the model a parsed config.json describes cannot run, or
/// `None` when it can.
pub fn unsupported_config_reason(config: &Value) -> Option<String> {
    check_config(config)
        .err()
        .map(|unsupported| unsupported.to_string())
}

/// The reason a model cannot run, as the app and `ondo ls` show it, or
/// `None` when it can.
pub fn unsupported_reason(model_type: Option<&str>) -> Option<String> {
    check_model_type(model_type)
        .err()
        .map(|unsupported| unsupported.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_engine_decides_by_the_top_level_type() {
        let supported = runnable_model_types()[0];
        assert_eq!(check_config(&json!({ "model_type": supported })), Ok(()));
        // A vision-language wrapper around a supported text model is not the
        // text model: its tensors and config are laid out differently.
        let wrapper = json!({
            "model_type": "llava_next",
            "text_config": { "model_type": supported }
        });
        assert_eq!(text_config(&wrapper)["model_type"], supported);
        assert_eq!(
            check_config(&wrapper),
            Err(Unsupported {
                model_type: Some("llava_next".into()),
                layout: None,
            })
        );
    }

    #[test]
    fn the_reason_names_the_type_and_what_runs() {
        let reason = unsupported_reason(Some("mamba")).unwrap();
        let runnable = runnable_model_types().join(", ");
        assert_eq!(
            reason,
            format!("not supported yet: model_type mamba (Ondo runs: {runnable})")
        );
        assert!(
            reason.contains("llama") && reason.contains("qwen3"),
            "{reason}"
        );
        assert_eq!(
            check_config(&json!({ "architectures": ["X"] }))
                .unwrap_err()
                .to_string(),
            format!("not supported yet: config.json names no model_type (Ondo runs: {runnable})")
        );
        assert_eq!(unsupported_reason(Some("qwen3")), None);
    }

    #[test]
    fn openai_s_own_gpt_oss_layout_is_named_with_what_to_take_instead() {
        let original = json!({
            "model_type": "gpt_oss",
            "quantization_config": { "quant_method": "mxfp4" }
        });
        let reason = unsupported_config_reason(&original).unwrap();
        assert!(reason.contains("OpenAI's original gpt-oss"), "{reason}");
        assert!(
            reason.contains("mlx-community/gpt-oss-20b-MXFP4-Q8"),
            "{reason}"
        );
        let converted = json!({
            "model_type": "gpt_oss",
            "quantization": { "group_size": 64, "bits": 8 },
            "quantization_config": { "quant_method": "mxfp4" }
        });
        assert_eq!(unsupported_config_reason(&converted), None);
    }

    #[test]
    fn the_text_model_of_a_multimodal_config() {
        let config = json!({
            "model_type": "gemma3",
            "text_config": { "model_type": "gemma3_text", "hidden_size": 2560 }
        });
        assert_eq!(model_type(&config), Some("gemma3"));
        assert_eq!(text_config(&config)["model_type"], "gemma3_text");
        assert_eq!(text_config(&config)["hidden_size"], 2560);
        let plain = json!({ "model_type": "qwen3", "hidden_size": 1024 });
        assert_eq!(text_config(&plain)["model_type"], "qwen3");
        assert_eq!(text_config(&plain)["hidden_size"], 1024);
    }
}
