//! `quantization` in config.json (mlx-lm's format): the parameters most
//! matrices were quantized with, and any module quantized otherwise, named
//! by its path (`"model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}`,
//! or `false` for a module left in floats). Which formats the engine
//! computes is said here too, so a config is refused before any tensor is
//! read.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The quantization formats MLX has; which ones Ondo reads is
/// `QuantParams::check`'s to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantMode {
    Affine,
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl QuantMode {
    /// The name config.json and MLX use.
    pub fn name(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Nvfp4 => "nvfp4",
            QuantMode::Mxfp8 => "mxfp8",
        }
    }
}

/// How one matrix was quantized: what its packed weight and scales mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    pub group_size: i32,
    pub bits: i32,
    pub mode: QuantMode,
}

impl QuantParams {
    /// Whether each group also has a bias (affine does; the microscaling
    /// float formats have a shared exponent only).
    pub fn has_biases(&self) -> bool {
        self.mode == QuantMode::Affine
    }

    /// Rejects what the engine cannot compute: affine 4- and 8-bit in
    /// groups of 32, 64 or 128, and mxfp4 (4-bit, groups of 32).
    pub fn check(&self) -> Result<(), QuantError> {
        let ok = match self.mode {
            QuantMode::Affine => {
                matches!(self.bits, 4 | 8) && matches!(self.group_size, 32 | 64 | 128)
            }
            QuantMode::Mxfp4 => self.bits == 4 && self.group_size == 32,
            QuantMode::Nvfp4 | QuantMode::Mxfp8 => false,
        };
        if ok {
            return Ok(());
        }
        Err(QuantError::Unsupported {
            detail: format!(
                "mode {:?}, bits {}, group size {}",
                self.mode, self.bits, self.group_size
            ),
        })
    }
}

/// Why a quantization block cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("quantization {detail} is not supported")]
    Unsupported { detail: String },
    #[error("{0}")]
    Invalid(String),
}

/// A config.json's `quantization` block.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    pub group_size: i32,
    pub bits: i32,
    pub mode: Option<QuantMode>,
    /// Per-module entries: their own parameters, or `None` for unquantized.
    pub modules: BTreeMap<String, Option<QuantParams>>,
}

/// One per-module entry as config.json writes it.
#[derive(Deserialize)]
struct ModuleEntry {
    group_size: i32,
    bits: i32,
    #[serde(default)]
    mode: Option<QuantMode>,
}

impl QuantConfig {
    /// Reads the block; its default and every module's entry must be a
    /// format the engine computes.
    pub fn from_value(value: &Value) -> Result<Self, QuantError> {
        let Some(map) = value.as_object() else {
            return Err(QuantError::Invalid("not an object".into()));
        };
        let field = |key: &str| map.get(key).cloned().unwrap_or(Value::Null);
        let invalid =
            |what: &str, e: serde_json::Error| QuantError::Invalid(format!("{what}: {e}"));
        let group_size =
            serde_json::from_value(field("group_size")).map_err(|e| invalid("group_size", e))?;
        let bits = serde_json::from_value(field("bits")).map_err(|e| invalid("bits", e))?;
        let mode = serde_json::from_value(field("mode")).map_err(|e| invalid("mode", e))?;
        let mut modules = BTreeMap::new();
        for (path, entry) in map {
            if matches!(path.as_str(), "group_size" | "bits" | "mode") {
                continue;
            }
            let params = match entry {
                Value::Bool(false) => None,
                Value::Object(_) => {
                    let entry: ModuleEntry = serde_json::from_value(entry.clone())
                        .map_err(|e| invalid(&format!("quantization of {path}"), e))?;
                    Some(QuantParams {
                        group_size: entry.group_size,
                        bits: entry.bits,
                        mode: entry.mode.unwrap_or(QuantMode::Affine),
                    })
                }
                // Other keys (`quant_method` and the like) describe the
                // converter, not a module.
                _ => continue,
            };
            modules.insert(path.clone(), params);
        }
        let config = Self {
            group_size,
            bits,
            mode,
            modules,
        };
        config.default_params().check()?;
        for params in config.modules.values().flatten() {
            params.check()?;
        }
        Ok(config)
    }

    /// The parameters most matrices were quantized with.
    pub fn default_params(&self) -> QuantParams {
        QuantParams {
            group_size: self.group_size,
            bits: self.bits,
            mode: self.mode.unwrap_or(QuantMode::Affine),
        }
    }

    /// "4bit", "8bit", or another mode's name; with per-module formats, each
    /// distinct one, the default's first: "8bit+mxfp4" for 8-bit affine with
    /// experts in mxfp4.
    pub fn label(&self) -> String {
        let label = |mode: QuantMode, bits: i32| match mode {
            QuantMode::Affine => format!("{bits}bit"),
            other => other.name().to_owned(),
        };
        let mut labels = vec![label(self.mode.unwrap_or(QuantMode::Affine), self.bits)];
        for params in self.modules.values().flatten() {
            let module = label(params.mode, params.bits);
            if !labels.contains(&module) {
                labels.push(module);
            }
        }
        labels.join("+")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn per_module_entries_are_read_and_other_keys_ignored() {
        let q = QuantConfig::from_value(&json!({
            "group_size": 64,
            "bits": 4,
            "quant_method": "mlx",
            "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
            "model.layers.0.mlp.switch_mlp.up_proj": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
            "lm_head": false,
        }))
        .unwrap();
        assert_eq!(q.default_params().mode, QuantMode::Affine);
        assert_eq!(q.modules.len(), 3);
        assert_eq!(q.modules["lm_head"], None);
        assert_eq!(
            q.modules["model.layers.0.mlp.gate"],
            Some(QuantParams {
                group_size: 64,
                bits: 8,
                mode: QuantMode::Affine
            })
        );
        assert_eq!(q.label(), "4bit+8bit+mxfp4");
    }

    #[test]
    fn formats_the_engine_cannot_compute_are_refused_by_name() {
        for (block, refused) in [
            (json!({"group_size": 64, "bits": 4}), false),
            (json!({"group_size": 32, "bits": 4, "mode": "mxfp4"}), false),
            (json!({"group_size": 16, "bits": 4, "mode": "nvfp4"}), true),
            (json!({"group_size": 64, "bits": 3}), true),
            (
                json!({"group_size": 64, "bits": 4,
                    "model.layers.0.mlp.gate": {"group_size": 32, "bits": 8, "mode": "mxfp8"}}),
                true,
            ),
        ] {
            let result = QuantConfig::from_value(&block);
            assert_eq!(result.is_err(), refused, "{block}");
            if let Err(error) = result {
                assert!(matches!(error, QuantError::Unsupported { .. }), "{error}");
            }
        }
        assert!(matches!(
            QuantConfig::from_value(&json!({"bits": 4})),
            Err(QuantError::Invalid(_))
        ));
    }
}
