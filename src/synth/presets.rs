//! Model shapes `ondo synth` can write: small ones for tests and benchmarks on
//! any machine, and the real Llama 3.2 shapes for the GPU and the Mac.

use serde::Serialize;

/// Which `model_type` the folder declares (and which weight names it has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3 with routed experts (see `ExpertShape`).
    #[value(name = "qwen3_moe", alias = "qwen3-moe")]
    #[serde(rename = "qwen3_moe")]
    Qwen3Moe,
    /// gpt-oss: attention sinks, alternating sliding windows, yarn rope,
    /// experts with biases and a clamped SwiGLU.
    #[value(name = "gpt_oss", alias = "gpt-oss")]
    #[serde(rename = "gpt_oss")]
    GptOss,
    /// Gemma 3's text model (`gemma3_text`).
    #[value(name = "gemma3_text")]
    #[serde(rename = "gemma3_text")]
    Gemma3Text,
    /// A multimodal Gemma 3 checkpoint (`gemma3`): the text model under
    /// `language_model.` beside a token vision tower Ondo skips.
    Gemma3,
    Phi3,
}

impl Arch {
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::GptOss => "gpt_oss",
            Arch::Gemma3Text => "gemma3_text",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    /// `architectures[0]` of config.json, as transformers names the class.
    pub fn class_name(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Qwen3Moe => "Qwen3MoeForCausalLM",
            Arch::GptOss => "GptOssForCausalLM",
            Arch::Gemma3Text => "Gemma3ForCausalLM",
            Arch::Gemma3 => "Gemma3ForConditionalGeneration",
            Arch::Phi3 => "Phi3ForCausalLM",
        }
    }

    /// Gemma 3, text-only or multimodal.
    pub fn is_gemma3(self) -> bool {
        matches!(self, Arch::Gemma3Text | Arch::Gemma3)
    }

    /// Where the text model's tensors are named from.
    pub fn weight_root(self) -> &'static str {
        match self {
            Arch::Gemma3 => "language_model.",
            _ => "",
        }
    }
}

/// Floating-point type of the unquantized weights (and of scales and biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// The name `config.json` uses (`torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::F32 => "float32",
            WeightDtype::Bf16 => "bfloat16",
            WeightDtype::F16 => "float16",
        }
    }

    pub fn to_mlx(self) -> mlx_rs::Dtype {
        match self {
            WeightDtype::F32 => mlx_rs::Dtype::Float32,
            WeightDtype::Bf16 => mlx_rs::Dtype::Bfloat16,
            WeightDtype::F16 => mlx_rs::Dtype::Float16,
        }
    }
}

/// Llama 3's rope scaling (`rope_type: llama3`) as its config writes it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: u32,
}

/// The routed experts of a mixture-of-experts model, in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ExpertShape {
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Width of each expert's SwiGLU.
    pub moe_intermediate_size: usize,
}

impl ExpertShape {
    /// 8 experts, 2 per token, each half as wide as the dense MLP: a token
    /// computes as much as in the dense model of the same shape, while
    /// four times the MLP weights stay resident.
    pub fn eight_choose_two(shape: &Shape) -> Self {
        Self {
            num_experts: 8,
            experts_per_token: 2,
            moe_intermediate_size: shape.intermediate_size / 2,
        }
    }
}

/// The shape of a model: everything `config.json` says about its tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Rows of the embedding; may exceed the tokenizer's vocabulary, as in
    /// real checkpoints.
    pub vocab_size: usize,
    /// Tokens the synthetic BPE tokenizer learns (specials included).
    pub tokenizer_vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    /// Routed experts in place of the dense MLP; `None` for dense models.
    pub experts: Option<ExpertShape>,
}

/// A named preset with the weight format it is usually found in.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub about: &'static str,
    pub shape: Shape,
    /// `None` means unquantized.
    pub default_bits: Option<u8>,
    pub default_dtype: WeightDtype,
}

