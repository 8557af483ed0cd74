//! LFM2's short-convolution layer, in place of attention: `in_proj` to
//! three chunks (`b`, `c`, `x`), the gated input `b * x` through a depthwise
//! causal convolution over time of `kernel` positions (its cache, a
//! `ConvState`, holds the last `kernel - 1` gated inputs), gated again by
//! `c`, then `out_proj`. As mlx-lm's `ShortConv`.

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops};

use super::{JointProjection, Linear, QuantConfig};
use crate::engine::LoadError;
use crate::engine::cache::LayerCache;
use crate::engine::weights::WeightMap;
use crate::family::ShortConvConfig;

pub struct ShortConv {
    /// `b`, `c` and `x`: one stored `in_proj`, run whole for a decode step.
    in_proj: JointProjection<3>,
    pub(super) out_proj: Linear,
    /// The depthwise kernel `[channels, kernel, 1]`, as MLX's conv1d takes it.
    weight: Array,
    bias: Option<Array>,
    channels: i32,
}

impl ShortConv {
    /// Loads `{p}.conv`'s projections and kernel.
    pub fn load(
        w: &mut WeightMap,
        p: &str,
        hidden: i32,
        conv: &ShortConvConfig,
        quant: Option<&QuantConfig>,
    ) -> Result<Self, LoadError> {
        let prefix = format!("{p}.conv");
        let in_proj = Linear::load(
            w,
            &format!("{prefix}.in_proj"),
            3 * hidden,
            hidden,
            quant,
            conv.bias,
        )?;
        let out_proj = Linear::load(
            w,
            &format!("{prefix}.out_proj"),
            hidden,
            hidden,
            quant,
            conv.bias,
        )?;
        let weight = w.take_float(&format!("{prefix}.conv.weight"), &[hidden, conv.kernel, 1])?;
        let bias = if conv.bias {
            Some(w.take_float(&format!("{prefix}.conv.bias"), &[hidden])?)
        } else {
            None
        };
        Ok(Self {
            in_proj: JointProjection::split(in_proj, [hidden, hidden, hidden])?,
            out_proj,
            weight,
            bias,
            channels: hidden,
        })
    }

    /// The gated convolution of `x` (`[B, L, hidden]`), before `out_proj`,
    /// extending the layer's convolution state by `L` positions.
    pub fn mix(&self, x: &Array, cache: &mut LayerCache) -> Result<Array, Exception> {
        let [b, c, x] = self.in_proj.forward(x)?;
        let gated = ops::multiply(&b, &x)?;
        let padded = cache.conv_mut()?.extend(&gated)?;
        let mut convolved = ops::conv1d(&padded, &self.weight, 1, 0, 1, self.channels)?;
        if let Some(bias) = &self.bias {
            convolved = ops::add(&convolved, bias)?;
        }
        ops::multiply(&c, &convolved)
    }

    /// Positions the convolution spans.
    pub fn kernel(&self) -> i32 {
        self.weight.shape()[1]
    }

    pub fn parameters(&self) -> u64 {
        self.in_proj.parameters()
            + self.out_proj.parameters()
            + self.weight.size() as u64
            + self.bias.as_ref().map_or(0, |b| b.size() as u64)
    }

    pub fn arrays(&self) -> Vec<&Array> {
        let mut out = self.in_proj.arrays();
        out.extend(self.out_proj.arrays());
        out.push(&self.weight);
        out.extend(self.bias.iter());
        out
    }

    /// The matrices a one-position step multiplies by.
    pub fn decode_layers(&self) -> Vec<&Linear> {
        self.in_proj.decode_layers()
    }
}
