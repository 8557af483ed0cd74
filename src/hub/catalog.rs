//! The curated models Ondo offers with one click: MLX 4-bit conversions from
//! mlx-community of architectures the engine runs.
//!
//! The sizes and parameter counts are approximate, from the published repos
//! and configs: they are for listing the models and judging whether one fits
//! before anything is downloaded. When online, the hub's file sizes replace
//! them; after download, the folder's config.json and weights do.

use serde::Serialize;

use crate::hub::fit::{KvDtype, ModelShape};

/// One model in the catalog, with what sizing needs from its config.json.
#[derive(Serialize, Clone, Debug)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CatalogEntry {
    /// Hugging Face repo id, `owner/name`.
    pub repo_id: &'static str,
    pub display_name: &'static str,
    /// The config's `model_type`.
    pub family: &'static str,
    /// Approximate parameter count.
    pub parameters: u64,
    /// How the weights are stored, e.g. "4-bit".
    pub quantization: &'static str,
    /// Approximate size on disk, in bytes.
    pub size_bytes: u64,
    /// The trained context (`max_position_embeddings`), in tokens.
    pub context_length: u64,
    pub num_hidden_layers: u64,
    pub num_key_value_heads: u64,
    pub head_dim: u64,
    pub hidden_size: u64,
    /// One line for the user: what the model is good for.
    pub note: &'static str,
}

/// The model offered when the user has not picked one; first in the catalog.
pub const DEFAULT_MODEL: &str = "mlx-community/Llama-3.2-3B-Instruct-4bit";

static CATALOG: [CatalogEntry; 9] = [
    CatalogEntry {
        repo_id: DEFAULT_MODEL,
        display_name: "Llama 3.2 3B Instruct",
        family: "llama",
        parameters: 3_210_000_000,
        quantization: "4-bit",
        size_bytes: 1_800_000_000,
        context_length: 131_072,
        num_hidden_layers: 28,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 3072,
        note: "Quick and capable at chat and summaries; a good first model.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Llama-3.2-1B-Instruct-4bit",
        display_name: "Llama 3.2 1B Instruct",
        family: "llama",
        parameters: 1_240_000_000,
        quantization: "4-bit",
        size_bytes: 700_000_000,
        context_length: 131_072,
        num_hidden_layers: 16,
        num_key_value_heads: 8,
        head_dim: 64,
        hidden_size: 2048,
        note: "Very small and fast on any Mac; best for simple tasks.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-0.6B-4bit",
        display_name: "Qwen3 0.6B",
        family: "qwen3",
        parameters: 600_000_000,
        quantization: "4-bit",
        size_bytes: 340_000_000,
        context_length: 40_960,
        num_hidden_layers: 28,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 1024,
        note: "Tiny and very fast; for trying Ondo out rather than for answers you rely on.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-1.7B-4bit",
        display_name: "Qwen3 1.7B",
        family: "qwen3",
        parameters: 1_700_000_000,
        quantization: "4-bit",
        size_bytes: 970_000_000,
        context_length: 40_960,
        num_hidden_layers: 28,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 2048,
        note: "Small and quick; thinks step by step before it answers.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-4B-4bit",
        display_name: "Qwen3 4B",
        family: "qwen3",
        parameters: 4_000_000_000,
        quantization: "4-bit",
        size_bytes: 2_300_000_000,
        context_length: 40_960,
        num_hidden_layers: 36,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 2560,
        note: "Strong for its size at reasoning and code; thinks before it answers.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-8B-4bit",
        display_name: "Qwen3 8B",
        family: "qwen3",
        parameters: 8_200_000_000,
        quantization: "4-bit",
        size_bytes: 4_600_000_000,
        context_length: 40_960,
        num_hidden_layers: 36,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 4096,
        note: "The strongest reasoner here; best on a Mac with 16 GB or more.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
        display_name: "Llama 3.1 8B Instruct",
        family: "llama",
        parameters: 8_030_000_000,
        quantization: "4-bit",
        size_bytes: 4_500_000_000,
        context_length: 131_072,
        num_hidden_layers: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 4096,
        note: "A capable all-rounder for long documents; best on a Mac with 16 GB or more.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
        display_name: "Mistral 7B Instruct v0.3",
        family: "mistral",
        parameters: 7_250_000_000,
        quantization: "4-bit",
        size_bytes: 4_100_000_000,
        context_length: 32_768,
        num_hidden_layers: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        hidden_size: 4096,
        note: "A widely used general chat model; best on a Mac with 16 GB or more.",
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen2.5-7B-Instruct-4bit",
        display_name: "Qwen2.5 7B Instruct",
        family: "qwen2",
        parameters: 7_620_000_000,
        quantization: "4-bit",
        size_bytes: 4_300_000_000,
        context_length: 32_768,
        num_hidden_layers: 28,
        num_key_value_heads: 4,
        head_dim: 128,
        hidden_size: 3584,
        note: "Good at code and structured output, with a small KV cache for its size.",
    },
];

