//! The curated models Ondo offers with one click: MLX conversions from
//! mlx-community, each with the config.json values sizing reads.
//!
//! The sizes and parameter counts are approximate, from the published repos
//! and configs: they are for listing the models and judging whether one fits
//! before anything is downloaded. When online, the hub's file sizes replace
//! them; after download, the folder's config.json and weights do. An entry
//! whose architecture the engine does not run yet is listed with that reason
//! and cannot be downloaded (`hub::architecture`).

use serde::Serialize;

use crate::hub::fit::{FitError, ModelShape};

/// One model in the catalog, with the config.json sizing needs.
#[derive(Serialize, Clone, Debug)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CatalogEntry {
    /// Hugging Face repo id, `owner/name`.
    pub repo_id: &'static str,
    pub display_name: &'static str,
    /// The config's top-level `model_type`.
    pub family: &'static str,
    /// Approximate parameter count, as the model's publisher gives it.
    pub parameters: u64,
    /// How the weights are stored, e.g. "4-bit".
    pub quantization: &'static str,
    /// Approximate size on disk, in bytes.
    pub size_bytes: u64,
    /// One line for the user: what the model is good for.
    pub note: &'static str,
    /// The keys of the repo's config.json that its family's description
    /// reads (`crate::family`), with the published values: sizing settles
    /// them as the engine would.
    #[serde(skip)]
    pub config: &'static str,
}

/// The model offered when the user has not picked one; first in the catalog.
pub const DEFAULT_MODEL: &str = "mlx-community/Llama-3.2-3B-Instruct-4bit";

