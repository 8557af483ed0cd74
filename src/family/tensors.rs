//! The tensors a settled config has: names and shapes exactly as an
//! mlx-community checkpoint stores them (before quantization), in file
//! order. `ondo synth` writes them, the fit estimate counts them, and the
//! engine's strict loader takes exactly these (a test loads every family
//! from them and compares).

use super::config::{DeltaProjections, ExpertsKind, ModelConfig};

/// What a tensor is, which decides how `ondo synth` fills it and whether it
/// is quantized with the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// A matrix of a Linear or Embedding layer.
    Matrix,
    /// An RMSNorm scale.
    NormScale,
    /// A projection's bias, or gpt-oss's per-head sink logits.
    Bias,
    /// A mixture-of-experts router `[E, hidden]` (or a shared expert's
    /// one-output gate), quantized at 8 bits when the rest is.
    Router,
    /// A router mlx-lm never quantizes (GLM's is no Linear layer): `[E,
    /// hidden]` in the folder's float dtype whatever the rest.
    FloatRouter,
    /// A router's score-correction bias `[E]`, kept in float32 whatever
    /// the other tensors' dtype (as mlx-lm's converter keeps GLM's).
    ScoreCorrection,
    /// The routed experts' stacked matrices `[E, out, in]`.
    Experts,
    /// A depthwise convolution's kernel `[channels, kernel, 1]` (never
    /// quantized: its rows are a few elements long).
    Conv,
    /// A gated DeltaNet layer's `A_log` `[heads]`: the log of each head's
    /// decay rate, kept in float32 whatever the other tensors' dtype (as
    /// mlx-lm's converter keeps it).
    LogDecay,
    /// A learned multiplier that is not a norm's scale (Gemma 4's
    /// `layer_scalar`, its router's `scale` and `per_expert_scale`): never
    /// quantized.
    Gain,
    /// A matrix the converters keep in floats whatever the rest: a vision
    /// tower's and projector's (mlx-vlm quantizes the language model only).
    FloatMatrix,
}

/// One tensor of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    /// The checkpoint name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<i32>,
    pub kind: TensorKind,
}

impl PlannedTensor {
    /// Elements (parameters) the tensor holds.
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| d.max(0) as u64).product()
    }
}

