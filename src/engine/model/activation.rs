//! The gated MLP's activations, each one compiled MLX function that lives as
//! long as its thread.
//!
//! Why it matters: mlx-rs's `nn::silu` compiles a fresh function on every
//! call, so every layer of every decode step paid for a trace, a graph
//! simplification and a fusion pass on the host before the kernel was even
//! queued; gemma's GELU was built the same way here. On a GPU the host's
//! time per step is the decode rate (docs/benchmarks-log.md, "The host's
//! share of a step"). A compiled function that is kept is traced once per
//! dtype and afterwards only replayed.
//!
//! What goes into one kernel is what mlx-lm compiles into one: SwiGLU with
//! its multiply by `up` (mlx-lm's `swiglu`, and gpt-oss's clamped variant),
//! Gemma 3's GEGLU as the GELU alone with the multiply after it (mlx-lm's
//! `gelu_approx(gate) * up`), Gemma 4's with the multiply inside (its
//! `geglu`). On the CPU a fused kernel rounds every
//! intermediate to its dtype as the separate operations do, but on MLX's
//! CUDA backend it need not: with the multiply fused into the GELU, a
//! bfloat16 gemma's greedy tokens departed from mlx-lm's on the H200.
//!
//! Thread-local because MLX's compile cache is not shared across threads
//! safely and the engine runs all model work on one thread; another thread
//! (a test) gets its own copies.

use std::cell::RefCell;

use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{Array, ops};

/// A kept compiled function of one array.
type Compiled1 = Box<dyn for<'a> FnMut(&'a Array) -> Result<Array, Exception>>;

/// A kept compiled function of two arrays.
type Compiled2 = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> Result<Array, Exception>>;

/// `value` as a scalar of `like`'s dtype: constants in the activations'
/// dtype, so bfloat16 stays bfloat16 (a float32 constant would promote it).
fn constant(value: f32, like: &Array) -> Result<Array, Exception> {
    Array::from_f32(value).as_dtype(like.dtype())
}

fn silu_times(pair: (&Array, &Array)) -> Result<Array, Exception> {
    let (gate, up) = pair;
    ops::multiply(ops::multiply(gate, ops::sigmoid(gate)?)?, up)
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, MLX's `gelu_approx`
/// with every constant in x's dtype. (mlx-rs's `gelu_approximate` makes its
/// constants float32 arrays, which turns bfloat16 activations into float32.)
fn gelu_approx_formula(x: &Array) -> Result<Array, Exception> {
    let cubed = ops::power(x, constant(3.0, x)?)?;
    let inner = ops::add(x, ops::multiply(constant(0.044715, x)?, &cubed)?)?;
    let scaled = ops::multiply(
        constant((2.0f64 / std::f64::consts::PI).sqrt() as f32, x)?,
        &inner,
    )?;
    let half_x = ops::multiply(constant(0.5, x)?, x)?;
    ops::multiply(&half_x, ops::add(constant(1.0, x)?, ops::tanh(&scaled)?)?)
}

fn gelu_approx_times(pair: (&Array, &Array)) -> Result<Array, Exception> {
    let (gate, up) = pair;
    ops::multiply(gelu_approx_formula(gate)?, up)
}

/// gpt-oss's SwiGLU: the gate clipped from above at `limit` and weighted by
/// `sigmoid(1.702 gate)`, the linear part clipped both ways with 1 added,
/// with mlx-lm's operations in its order.
fn clamped_silu_times(pair: (&Array, &Array), limit: f32) -> Result<Array, Exception> {
    let (gate, up) = pair;
    let gate = ops::minimum(gate, constant(limit, gate)?)?;
    let up = ops::minimum(
        ops::maximum(up, constant(-limit, up)?)?,
        constant(limit, up)?,
    )?;
    let glu = ops::multiply(
        &gate,
        ops::sigmoid(ops::multiply(constant(1.702, &gate)?, &gate)?)?,
    )?;
    ops::multiply(ops::add(&up, constant(1.0, &up)?)?, &glu)
}

thread_local! {
    static SWIGLU: RefCell<Compiled2> = RefCell::new(Box::new(compile(silu_times, true)));
    static GELU_APPROX: RefCell<Compiled1> =
        RefCell::new(Box::new(compile(gelu_approx_formula, true)));
    static GEGLU_APPROX: RefCell<Compiled2> =
        RefCell::new(Box::new(compile(gelu_approx_times, true)));
    /// One compiled function per clamp limit (a model has one).
    static CLAMPED_SWIGLU: RefCell<Vec<(u32, Compiled2)>> = const { RefCell::new(Vec::new()) };
}

/// `silu(gate) * up` in one fused kernel.
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array, Exception> {
    SWIGLU.with(|f| (f.borrow_mut())((gate, up)))
}

/// The tanh approximation of GELU, in one fused kernel.
pub fn gelu_approx(x: &Array) -> Result<Array, Exception> {
    GELU_APPROX.with(|f| (f.borrow_mut())(x))
}

/// `gelu_approx(gate) * up` (Gemma 3's GEGLU): the GELU in one fused
/// kernel, the multiply after it.
pub fn geglu_approx(gate: &Array, up: &Array) -> Result<Array, Exception> {
    ops::multiply(&gelu_approx(gate)?, up)
}

/// `gelu_approx(gate) * up` in one fused kernel (Gemma 4's GEGLU).
pub fn geglu_approx_fused(gate: &Array, up: &Array) -> Result<Array, Exception> {
    GEGLU_APPROX.with(|f| (f.borrow_mut())((gate, up)))
}

/// gpt-oss's clamped SwiGLU at `limit`, in one fused kernel.
pub fn clamped_swiglu(gate: &Array, up: &Array, limit: f32) -> Result<Array, Exception> {
    CLAMPED_SWIGLU.with(|kept| {
        let mut kept = kept.borrow_mut();
        let key = limit.to_bits();
        let index = match kept.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let f = move |pair: (&Array, &Array)| clamped_silu_times(pair, limit);
                kept.push((key, Box::new(compile(f, true))));
                kept.len() - 1
            }
        };
        (kept[index].1)((gate, up))
    })
}