static CATALOG: [CatalogEntry; 22] = [
    CatalogEntry {
        repo_id: DEFAULT_MODEL,
        display_name: "Llama 3.2 3B Instruct",
        family: "llama",
        parameters: 3_210_000_000,
        quantization: "4-bit",
        size_bytes: 1_800_000_000,
        note: "Quick and capable at chat and summaries; a good first model.",
        config: r#"{"model_type": "llama", "hidden_size": 3072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "num_hidden_layers": 28,
            "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": true,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Llama-3.2-1B-Instruct-4bit",
        display_name: "Llama 3.2 1B Instruct",
        family: "llama",
        parameters: 1_240_000_000,
        quantization: "4-bit",
        size_bytes: 700_000_000,
        note: "Very small and fast on any Mac; best for simple tasks.",
        config: r#"{"model_type": "llama", "hidden_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": true,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-0.6B-4bit",
        display_name: "Qwen3 0.6B",
        family: "qwen3",
        parameters: 600_000_000,
        quantization: "4-bit",
        size_bytes: 340_000_000,
        note: "Tiny and very fast; for trying Ondo out rather than for answers you rely on.",
        config: r#"{"model_type": "qwen3", "hidden_size": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": true,
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-1.7B-4bit",
        display_name: "Qwen3 1.7B",
        family: "qwen3",
        parameters: 1_700_000_000,
        quantization: "4-bit",
        size_bytes: 970_000_000,
        note: "Small and quick; thinks step by step before it answers.",
        config: r#"{"model_type": "qwen3", "hidden_size": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 6144, "vocab_size": 151936, "tie_word_embeddings": true,
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-4B-4bit",
        display_name: "Qwen3 4B",
        family: "qwen3",
        parameters: 4_000_000_000,
        quantization: "4-bit",
        size_bytes: 2_300_000_000,
        note: "Strong for its size at reasoning and code; thinks before it answers.",
        config: r#"{"model_type": "qwen3", "hidden_size": 2560, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 9728, "vocab_size": 151936, "tie_word_embeddings": true,
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-8B-4bit",
        display_name: "Qwen3 8B",
        family: "qwen3",
        parameters: 8_200_000_000,
        quantization: "4-bit",
        size_bytes: 4_600_000_000,
        note: "The strongest dense reasoner here; best on a Mac with 16 GB or more.",
        config: r#"{"model_type": "qwen3", "hidden_size": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "vocab_size": 151936, "tie_word_embeddings": false,
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
        display_name: "Llama 3.1 8B Instruct",
        family: "llama",
        parameters: 8_030_000_000,
        quantization: "4-bit",
        size_bytes: 4_500_000_000,
        note: "A capable all-rounder for long documents; best on a Mac with 16 GB or more.",
        config: r#"{"model_type": "llama", "hidden_size": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": false,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
        display_name: "Mistral 7B Instruct v0.3",
        family: "mistral",
        parameters: 7_250_000_000,
        quantization: "4-bit",
        size_bytes: 4_100_000_000,
        note: "A widely used general chat model; best on a Mac with 16 GB or more.",
        config: r#"{"model_type": "mistral", "hidden_size": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 14336, "vocab_size": 32768, "tie_word_embeddings": false,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}"#,
    },
    CatalogEntry {
        repo_id: "mlx-community/Qwen2.5-7B-Instruct-4bit",
        display_name: "Qwen2.5 7B Instruct",
        family: "qwen2",
        parameters: 7_620_000_000,
        quantization: "4-bit",
        size_bytes: 4_300_000_000,
        note: "Good at code and structured output, with a small KV cache for its size.",
        config: r#"{"model_type": "qwen2", "hidden_size": 3584, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
            "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": false,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}"#,
    },
    // Gemma 3 1B: every sixth layer is global, the other 22 of 26 keep the
    // latest 512 positions. The size is worked out from the parameter count
    // at 4.5 bits a weight, not read from the repo.
    CatalogEntry {
        repo_id: "mlx-community/gemma-3-1b-it-4bit",
        display_name: "Gemma 3 1B",
        family: "gemma3_text",
        parameters: 1_000_000_000,
        quantization: "4-bit",
        size_bytes: 563_000_000,
        note: "Google's smallest Gemma 3: fast, and light on memory in long chats, since most of its layers look back 512 tokens. Its size here is an estimate.",
        config: r#"{"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
            "intermediate_size": 6912, "vocab_size": 262144,
            "sliding_window": 512, "sliding_window_pattern": 6,
            "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}"#,
    },
    // Gemma 3 4B is a multimodal checkpoint (`gemma3`): the text model's
    // config is `text_config`, which names only what differs from the
    // defaults (8 heads, 4 KV heads, head_dim 256, a window pattern of 6).
    // The weights include the vision tower, which the engine skips; whether
    // the conversion quantized it is not known here, so the size is approximate.
    CatalogEntry {
        repo_id: "mlx-community/gemma-3-4b-it-4bit",
        display_name: "Gemma 3 4B",
        family: "gemma3",
        parameters: 4_300_000_000,
        quantization: "4-bit",
        size_bytes: 2_700_000_000,
        note: "Gemma 3 4B's text model (the checkpoint's image part is not used): good at writing and many languages. Its size here is approximate (±0.3 GB).",
        config: r#"{"model_type": "gemma3", "torch_dtype": "bfloat16",
            "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                "intermediate_size": 10240, "num_hidden_layers": 34, "sliding_window": 1024,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                "num_hidden_layers": 27}}"#,
    },
    // Qwen3 30B-A3B: 128 experts in each of 48 layers, 8 picked per token.
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-30B-A3B-4bit",
        display_name: "Qwen3 30B-A3B",
        family: "qwen3_moe",
        parameters: 30_500_000_000,
        quantization: "4-bit",
        size_bytes: 17_200_000_000,
        note: "A mixture of experts: answers at about the speed of a 3B model with the knowledge of a 30B one; needs a Mac with 32 GB or more.",
        config: r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "norm_topk_prob": true, "num_hidden_layers": 48,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
            "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "vocab_size": 151936, "tie_word_embeddings": false,
            "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}"#,
    },
    // gpt-oss 20B: the experts in mxfp4 (4.25 bits a weight), the rest in
    // 8-bit affine; half the layers slide over 128 positions.
    CatalogEntry {
        repo_id: "mlx-community/gpt-oss-20b-MXFP4-Q8",
        display_name: "gpt-oss 20B",
        family: "gpt_oss",
        parameters: 20_900_000_000,
        quantization: "mxfp4 experts, 8-bit",
        size_bytes: 12_100_000_000,
        note: "OpenAI's open-weight reasoning model, a mixture of experts; best on a Mac with 24 GB or more.",
        config: r#"{"model_type": "gpt_oss", "hidden_size": 2880, "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "num_hidden_layers": 24,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
            "vocab_size": 201088, "tie_word_embeddings": false, "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention", "sliding_attention", "full_attention",
                "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}"#,
    },
    // Phi-4-mini: head_dim is not in its config (3072 / 24 = 128).
    CatalogEntry {
        repo_id: "mlx-community/Phi-4-mini-instruct-4bit",
        display_name: "Phi-4 mini Instruct",
        family: "phi3",
        parameters: 3_840_000_000,
        quantization: "4-bit",
        size_bytes: 2_160_000_000,
        note: "Microsoft's small model, strong at reasoning and math for its size, with a 128K context.",
        config: r#"{"model_type": "phi3", "hidden_size": 3072, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "num_hidden_layers": 32,
            "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192,
            "vocab_size": 200064, "tie_word_embeddings": true, "partial_rotary_factor": 0.75,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "torch_dtype": "bfloat16"}"#,
    },
    // SmolLM3 3B: every fourth layer rotates nothing (`no_rope_layers`).
    // The size is worked out from the parameter count at 4.5 bits a
    // weight, not read from the repo.
    CatalogEntry {
        repo_id: "mlx-community/SmolLM3-3B-4bit",
        display_name: "SmolLM3 3B",
        family: "smollm3",
        parameters: 3_080_000_000,
        quantization: "4-bit",
        size_bytes: 1_740_000_000,
        note: "Hugging Face's fully open small model: reasons step by step when asked, or answers directly; six European languages. Its size here is an estimate.",
        config: r#"{"model_type": "smollm3", "hidden_size": 2048, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 11008,
            "vocab_size": 128256, "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
            "no_rope_layer_interval": 4,
            "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0,
                1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0],
            "rope_scaling": null, "use_sliding_window": false, "sliding_window": null,
            "max_position_embeddings": 65536, "torch_dtype": "bfloat16"}"#,
    },
    // Ministral 3 3B is a multimodal checkpoint (`mistral3`): the text model
    // is `text_config` (`ministral3`), its rope and query scale under
    // `rope_parameters`. The published count includes the vision encoder
    // (about 0.4B); how the conversion stored it is not known here, so the
    // size is approximate.
    CatalogEntry {
        repo_id: "mlx-community/Ministral-3-3B-Instruct-2512-4bit",
        display_name: "Ministral 3 3B Instruct",
        family: "mistral3",
        parameters: 3_850_000_000,
        quantization: "4-bit",
        size_bytes: 2_300_000_000,
        note: "Mistral's small model, with a long context: Ministral 3 3B's text model (the checkpoint's image part is not used). Its size here is approximate.",
        config: r#"{"model_type": "mistral3", "torch_dtype": "bfloat16",
            "text_config": {"model_type": "ministral3", "hidden_size": 3072, "intermediate_size": 9216,
                "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 128, "vocab_size": 131072, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 262144, "sliding_window": null,
                "tie_word_embeddings": true,
                "rope_parameters": {"type": "yarn", "rope_type": "yarn", "rope_theta": 1000000.0,
                    "factor": 16.0, "original_max_position_embeddings": 16384,
                    "max_position_embeddings": 262144, "beta_fast": 32.0, "beta_slow": 1.0,
                    "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}},
            "vision_config": {"model_type": "pixtral", "hidden_size": 1024, "num_hidden_layers": 24}}"#,
    },
    // LFM2-1.2B: ten short-convolution layers and six attention layers
    // (`full_attn_idxs`); the MLP is block_ff_dim cut to two thirds (8192).
    CatalogEntry {
        repo_id: "mlx-community/LFM2-1.2B-4bit",
        display_name: "LFM2 1.2B",
        family: "lfm2",
        parameters: 1_170_000_000,
        quantization: "4-bit",
        size_bytes: 660_000_000,
        note: "Liquid AI's small hybrid model: quick on any Mac, and its cache grows in only 6 of its 16 layers.",
        config: r#"{"model_type": "lfm2", "architectures": ["Lfm2ForCausalLM"], "hidden_size": 2048,
            "num_hidden_layers": 16, "num_attention_heads": 32, "num_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 65536, "max_position_embeddings": 128000,
            "norm_eps": 1e-5, "block_norm_eps": 1e-5, "conv_bias": false, "conv_L_cache": 3,
            "conv_dim": 2048, "conv_dim_out": 2048, "block_dim": 2048, "block_ff_dim": 12288,
            "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": true, "block_use_swiglu": true,
            "full_attn_idxs": [2, 5, 8, 10, 12, 14], "rope_theta": 1000000.0,
            "theta": 1000000.0, "use_pos_enc": true, "tie_embedding": true,
            "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
            "torch_dtype": "bfloat16"}"#,
    },
    // Qwen3.5-2B: 18 gated DeltaNet layers and 6 gated attention layers
    // (every fourth); the parameters are the text model's (the published
    // count includes the vision tower, which Ondo does not load).
    CatalogEntry {
        repo_id: "mlx-community/Qwen3.5-2B-4bit",
        display_name: "Qwen3.5 2B",
        family: "qwen3_5",
        parameters: 1_880_000_000,
        quantization: "4-bit",
        size_bytes: 1_100_000_000,
        note: "Qwen's small hybrid model: thinks before it answers, and its cache grows in only 6 of its 24 layers.",
        config: r#"{"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 2048,
                "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 8,
                "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320,
                "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "tie_word_embeddings": true, "attention_bias": false,
                "linear_num_key_heads": 16, "linear_num_value_heads": 16,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": true},
                "torch_dtype": "bfloat16"},
            "vision_config": {"model_type": "qwen3_5", "depth": 24},
            "tie_word_embeddings": true}"#,
    },
    // Qwen3.5-35B-A3B: 30 gated DeltaNet layers and 10 gated attention
    // layers; 256 experts of which 8 work on each token, beside a shared
    // one, in every layer.
    CatalogEntry {
        repo_id: "mlx-community/Qwen3.5-35B-A3B-4bit",
        display_name: "Qwen3.5 35B-A3B",
        family: "qwen3_5_moe",
        parameters: 34_700_000_000,
        quantization: "4-bit",
        size_bytes: 19_800_000_000,
        note: "Qwen's hybrid mixture of experts: the speed of a 3B model with the knowledge of a 35B one, and a cache that grows in a quarter of its layers; needs a Mac with 32 GB or more.",
        config: r#"{"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 2048,
                "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
                "head_dim": 256, "vocab_size": 248320, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 262144, "tie_word_embeddings": false,
                "attention_bias": false, "num_experts": 256, "num_experts_per_tok": 8,
                "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                "norm_topk_prob": true, "linear_num_key_heads": 16,
                "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                "full_attention_interval": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                    "mrope_interleaved": true},
                "torch_dtype": "bfloat16"},
            "vision_config": {"model_type": "qwen3_5_moe", "depth": 27},
            "tie_word_embeddings": false}"#,
    },
    // Qwen3-Next-80B-A3B: 36 gated DeltaNet layers and 12 gated attention
    // layers; 512 experts of which 10 work on each token, beside a shared
    // one, in every layer.
    CatalogEntry {
        repo_id: "mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit",
        display_name: "Qwen3-Next 80B-A3B Instruct",
        family: "qwen3_next",
        parameters: 80_000_000_000,
        quantization: "4-bit",
        size_bytes: 44_800_000_000,
        note: "An 80B mixture that decodes like a 3B model, with a cache that grows in only a quarter of its layers; for long documents on a Mac with 64 GB or more.",
        config: r#"{"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
            "attention_bias": false, "decoder_sparse_step": 1, "full_attention_interval": 4,
            "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5120,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": 32, "linear_value_head_dim": 128,
            "max_position_embeddings": 262144, "mlp_only_layers": [], "moe_intermediate_size": 512,
            "norm_topk_prob": true, "num_attention_heads": 16, "num_experts": 512,
            "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
            "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6, "rope_scaling": null,
            "rope_theta": 10000000, "shared_expert_intermediate_size": 512,
            "tie_word_embeddings": false, "vocab_size": 151936, "torch_dtype": "bfloat16"}"#,
    },
    // GLM-4.5-Air: 46 layers, the first dense; 128 experts of which 8 work
    // on each token beside a shared one; the prediction layer after the
    // last is not loaded.
    CatalogEntry {
        repo_id: "mlx-community/GLM-4.5-Air-4bit",
        display_name: "GLM-4.5-Air",
        family: "glm4_moe",
        parameters: 106_000_000_000,
        quantization: "4-bit",
        size_bytes: 60_500_000_000,
        note: "Z.ai's agentic mixture (12B of its 106B work on each token): strong at tools and code; needs a Mac with 96 GB or more.",
        config: r#"{"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"],
            "attention_bias": true, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
            "partial_rotary_factor": 0.5, "intermediate_size": 10944,
            "max_position_embeddings": 131072, "moe_intermediate_size": 1408,
            "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
            "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
            "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_scaling": null,
            "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
            "use_qk_norm": false, "vocab_size": 151552, "torch_dtype": "bfloat16"}"#,
    },
    // Gemma 4 E2B: 35 layers, four sliding (512 positions) to one full;
    // the last 20 read the keys and values of earlier layers and keep no
    // cache; per-layer inputs from a second, small embedding per layer.
    CatalogEntry {
        repo_id: "mlx-community/gemma-4-e2b-it-4bit",
        display_name: "Gemma 4 E2B",
        family: "gemma4",
        parameters: 4_630_000_000,
        quantization: "4-bit",
        size_bytes: 2_900_000_000,
        note: "Google's small Gemma 4: the compute of a 2B model, most of its weights in per-layer embeddings, and a cache held by only 15 of its 35 layers; fits any Apple Silicon Mac.",
        config: r#"{"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
            "text_config": {"model_type": "gemma4_text", "hidden_size": 1536,
                "num_hidden_layers": 35, "intermediate_size": 6144, "num_attention_heads": 8,
                "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
                "num_global_key_value_heads": null, "attention_k_eq_v": false,
                "sliding_window": 512, "vocab_size": 262144,
                "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256,
                "num_kv_shared_layers": 20, "use_double_wide_mlp": true,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                "final_logit_softcapping": 30.0, "enable_moe_block": false, "num_experts": null,
                "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                "rope_parameters": {
                    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                        "rope_type": "proportional"},
                    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
                "tie_word_embeddings": true, "torch_dtype": "bfloat16"},
            "vision_config": {"model_type": "gemma4_vision"},
            "audio_config": {"model_type": "gemma4_audio"}}"#,
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
    /// The entry's config.json values, parsed.
    pub fn config(&self) -> serde_json::Value {
        serde_json::from_str(self.config).unwrap_or_default()
    }

    /// The shape for a fit estimate, read from the entry's config as a
    /// downloaded model's would be.
    pub fn shape(&self) -> Result<ModelShape, FitError> {
        ModelShape::from_config(&self.config(), None)
    }

    /// Why the engine cannot run this model yet; `None` when it can.
    pub fn unsupported(&self) -> Option<String> {
        super::architecture::unsupported_reason(Some(self.family))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn every_entry_says_whether_the_engine_runs_it() {
        let runnable = crate::family::model_types();
        for entry in catalog() {
            // The family is the config's model_type, which is what decides.
            assert_eq!(
                entry.config()["model_type"],
                entry.family,
                "{}: family and config disagree",
                entry.repo_id
            );
            match entry.unsupported() {
                None => assert!(runnable.contains(&entry.family), "{}", entry.repo_id),
                Some(reason) => {
                    assert!(!runnable.contains(&entry.family), "{}", entry.repo_id);
                    assert!(
                        reason.starts_with(&format!(
                            "not supported yet: model_type {} (Ondo runs: ",
                            entry.family
                        )),
                        "{reason}"
                    );
                }
            }
        }
        // The families Ondo has always run are never listed as unsupported.
        for entry in catalog().iter().filter(|e| e.quantization == "4-bit") {
            if ["llama", "mistral", "qwen2", "qwen3"].contains(&entry.family) {
                assert_eq!(entry.unsupported(), None, "{}", entry.repo_id);
            }
        }
    }

    #[test]
    fn every_config_is_sizable_and_its_parameters_match_the_published_count() {
        for entry in catalog() {
            let shape = entry
                .shape()
                .unwrap_or_else(|err| panic!("{}: {err}", entry.repo_id));
            let counted = shape.parameters.expect("vocab and MLP sizes are given") as f64;
            // Gemma 3 4B's and Ministral 3's published counts include the
            // vision tower (about 0.42B), which the text model's config does
            // not describe.
            let published = if ["gemma3", "mistral3"].contains(&entry.family) {
                entry.parameters as f64 - 420e6
            } else {
                entry.parameters as f64
            };
            let off = (counted / published - 1.0).abs();
            assert!(
                off < 0.03,
                "{}: config counts {counted:.3e} parameters, the entry says {published:.3e}",
                entry.repo_id
            );
        }
    }

    #[test]
    fn sizes_agree_with_parameter_counts() {
        // 4 bits plus a 16-bit scale and bias per 64 weights is 0.5625 bytes
        // per parameter (mxfp4 is 0.53, 8-bit 1.06); a typo in either number
        // leaves this range.
        for entry in catalog() {
            let bytes_per_parameter = entry.size_bytes as f64 / entry.parameters as f64;
            assert!(
                (0.5..0.65).contains(&bytes_per_parameter),
                "{}: {bytes_per_parameter:.3} bytes per parameter",
                entry.repo_id
            );
            assert!(!entry.quantization.is_empty() && !entry.note.is_empty());
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
            shape: entry.shape().unwrap(),
            context_tokens: 4096,
            available_bytes: 8 << 30,
            total_bytes: 16 << 30,
            working_set_bytes: None,
            kv_bits: None,
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
        assert_eq!(entry.shape().unwrap().kv_bytes_per_token(), 57_344);
    }

    fn estimate_at(repo_id: &str, context_tokens: u64) -> crate::hub::fit::FitEstimate {
        let entry = find(repo_id).unwrap();
        estimate_fit(&FitInput {
            weights_bytes: entry.size_bytes,
            shape: entry.shape().unwrap(),
            context_tokens,
            available_bytes: 64 << 30,
            total_bytes: 64 << 30,
            working_set_bytes: None,
            kv_bits: None,
        })
    }

    #[test]
    fn qwen3_30b_a3b_holds_all_experts_and_works_through_3_billion() {
        let estimate = estimate_at("mlx-community/Qwen3-30B-A3B-4bit", 4096);
        // Attention: 2 * 2048 * 128 * (32 + 4) = 18,874,368 per layer.
        // Experts: 128 * 3 * 2048 * 768 = 603,979,776 per layer, router
        // 2048 * 128 = 262,144, norms 2 * 2048 + 2 * 128 (q and k). Embeddings
        // and output: 2 * 151,936 * 2048; the final norm 2048.
        let per_layer = 18_874_368 + 603_979_776 + 262_144 + 4_352;
        let total = 48 * per_layer + 2 * 311_164_928 + 2048;
        assert_eq!(estimate.parameters, Some(total));
        assert_eq!(total, 30_532_122_624);
        // 120 experts of 4,718,592 idle in each of 48 layers.
        let active = total - 48 * 120 * 4_718_592;
        assert_eq!(estimate.active_parameters, Some(active));
        assert_eq!(active, 3_353_032_704);
        assert_eq!(
            estimate.experts_note.as_deref(),
            Some("all 128 experts stay in memory; 8 of them work on each token")
        );
        // Memory counts every expert: the weights are the whole 17.2 GB.
        assert_eq!(estimate.weights_bytes, 17_200_000_000);
        // 48 layers * 4 KV heads * 128 * K and V * 2 bytes, no window.
        assert_eq!(estimate.kv_bytes_per_token, 98_304);
        assert_eq!(estimate.kv_cache_bytes, 98_304 * 4096);
        assert_eq!(estimate.kv_cache_note, None);
    }

    #[test]
    fn gpt_oss_20b_slides_half_its_layers_over_128_positions() {
        let estimate = estimate_at("mlx-community/gpt-oss-20b-MXFP4-Q8", 4096);
        // 24 layers * 8 KV heads * 64 * 2 * 2 bytes = 49,152 B a token; at
        // 4096 tokens 12 full layers hold 4096 positions and 12 hold 128.
        assert_eq!(estimate.kv_bytes_per_token, 49_152);
        assert_eq!(estimate.kv_cache_bytes, 2048 * (12 * 4096 + 12 * 128));
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("12 of 24 layers keep at most 128 positions")
        );
        // Every layer's MLP is 32 experts of 3 * 2880 * 2880; 4 work per token.
        // Each layer also has two norms, biases on q, k, v and o, a sink per
        // head, and biases on the router and every expert's projections.
        let expert = 3 * 2880 * 2880;
        let extras = 2 * 2880 + (64 * 64 + 2 * 8 * 64 + 2880) + 64 + 32 + 3 * 32 * 2880;
        let total = 201_088 * 2880 * 2
            + 24 * (2 * 2880 * 64 * 72 + 32 * expert + 2880 * 32 + extras)
            + 2880;
        assert_eq!(estimate.parameters, Some(total));
        assert_eq!(estimate.active_parameters, Some(total - 24 * 28 * expert));
    }

    #[test]
    fn gemma_3_keeps_one_layer_in_six_global() {
        // 1B: layers 5, 11, 17 and 23 are global; 22 keep 512 positions.
        // 1 KV head * 256 * 2 * 2 bytes = 1,024 B per layer and position.
        let estimate = estimate_at("mlx-community/gemma-3-1b-it-4bit", 8192);
        assert_eq!(estimate.kv_bytes_per_token, 26 * 1024);
        assert_eq!(estimate.kv_cache_bytes, 1024 * (4 * 8192 + 22 * 512));
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("22 of 26 layers keep at most 512 positions")
        );
        assert_eq!(estimate.active_parameters, None);
        // 4B, read from text_config with the multimodal defaults: 4 KV
        // heads, head_dim 256; 5 of 34 layers global, 29 keep 1024.
        let estimate = estimate_at("mlx-community/gemma-3-4b-it-4bit", 8192);
        assert_eq!(estimate.kv_bytes_per_token, 34 * 4096);
        assert_eq!(estimate.kv_cache_bytes, 4096 * (5 * 8192 + 29 * 1024));
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("29 of 34 layers keep at most 1024 positions")
        );
        // Below the window every layer still grows: 300 tokens take 512.
        let estimate = estimate_at("mlx-community/gemma-3-4b-it-4bit", 300);
        assert_eq!(estimate.kv_cache_bytes, 4096 * 34 * 512);
    }

    #[test]
    fn lfm2_keeps_a_constant_state_in_ten_of_its_sixteen_layers() {
        let estimate = estimate_at("mlx-community/LFM2-1.2B-4bit", 4096);
        // Six attention layers * 8 KV heads * 64 * K and V * 2 bytes.
        assert_eq!(estimate.kv_bytes_per_token, 6 * 2048);
        // Ten convolution layers keep 2 inputs of 2048 channels in bf16.
        assert_eq!(estimate.kv_cache_bytes, 6 * 2048 * 4096 + 10 * 8192);
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("10 of 16 layers keep a state of 8 KiB whatever the context")
        );
        // Embeddings 65536 * 2048; a convolution layer's in_proj, out_proj,
        // kernel and two norms; an attention layer's q, k, v, o and four
        // norms; every layer's MLP of 8192; the final norm.
        let mlp = 3 * 2048 * 8192;
        let conv = 4 * 2048 * 2048 + 3 * 2048 + 2 * 2048 + mlp;
        let attention = 2 * 2048 * 2048 + 2 * 512 * 2048 + 2 * 2048 + 2 * 64 + mlp;
        let total = 65536 * 2048 + 10 * conv + 6 * attention + 2048;
        assert_eq!(estimate.parameters, Some(total));
        assert_eq!(total, 1_170_340_608);
    }

    #[test]
    fn qwen3_5_keeps_a_constant_state_in_three_of_every_four_layers() {
        let estimate = estimate_at("mlx-community/Qwen3.5-2B-4bit", 4096);
        // Six attention layers * 2 KV heads * 256 * K and V * 2 bytes.
        assert_eq!(estimate.kv_bytes_per_token, 6 * 2048);
        // Eighteen gated DeltaNet layers keep 3 convolution inputs of 6144
        // channels in bf16 and a float32 matrix of 16 heads x 128 x 128.
        let state = 3 * 6144 * 2 + 16 * 128 * 128 * 4;
        assert_eq!(estimate.kv_cache_bytes, 6 * 2048 * 4096 + 18 * state);
        assert_eq!(
            estimate.kv_cache_note.as_deref(),
            Some("18 of 24 layers keep a state of 1060 KiB whatever the context")
        );
    }
}
