//! Model shapes `ondo synth` can write: small ones for tests and benchmarks on
//! any machine, and the real Llama 3.2 shapes for the GPU and the Mac. A
//! family's recipe (`crate::family::synth`) adjusts them to its conventions.

use serde::Serialize;

pub use crate::family::synth::{ExpertShape, Llama3RopeScaling, Shape};

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