/// `0.5 x (1 + erf(x / sqrt 2))`: the exact GELU of BERT and SigLIP.
pub fn gelu_exact(x: &Array) -> Result<Array, Exception> {
    let half = Array::from_f32(0.5).as_dtype(x.dtype())?;
    let root_half = Array::from_f32(std::f32::consts::FRAC_1_SQRT_2).as_dtype(x.dtype())?;
    let erf = ops::erf(ops::multiply(x, &root_half)?)?;
    ops::multiply(
        &ops::multiply(x, &half)?,
        &ops::add(&erf, &Array::from_f32(1.0).as_dtype(x.dtype())?)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(a: &Array) -> Vec<f32> {
        a.as_dtype(mlx_rs::Dtype::Float32)
            .unwrap()
            .as_slice::<f32>()
            .to_vec()
    }

    #[test]
    fn each_activation_equals_its_separate_operations_in_bfloat16() {
        // The fused kernel must round like the unfused operations (mlx-lm
        // fuses these the same way, and greedy parity depends on it).
        let gate = Array::from_slice(&[-3.1f32, -0.7, 0.0, 0.45, 1.9, 6.5, 9.0, -9.0], &[8])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let up = Array::from_slice(&[0.3f32, -1.2, 2.0, 0.9, -0.05, 1.5, -10.0, 10.0], &[8])
            .as_dtype(mlx_rs::Dtype::Bfloat16)
            .unwrap();
        let cases: [(Array, Array); 4] = [
            (
                swiglu(&gate, &up).unwrap(),
                silu_times((&gate, &up)).unwrap(),
            ),
            (
                geglu_approx(&gate, &up).unwrap(),
                ops::multiply(gelu_approx_formula(&gate).unwrap(), &up).unwrap(),
            ),
            (
                geglu_approx_fused(&gate, &up).unwrap(),
                ops::multiply(gelu_approx_formula(&gate).unwrap(), &up).unwrap(),
            ),
            (
                clamped_swiglu(&gate, &up, 7.0).unwrap(),
                clamped_silu_times((&gate, &up), 7.0).unwrap(),
            ),
        ];
        for (fused, separate) in &cases {
            assert_eq!(fused.dtype(), mlx_rs::Dtype::Bfloat16);
            assert_eq!(values(fused), values(separate));
        }
    }

    #[test]
    fn silu_times_up_is_the_formula() {
        let gate = Array::from_slice(&[-2.0f32, 0.0, 1.0, 3.0], &[4]);
        let up = Array::from_slice(&[1.0f32, 5.0, -2.0, 0.5], &[4]);
        let out = values(&swiglu(&gate, &up).unwrap());
        let silu = |x: f32| x / (1.0 + (-x).exp());
        for (i, (g, u)) in [(-2.0f32, 1.0f32), (0.0, 5.0), (1.0, -2.0), (3.0, 0.5)]
            .into_iter()
            .enumerate()
        {
            assert!((out[i] - silu(g) * u).abs() < 1e-5, "{i}: {}", out[i]);
        }
    }

    #[test]
    fn the_clamped_swiglu_clips_as_gpt_oss_does() {
        let gate = Array::from_slice(&[10.0f32, -10.0, 1.0], &[3]);
        let up = Array::from_slice(&[-10.0f32, 10.0, 0.5], &[3]);
        let out = values(&clamped_swiglu(&gate, &up, 7.0).unwrap());
        let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
        let expected = [
            (-7.0 + 1.0) * 7.0 * sigmoid(1.702 * 7.0),
            (7.0 + 1.0) * -10.0 * sigmoid(1.702 * -10.0),
            (0.5 + 1.0) * 1.0 * sigmoid(1.702),
        ];
        for (got, want) in out.iter().zip(expected) {
            assert!((got - want).abs() < 1e-4, "{got} vs {want}");
        }
        // A second limit gets its own function, not the first one's.
        let loose = values(&clamped_swiglu(&gate, &up, 100.0).unwrap());
        assert!((loose[0] - (-10.0 + 1.0) * 10.0 * sigmoid(17.02)).abs() < 1e-3);
    }
}