/// The tensors of a model of this config, in file order.
pub fn plan(config: &ModelConfig) -> Vec<PlannedTensor> {
    let hidden = config.hidden_size;
    let root = config.weight_prefix.as_str();
    let names = config.names;
    let mut plan = Vec::new();
    let mut add =
        |name: String, shape: Vec<i32>, kind| plan.push(PlannedTensor { name, shape, kind });
    add(
        format!("{root}.embed_tokens.weight"),
        vec![config.vocab_size, hidden],
        TensorKind::Matrix,
    );
    if let Some(per_layer) = &config.per_layer_input {
        let all = config.num_hidden_layers as i32 * per_layer.width;
        add(
            format!("{root}.embed_tokens_per_layer.weight"),
            vec![per_layer.vocab_size, all],
            TensorKind::Matrix,
        );
        linear(
            &mut add,
            format!("{root}.per_layer_model_projection"),
            all,
            hidden,
            false,
        );
        add(
            format!("{root}.per_layer_projection_norm.weight"),
            vec![per_layer.width],
            TensorKind::NormScale,
        );
    }
    for layer in 0..config.num_hidden_layers {
        let p = format!("{root}.layers.{layer}");
        add(
            format!("{p}.{}.weight", names.input_norm),
            vec![hidden],
            TensorKind::NormScale,
        );
        if let Some(conv) = config
            .short_conv
            .as_ref()
            .filter(|_| config.is_conv_layer(layer))
        {
            add(
                format!("{p}.conv.conv.weight"),
                vec![hidden, conv.kernel, 1],
                TensorKind::Conv,
            );
            if conv.bias {
                add(
                    format!("{p}.conv.conv.bias"),
                    vec![hidden],
                    TensorKind::Bias,
                );
            }
            linear(
                &mut add,
                format!("{p}.conv.in_proj"),
                3 * hidden,
                hidden,
                conv.bias,
            );
            linear(
                &mut add,
                format!("{p}.conv.out_proj"),
                hidden,
                hidden,
                conv.bias,
            );
        } else if let Some(delta) = config
            .gated_delta
            .as_ref()
            .filter(|_| config.is_delta_layer(layer))
        {
            let q = format!("{p}.linear_attn");
            let heads = delta.value_heads;
            let projections: &[(&str, i32)] = match delta.projections {
                DeltaProjections::Apart => &[
                    ("in_proj_qkv", delta.conv_dim()),
                    ("in_proj_z", delta.value_dim()),
                    ("in_proj_b", heads),
                    ("in_proj_a", heads),
                ],
                DeltaProjections::GroupedByKeyHead => &[
                    ("in_proj_qkvz", delta.conv_dim() + delta.value_dim()),
                    ("in_proj_ba", 2 * heads),
                ],
            };
            for &(proj, out) in projections {
                linear(&mut add, format!("{q}.{proj}"), out, hidden, false);
            }
            add(
                format!("{q}.conv1d.weight"),
                vec![delta.conv_dim(), delta.conv_kernel, 1],
                TensorKind::Conv,
            );
            add(format!("{q}.dt_bias"), vec![heads], TensorKind::Bias);
            add(format!("{q}.A_log"), vec![heads], TensorKind::LogDecay);
            add(
                format!("{q}.norm.weight"),
                vec![delta.value_head_dim],
                TensorKind::NormScale,
            );
            linear(
                &mut add,
                format!("{q}.out_proj"),
                hidden,
                delta.value_dim(),
                false,
            );
        } else {
            attention(&mut add, config, layer, &p);
        }
        add(
            format!("{p}.{}.weight", names.mlp_norm),
            vec![hidden],
            TensorKind::NormScale,
        );
        if config.sandwich_norms {
            for norm in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                add(
                    format!("{p}.{norm}.weight"),
                    vec![hidden],
                    TensorKind::NormScale,
                );
            }
        }
        let dense = match &config.experts {
            // The router, then each projection of every expert stacked
            // `[E, out, in]`, as mlx-community stores them.
            Some(experts) if experts.is_sparse(layer) => {
                let count = experts.num_experts;
                let inter = experts.moe_intermediate_size;
                let (router, switch, biases) = experts.kind.tensor_names();
                let block = experts.kind.block_prefix(&p);
                add(
                    format!("{block}.{router}.weight"),
                    vec![count, hidden],
                    if experts.kind.router_quantized() {
                        TensorKind::Router
                    } else {
                        TensorKind::FloatRouter
                    },
                );
                if biases {
                    add(
                        format!("{block}.{router}.bias"),
                        vec![count],
                        TensorKind::Bias,
                    );
                }
                if let Some(correction) = experts.kind.score_correction() {
                    add(
                        format!("{block}.{router}.{correction}"),
                        vec![count],
                        TensorKind::ScoreCorrection,
                    );
                }
                if experts.kind == ExpertsKind::Gemma4 {
                    add(
                        format!("{block}.router.scale"),
                        vec![hidden],
                        TensorKind::Gain,
                    );
                    add(
                        format!("{block}.router.per_expert_scale"),
                        vec![count],
                        TensorKind::Gain,
                    );
                }
                for (proj, out, inp) in [
                    ("gate_proj", inter, hidden),
                    ("up_proj", inter, hidden),
                    ("down_proj", hidden, inter),
                ] {
                    add(
                        format!("{block}.{switch}.{proj}.weight"),
                        vec![count, out, inp],
                        TensorKind::Experts,
                    );
                    if biases {
                        add(
                            format!("{block}.{switch}.{proj}.bias"),
                            vec![count, out],
                            TensorKind::Bias,
                        );
                    }
                }
                if let Some(shared) = experts.shared_expert_intermediate_size {
                    let (module, gate) = experts.kind.shared_expert_names();
                    for (proj, out, inp) in [
                        ("gate_proj", shared, hidden),
                        ("up_proj", shared, hidden),
                        ("down_proj", hidden, shared),
                    ] {
                        linear(
                            &mut add,
                            format!("{p}.mlp.{module}.{proj}"),
                            out,
                            inp,
                            false,
                        );
                    }
                    if let Some(gate) = gate {
                        add(
                            format!("{p}.mlp.{gate}.weight"),
                            vec![1, hidden],
                            TensorKind::Router,
                        );
                    }
                }
                if experts.kind.beside_dense_mlp() {
                    for norm in [
                        "post_feedforward_layernorm_1",
                        "pre_feedforward_layernorm_2",
                        "post_feedforward_layernorm_2",
                    ] {
                        add(
                            format!("{p}.{norm}.weight"),
                            vec![hidden],
                            TensorKind::NormScale,
                        );
                    }
                }
                experts.kind.beside_dense_mlp()
            }
            _ => true,
        };
        if dense {
            let mlp = names.mlp;
            let inter = config.intermediate_size_of(layer);
            let bias = config.mlp_bias;
            if config.fused_projections {
                linear(
                    &mut add,
                    format!("{p}.mlp.gate_up_proj"),
                    2 * inter,
                    hidden,
                    bias,
                );
            } else {
                let [gate, up, _] = names.gate_up_down;
                linear(&mut add, format!("{p}.{mlp}.{gate}"), inter, hidden, bias);
                linear(&mut add, format!("{p}.{mlp}.{up}"), inter, hidden, bias);
            }
            let down = names.gate_up_down[2];
            linear(&mut add, format!("{p}.{mlp}.{down}"), hidden, inter, bias);
        }
        if let Some(per_layer) = &config.per_layer_input {
            let width = per_layer.width;
            linear(
                &mut add,
                format!("{p}.per_layer_input_gate"),
                width,
                hidden,
                false,
            );
            linear(
                &mut add,
                format!("{p}.per_layer_projection"),
                hidden,
                width,
                false,
            );
            add(
                format!("{p}.post_per_layer_input_norm.weight"),
                vec![hidden],
                TensorKind::NormScale,
            );
        }
        if config.layer_scalar {
            add(format!("{p}.layer_scalar"), vec![1], TensorKind::Gain);
        }
    }
    add(
        format!("{root}.{}.weight", names.final_norm),
        vec![hidden],
        TensorKind::NormScale,
    );
    if !config.tie_word_embeddings {
        add(
            format!("{}.weight", config.head_prefix),
            vec![config.vocab_size, hidden],
            TensorKind::Matrix,
        );
    }
    plan
}