/// Every preset, in the order `--help` lists them.
pub fn all() -> Vec<Preset> {
    let llama3_scaling = Some(Llama3RopeScaling {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    });
    vec![
        Preset {
            name: "tiny",
            about: "2 layers, hidden 256, vocab 2k: tests and CPU benchmarks (fp32)",
            shape: Shape {
                hidden_size: 256,
                intermediate_size: 512,
                num_hidden_layers: 2,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 64,
                vocab_size: 2048,
                tokenizer_vocab_size: 2048,
                max_position_embeddings: 4096,
                rope_theta: 10000.0,
                rope_scaling: None,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                experts: None,
            },
            default_bits: None,
            default_dtype: WeightDtype::F32,
        },
        Preset {
            name: "small",
            about: "8 layers, hidden 1024, vocab 8k: benchmarks where weights dominate (fp32)",
            shape: Shape {
                hidden_size: 1024,
                intermediate_size: 2816,
                num_hidden_layers: 8,
                num_attention_heads: 16,
                num_key_value_heads: 4,
                head_dim: 64,
                vocab_size: 8192,
                tokenizer_vocab_size: 8192,
                max_position_embeddings: 8192,
                rope_theta: 10000.0,
                rope_scaling: None,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                experts: None,
            },
            default_bits: None,
            default_dtype: WeightDtype::F32,
        },
        Preset {
            name: "llama-3.2-1b",
            about: "the real Llama 3.2 1B shape, 4-bit like mlx-community's (GPU or Mac)",
            shape: Shape {
                hidden_size: 2048,
                intermediate_size: 8192,
                num_hidden_layers: 16,
                num_attention_heads: 32,
                num_key_value_heads: 8,
                head_dim: 64,
                vocab_size: 128_256,
                tokenizer_vocab_size: 8192,
                max_position_embeddings: 131_072,
                rope_theta: 500_000.0,
                rope_scaling: llama3_scaling,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                experts: None,
            },
            default_bits: Some(4),
            default_dtype: WeightDtype::Bf16,
        },
        Preset {
            name: "llama-3.2-3b",
            about: "the real Llama 3.2 3B shape (the catalog default), 4-bit (GPU or Mac)",
            shape: Shape {
                hidden_size: 3072,
                intermediate_size: 8192,
                num_hidden_layers: 28,
                num_attention_heads: 24,
                num_key_value_heads: 8,
                head_dim: 128,
                vocab_size: 128_256,
                tokenizer_vocab_size: 8192,
                max_position_embeddings: 131_072,
                rope_theta: 500_000.0,
                rope_scaling: llama3_scaling,
                rms_norm_eps: 1e-5,
                tie_word_embeddings: true,
                experts: None,
            },
            default_bits: Some(4),
            default_dtype: WeightDtype::Bf16,
        },
        Preset {
            name: "llama-3.1-8b",
            about: "the real Llama 3.1 8B shape (untied head), 4-bit (GPU or Mac)",
            shape: Shape {
                hidden_size: 4096,
                intermediate_size: 14_336,
                num_hidden_layers: 32,
                num_attention_heads: 32,
                num_key_value_heads: 8,
                head_dim: 128,
                vocab_size: 128_256,
                tokenizer_vocab_size: 8192,
                max_position_embeddings: 131_072,
                rope_theta: 500_000.0,
                // Llama 3.1 stretches its 8k training context eightfold;
                // 3.2 (above) thirty-two-fold.
                rope_scaling: Some(Llama3RopeScaling {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }),
                rms_norm_eps: 1e-5,
                tie_word_embeddings: false,
                experts: None,
            },
            default_bits: Some(4),
            default_dtype: WeightDtype::Bf16,
        },
    ]
}

/// Looks a preset up by name.
pub fn find(name: &str) -> Option<Preset> {
    all().into_iter().find(|p| p.name == name)
}

/// The preset names, for error messages and `--help`.
pub fn names() -> Vec<&'static str> {
    all().iter().map(|p| p.name).collect()
}
