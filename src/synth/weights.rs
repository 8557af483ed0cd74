//! The tensors of a synthetic checkpoint: names and shapes exactly as
//! mlx-community writes them, random values from MLX's counter-based RNG keyed
//! by (seed, tensor name), so a tensor's values do not depend on which other
//! tensors were made before it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;

use mlx_rs::{Array, random};

use crate::engine::model::QuantMode;
use crate::engine::model::quantized::{self, QuantParams};

use super::{Arch, Shape, SynthError, SynthOptions, io_err};

/// What a tensor is, which decides its values and whether it is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A matrix of a Linear or Embedding layer: normal(0, 0.02); quantized
    /// when the model is.
    Matrix,
    /// An RMSNorm scale: ones; never quantized.
    NormScale,
    /// A projection's bias (qwen2's q, k, v): normal(0, 0.1), so it
    /// visibly changes the output; never quantized.
    Bias,
    /// A mixture-of-experts router `[E, hidden]`: normal(0, 0.02); when the
    /// model is quantized, 8-bit in groups of 64 whatever the rest, as
    /// mlx-lm's converter keeps routers of Qwen3-MoE.
    Router,
    /// The routed experts' stacked matrices `[E, out, in]`: normal(0, 0.02);
    /// quantized like the rest, or mxfp4 when asked.
    Experts,
}

/// How a synthetic tensor is quantized (the synth side of what the engine
/// reads as `QuantParams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynthQuant {
    pub group_size: i32,
    pub bits: i32,
    pub mxfp4: bool,
}

impl SynthQuant {
    /// `mode` as config.json writes it.
    pub fn mode_name(&self) -> &'static str {
        if self.mxfp4 { "mxfp4" } else { "affine" }
    }

    fn params(&self) -> QuantParams {
        QuantParams {
            group_size: self.group_size,
            bits: self.bits,
            mode: if self.mxfp4 {
                QuantMode::Mxfp4
            } else {
                QuantMode::Affine
            },
        }
    }
}

/// The router's quantization in a quantized mixture-of-experts model.
const ROUTER_QUANT: SynthQuant = SynthQuant {
    group_size: 64,
    bits: 8,
    mxfp4: false,
};

/// mxfp4's only layout: 4-bit values in groups of 32.
const MXFP4: SynthQuant = SynthQuant {
    group_size: 32,
    bits: 4,
    mxfp4: true,
};

/// How a tensor of `kind` is quantized, if at all.
fn quant_of(options: &SynthOptions, kind: TensorKind) -> Option<SynthQuant> {
    let bits = i32::from(options.bits?);
    let default = SynthQuant {
        group_size: i32::try_from(options.group_size).unwrap_or(64),
        bits,
        mxfp4: false,
    };
    match kind {
        TensorKind::NormScale | TensorKind::Bias => None,
        TensorKind::Matrix => Some(default),
        TensorKind::Router => Some(ROUTER_QUANT),
        TensorKind::Experts if options.experts_mxfp4 => Some(MXFP4),
        TensorKind::Experts => Some(default),
    }
}

/// The modules whose quantization differs from the default, by module path
/// (the tensor name without `.weight`), for config.json.
pub fn module_quantization(options: &SynthOptions, shape: &Shape) -> Vec<(String, SynthQuant)> {
    let Some(default) = quant_of(options, TensorKind::Matrix) else {
        return Vec::new();
    };
    tensor_plan(options.arch, shape)
        .into_iter()
        .filter_map(|t| {
            let quant = quant_of(options, t.kind)?;
            let module = t.name.strip_suffix(".weight")?.to_owned();
            (quant != default).then_some((module, quant))
        })
        .collect()
}

/// One tensor of the plan (before quantization).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    /// The checkpoint name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<i32>,
    pub kind: TensorKind,
}

/// Progress of `write_weights`, reported after each tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub current: String,
}