/// An attention layer's tensors: q, k, v (or one `qkv_proj`; no `v_proj`
/// where the values are the keys, only `q_proj` where the keys and values
/// are an earlier layer's), the output projection, gpt-oss's sinks and the
/// q/k norms.
fn attention(
    add: &mut impl FnMut(String, Vec<i32>, TensorKind),
    config: &ModelConfig,
    layer: usize,
    p: &str,
) {
    let hidden = config.hidden_size;
    let head_dim = config.head_dim_of(layer);
    let q_out = config.num_attention_heads * head_dim;
    let kv_out = config.kv_heads_of(layer) * head_dim;
    let shares_kv = config.shares_kv(layer);
    // A gated attention's `q_proj` gives a gate per query element too.
    let q_proj_out = if config.attention_output_gate {
        2 * q_out
    } else {
        q_out
    };
    let names = config.names;
    if config.fused_projections {
        linear(
            add,
            format!("{p}.self_attn.qkv_proj"),
            q_out + 2 * kv_out,
            hidden,
            config.qkv_bias,
        );
    } else {
        let projections = if shares_kv {
            &[("q_proj", q_proj_out)][..]
        } else if config.values_are_keys(layer) {
            &[("q_proj", q_proj_out), ("k_proj", kv_out)][..]
        } else {
            &[
                ("q_proj", q_proj_out),
                ("k_proj", kv_out),
                ("v_proj", kv_out),
            ][..]
        };
        for &(proj, out) in projections {
            linear(
                add,
                format!("{p}.self_attn.{proj}"),
                out,
                hidden,
                config.qkv_bias,
            );
        }
    }
    linear(
        add,
        format!("{p}.self_attn.{}", names.o_proj),
        hidden,
        q_out,
        config.o_bias,
    );
    if config.attention_sinks {
        add(
            format!("{p}.self_attn.sinks"),
            vec![config.num_attention_heads],
            TensorKind::Bias,
        );
    }
    if config.qk_norm {
        let norms = if shares_kv {
            &[names.q_norm][..]
        } else {
            &[names.q_norm, names.k_norm][..]
        };
        for norm in norms {
            add(
                format!("{p}.self_attn.{norm}.weight"),
                vec![head_dim],
                TensorKind::NormScale,
            );
        }
    }
}

/// A Linear layer's matrix `[out, inp]`, and its bias when it has one.
fn linear(
    add: &mut impl FnMut(String, Vec<i32>, TensorKind),
    prefix: String,
    out: i32,
    inp: i32,
    bias: bool,
) {
    add(
        format!("{prefix}.weight"),
        vec![out, inp],
        TensorKind::Matrix,
    );
    if bias {
        add(format!("{prefix}.bias"), vec![out], TensorKind::Bias);
    }
}

/// Parameters of a model of this config: every tensor's elements, the
/// experts all counted (they all stay in memory).
pub fn parameters(config: &ModelConfig) -> u64 {
    plan(config).iter().map(PlannedTensor::elements).sum()
}