/// Every catalog entry, the default first.
pub fn catalog() -> &'static [CatalogEntry] {
    &CATALOG
}

/// The entry for `repo_id`, ignoring case as the hub does.
pub fn find(repo_id: &str) -> Option<&'static CatalogEntry> {
    CATALOG
        .iter()
        .find(|entry| entry.repo_id.eq_ignore_ascii_case(repo_id))
}

impl CatalogEntry {
    /// The shape for a fit estimate. All entries compute in bfloat16.
    pub fn shape(&self) -> ModelShape {
        ModelShape {
            num_hidden_layers: self.num_hidden_layers,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            hidden_size: self.hidden_size,
            max_position_embeddings: Some(self.context_length),
            kv_dtype: KvDtype::BF16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::SUPPORTED_MODEL_TYPES;
    use crate::hub::fit::{FitInput, Verdict, estimate_fit};

    /// The hub's rule for a repo name: letters, digits, `-`, `_` and `.`, at
    /// most 96 characters, no `--` or `..`, not starting or ending in `-`/`.`.
    fn is_valid_repo_name(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 96
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !name.contains("--")
            && !name.contains("..")
            && !name.starts_with(['-', '.'])
            && !name.ends_with(['-', '.'])
    }

    #[test]
    fn default_model_is_first() {
        assert_eq!(catalog()[0].repo_id, DEFAULT_MODEL);
        assert_eq!(find(DEFAULT_MODEL).map(|e| e.repo_id), Some(DEFAULT_MODEL));
    }

    #[test]
    fn every_repo_id_is_a_valid_unique_mlx_community_id() {
        for (i, entry) in catalog().iter().enumerate() {
            let name = entry.repo_id.strip_prefix("mlx-community/");
            assert!(
                name.is_some_and(is_valid_repo_name),
                "{} is not a valid mlx-community repo id",
                entry.repo_id
            );
            assert!(
                !catalog()[..i]
                    .iter()
                    .any(|earlier| earlier.repo_id.eq_ignore_ascii_case(entry.repo_id)),
                "{} is listed twice",
                entry.repo_id
            );
        }
    }

    #[test]
    fn every_entry_is_an_architecture_the_engine_runs() {
        for entry in catalog() {
            assert!(
                SUPPORTED_MODEL_TYPES.contains(&entry.family),
                "{}: model_type {} is not supported",
                entry.repo_id,
                entry.family
            );
        }
    }

    #[test]
    fn sizes_agree_with_4_bit_parameter_counts() {
        // 4 bits plus a 16-bit scale and bias per 64 weights is 0.5625 bytes
        // per parameter; a typo in either number leaves this range.
        for entry in catalog() {
            let bytes_per_parameter = entry.size_bytes as f64 / entry.parameters as f64;
            assert!(
                (0.5..0.65).contains(&bytes_per_parameter),
                "{}: {bytes_per_parameter:.3} bytes per parameter",
                entry.repo_id
            );
            assert!(entry.quantization == "4-bit" && !entry.note.is_empty());
        }
    }

    #[test]
    fn find_ignores_case() {
        let entry = find("MLX-Community/qwen3-0.6b-4BIT").unwrap();
        assert_eq!(entry.repo_id, "mlx-community/Qwen3-0.6B-4bit");
        assert!(find("mlx-community/Qwen3-0.6B").is_none());
        assert!(find("").is_none());
    }

    #[test]
    fn fit_estimate_of_the_default_at_4096_tokens() {
        let entry = find(DEFAULT_MODEL).unwrap();
        let estimate = estimate_fit(&FitInput {
            weights_bytes: entry.size_bytes,
            shape: entry.shape(),
            context_tokens: 4096,
            available_bytes: 8 << 30,
            total_bytes: 16 << 30,
            working_set_bytes: None,
        });
        // 28 layers * 8 KV heads * 128 * K and V * 2 bytes * 4096 tokens.
        assert_eq!(estimate.kv_bytes_per_token, 114_688);
        assert_eq!(estimate.kv_cache_bytes, 469_762_048);
        // 1.8e9 + KV + 256 MiB + 2048 * 3072 * 4 * 8.
        assert_eq!(estimate.needed_bytes, 2_739_524_096);
        assert_eq!(estimate.verdict, Verdict::Fits);
        // (8 GiB - 1.8e9 - overhead) / 114,688 = 55,105.6 tokens, down to a
        // whole 256-token cache step.
        assert_eq!(estimate.max_context_that_fits, Some(55_040));
    }

    #[test]
    fn qwen2_5_7b_has_half_the_kv_heads() {
        let entry = find("mlx-community/Qwen2.5-7B-Instruct-4bit").unwrap();
        // 28 * 4 * 128 * 2 * 2
        assert_eq!(entry.shape().kv_bytes_per_token(), 57_344);
    }
}