/// The tensors a model of this shape and architecture has, in file order.
pub fn tensor_plan(arch: Arch, shape: &Shape) -> Vec<PlannedTensor> {
    let to_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let hidden = to_i32(shape.hidden_size);
    let inter = to_i32(shape.intermediate_size);
    let q_out = to_i32(shape.num_attention_heads * shape.head_dim);
    let kv_out = to_i32(shape.num_key_value_heads * shape.head_dim);
    let head_dim = to_i32(shape.head_dim);
    let vocab = to_i32(shape.vocab_size);

    let root = arch.weight_root();
    let mut plan = Vec::new();
    let mut add = |name: String, shape: Vec<i32>, kind| {
        plan.push(PlannedTensor {
            name: format!("{root}{name}"),
            shape,
            kind,
        })
    };
    add(
        "model.embed_tokens.weight".into(),
        vec![vocab, hidden],
        TensorKind::Matrix,
    );
    for layer in 0..shape.num_hidden_layers {
        let p = format!("model.layers.{layer}");
        add(
            format!("{p}.input_layernorm.weight"),
            vec![hidden],
            TensorKind::NormScale,
        );
        let separate: &[(&str, i32)] = if arch == Arch::Phi3 {
            add(
                format!("{p}.self_attn.qkv_proj.weight"),
                vec![q_out + 2 * kv_out, hidden],
                TensorKind::Matrix,
            );
            &[]
        } else {
            &[("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)]
        };
        for &(proj, out) in separate {
            add(
                format!("{p}.self_attn.{proj}.weight"),
                vec![out, hidden],
                TensorKind::Matrix,
            );
            if matches!(arch, Arch::Qwen2 | Arch::GptOss) {
                add(
                    format!("{p}.self_attn.{proj}.bias"),
                    vec![out],
                    TensorKind::Bias,
                );
            }
        }
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![hidden, q_out],
            TensorKind::Matrix,
        );
        if arch == Arch::GptOss {
            add(
                format!("{p}.self_attn.o_proj.bias"),
                vec![hidden],
                TensorKind::Bias,
            );
            // One sink logit per head.
            let heads = to_i32(shape.num_attention_heads);
            add(
                format!("{p}.self_attn.sinks"),
                vec![heads],
                TensorKind::Bias,
            );
        }
        if matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe) || arch.is_gemma3() {
            for norm in ["q_norm", "k_norm"] {
                add(
                    format!("{p}.self_attn.{norm}.weight"),
                    vec![head_dim],
                    TensorKind::NormScale,
                );
            }
        }
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![hidden],
            TensorKind::NormScale,
        );
        if arch.is_gemma3() {
            for norm in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                add(
                    format!("{p}.{norm}.weight"),
                    vec![hidden],
                    TensorKind::NormScale,
                );
            }
        }
        match shape.experts {
            // The router, then each projection of every expert stacked
            // `[E, out, in]`, as mlx-community stores them; gpt-oss's with
            // a bias each.
            Some(experts) => {
                let count = to_i32(experts.num_experts);
                let inter = to_i32(experts.moe_intermediate_size);
                let gpt_oss = arch == Arch::GptOss;
                let (router, switch) = if gpt_oss {
                    ("router", "experts")
                } else {
                    ("gate", "switch_mlp")
                };
                add(
                    format!("{p}.mlp.{router}.weight"),
                    vec![count, hidden],
                    TensorKind::Router,
                );
                if gpt_oss {
                    add(
                        format!("{p}.mlp.{router}.bias"),
                        vec![count],
                        TensorKind::Bias,
                    );
                }
                for (proj, out, inp) in [
                    ("gate_proj", inter, hidden),
                    ("up_proj", inter, hidden),
                    ("down_proj", hidden, inter),
                ] {
                    add(
                        format!("{p}.mlp.{switch}.{proj}.weight"),
                        vec![count, out, inp],
                        TensorKind::Experts,
                    );
                    if gpt_oss {
                        add(
                            format!("{p}.mlp.{switch}.{proj}.bias"),
                            vec![count, out],
                            TensorKind::Bias,
                        );
                    }
                }
            }
            None => {
                if arch == Arch::Phi3 {
                    add(
                        format!("{p}.mlp.gate_up_proj.weight"),
                        vec![2 * inter, hidden],
                        TensorKind::Matrix,
                    );
                } else {
                    add(
                        format!("{p}.mlp.gate_proj.weight"),
                        vec![inter, hidden],
                        TensorKind::Matrix,
                    );
                    add(
                        format!("{p}.mlp.up_proj.weight"),
                        vec![inter, hidden],
                        TensorKind::Matrix,
                    );
                }
                add(
                    format!("{p}.mlp.down_proj.weight"),
                    vec![hidden, inter],
                    TensorKind::Matrix,
                );
            }
        }
    }
    add(
        "model.norm.weight".into(),
        vec![hidden],
        TensorKind::NormScale,
    );
    if !shape.tie_word_embeddings {
        add(
            "lm_head.weight".into(),
            vec![vocab, hidden],
            TensorKind::Matrix,
        );
    }
    if arch == Arch::Gemma3 {
        // A token vision tower and projector: present in every multimodal
        // checkpoint, read by neither Ondo nor mlx-lm's text model.
        for name in [
            "vision_tower.vision_model.post_layernorm.weight",
            "multi_modal_projector.mm_soft_emb_norm.weight",
        ] {
            plan.push(PlannedTensor {
                name: name.into(),
                shape: vec![16],
                kind: TensorKind::NormScale,
            });
        }
    }
    plan
}

/// FNV-1a over the seed and the tensor name: a stable per-tensor RNG key.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ seed;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The stored arrays for one planned tensor: one array, or the packed
/// weight with its scales and biases.
fn make_tensor(
    options: &SynthOptions,
    tensor: &PlannedTensor,
) -> Result<Vec<(String, Array)>, mlx_rs::error::Exception> {
    let dtype = options.dtype.to_mlx();
    let values = match tensor.kind {
        TensorKind::NormScale => Array::ones::<f32>(&tensor.shape)?,
        TensorKind::Matrix | TensorKind::Bias | TensorKind::Router | TensorKind::Experts => {
            let key = random::key(tensor_seed(options.seed, &tensor.name))?;
            let scale = if tensor.kind == TensorKind::Bias {
                0.1
            } else {
                0.02
            };
            random::normal::<f32>(&tensor.shape[..], 0.0, scale, &key)?
        }
    }
    .as_dtype(dtype)?;
    let out = match quant_of(options, tensor.kind) {
        Some(quant) => {
            let (packed, scales, biases) = quantized::quantize(&values, quant.params())?;
            let stem = tensor
                .name
                .strip_suffix(".weight")
                .unwrap_or(&tensor.name)
                .to_owned();
            let mut arrays = vec![
                (tensor.name.clone(), packed),
                (format!("{stem}.scales"), scales),
            ];
            if let Some(biases) = biases {
                arrays.push((format!("{stem}.biases"), biases));
            }
            arrays
        }
        None => vec![(tensor.name.clone(), values)],
    };
    mlx_rs::transforms::eval(out.iter().map(|(_, a)| a))?;
    Ok(out)
}

/// What `write_weights` produced.
pub struct WrittenWeights {
    pub files: Vec<String>,
    pub parameters: u64,
}

/// Writes the safetensors file(s), plus `model.safetensors.index.json` when
/// the tensors exceed one shard.
pub fn write_weights(
    options: &SynthOptions,
    shape: &Shape,
    dir: &Path,
    progress: &mut dyn FnMut(Progress),
) -> Result<WrittenWeights, SynthError> {
    let plan = tensor_plan(options.arch, shape);
    let parameters = plan
        .iter()
        .map(|t| t.shape.iter().map(|&d| d as u64).product::<u64>())
        .sum();
    let metadata = HashMap::from([("format".to_owned(), "mlx".to_owned())]);

    let mut shards: Vec<Vec<String>> = Vec::new();
    let mut pending: Vec<(String, Array)> = Vec::new();
    let mut pending_bytes = 0u64;
    let mut total_bytes = 0u64;
    let flush = |pending: &mut Vec<(String, Array)>,
                 shards: &mut Vec<Vec<String>>|
     -> Result<(), SynthError> {
        if pending.is_empty() {
            return Ok(());
        }
        let path = dir.join(format!("shard-{:05}.safetensors", shards.len() + 1));
        Array::save_safetensors(pending.iter().map(|(n, a)| (n, a)), &metadata, &path).map_err(
            |e| SynthError::Io {
                path: path.clone(),
                source: std::io::Error::other(crate::engine::mlx_failure(&e)),
            },
        )?;
        shards.push(pending.drain(..).map(|(n, _)| n).collect());
        Ok(())
    };

    for (index, tensor) in plan.iter().enumerate() {
        let arrays = make_tensor(options, tensor).map_err(|e| SynthError::Mlx {
            tensor: tensor.name.clone(),
            message: crate::engine::mlx_failure(&e),
        })?;
        let bytes: u64 = arrays.iter().map(|(_, a)| a.nbytes() as u64).sum();
        if pending_bytes > 0 && pending_bytes + bytes > options.max_shard_bytes {
            flush(&mut pending, &mut shards)?;
            pending_bytes = 0;
        }
        pending_bytes += bytes;
        total_bytes += bytes;
        pending.extend(arrays);
        progress(Progress {
            tensors_done: index + 1,
            tensors_total: plan.len(),
            current: tensor.name.clone(),
        });
    }
    flush(&mut pending, &mut shards)?;

    let count = shards.len();
    let mut files = Vec::with_capacity(count);
    let mut weight_map = BTreeMap::new();
    for (i, names) in shards.iter().enumerate() {
        let final_name = if count == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let from = dir.join(format!("shard-{:05}.safetensors", i + 1));
        let to = dir.join(&final_name);
        fs::rename(&from, &to).map_err(io_err(&to))?;
        for name in names {
            weight_map.insert(name.clone(), final_name.clone());
        }
        files.push(final_name);
    }
    if count > 1 {
        let index = serde_json::json!({
            "metadata": { "total_size": total_bytes, "total_parameters": parameters },
            "weight_map": weight_map,
        });
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).map_err(|e| SynthError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        fs::write(&path, text + "\n").map_err(io_err(&path))?;
    }
    Ok(WrittenWeights { files, parameters })
}
