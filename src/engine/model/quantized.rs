//! MLX's quantized operations in any of its modes. mlx-rs's wrappers always
//! pass "affine", so weights in another mode (mxfp4: gpt-oss's experts, or
//! experts a converter packed that way) would be read as affine and give
//! wrong numbers without an error; these call mlx-c directly with the mode.

use std::ffi::CStr;

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

pub use super::{QuantMode, QuantParams};

/// The name MLX's C API takes for a mode.
fn c_name(mode: QuantMode) -> &'static CStr {
    match mode {
        QuantMode::Affine => c"affine",
        QuantMode::Mxfp4 => c"mxfp4",
        QuantMode::Nvfp4 => c"nvfp4",
        QuantMode::Mxfp8 => c"mxfp8",
    }
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// An absent optional array, as mlx-c takes it (a null handle).
fn no_array() -> mlx_sys::mlx_array {
    // SAFETY: makes an empty handle; nothing to free.
    unsafe { mlx_sys::mlx_array_new() }
}

/// Runs one mlx-c operation that writes an array, naming `what` on failure
/// (a closure: the description is only formatted then, not on every
/// decode step's matmul).
fn array_op(
    what: impl FnOnce() -> String,
    op: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_stream) -> std::os::raw::c_int,
) -> Result<Array, Exception> {
    let stream = Stream::thread_local_or_default();
    // SAFETY: `result` is either handed to an `Array` (which frees it) or
    // freed here; the inputs `op` passes are borrowed for the call only.
    unsafe {
        let mut result = mlx_sys::mlx_array_new();
        let status = op(&mut result, stream.as_ptr());
        if status != 0 {
            mlx_sys::mlx_array_free(result);
            return Err(Exception::custom(format!("MLX could not build {}", what())));
        }
        Ok(Array::from_ptr(result))
    }
}

/// `x @ W.T` for a quantized `W` (`transpose`), or `x @ W`.
pub fn quantized_matmul(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: Option<&Array>,
    params: QuantParams,
) -> Result<Array, Exception> {
    array_op(
        || {
            format!(
                "a {:?} quantized matmul of {:?} by {:?}",
                params.mode,
                x.shape(),
                weight.shape()
            )
        },
        |result, stream| unsafe {
            mlx_sys::mlx_quantized_matmul(
                result,
                x.as_ptr(),
                weight.as_ptr(),
                scales.as_ptr(),
                biases.map_or_else(no_array, Array::as_ptr),
                true,
                optional_int(params.group_size),
                optional_int(params.bits),
                c_name(params.mode).as_ptr(),
                stream,
            )
        },
    )
}

/// `x @ W[e].T` with `e` from `indices` for each of `x`'s rows, for stacked
/// quantized `W` `[E, out, packed in]`; `sorted` tells MLX the indices ascend.
pub fn gather_qmm(
    x: &Array,
    weight: &Array,
    scales: &Array,
    biases: Option<&Array>,
    indices: &Array,
    params: QuantParams,
    sorted: bool,
) -> Result<Array, Exception> {
    array_op(
        || {
            format!(
                "a {:?} gathered quantized matmul of {:?} by {:?}",
                params.mode,
                x.shape(),
                weight.shape()
            )
        },
        |result, stream| unsafe {
            mlx_sys::mlx_gather_qmm(
                result,
                x.as_ptr(),
                weight.as_ptr(),
                scales.as_ptr(),
                biases.map_or_else(no_array, Array::as_ptr),
                no_array(),
                indices.as_ptr(),
                true,
                optional_int(params.group_size),
                optional_int(params.bits),
                c_name(params.mode).as_ptr(),
                sorted,
                stream,
            )
        },
    )
}

/// The float matrix a quantized one stands for (in the scales' dtype for
/// affine, float32's default otherwise, as MLX chooses).
pub fn dequantize(
    weight: &Array,
    scales: &Array,
    biases: Option<&Array>,
    params: QuantParams,
) -> Result<Array, Exception> {
    array_op(
        || format!("a {:?} dequantize of {:?}", params.mode, weight.shape()),
        |result, stream| unsafe {
            mlx_sys::mlx_dequantize(
                result,
                weight.as_ptr(),
                scales.as_ptr(),
                biases.map_or_else(no_array, Array::as_ptr),
                optional_int(params.group_size),
                optional_int(params.bits),
                c_name(params.mode).as_ptr(),
                no_array(),
                mlx_sys::mlx_optional_dtype {
                    value: mlx_sys::mlx_dtype__MLX_FLOAT32,
                    has_value: false,
                },
                stream,
            )
        },
    )
}

/// A float matrix quantized along its last axis: the packed weight, the
/// scales and, for affine, the biases.
pub fn quantize(
    values: &Array,
    params: QuantParams,
) -> Result<(Array, Array, Option<Array>), Exception> {
    let what = || {
        format!(
            "a {:?} quantization of {:?} ({} bits, group {})",
            params.mode,
            values.shape(),
            params.bits,
            params.group_size
        )
    };
    let stream = Stream::thread_local_or_default();
    // SAFETY: the vector is freed on every path; each array taken out of it
    // is handed to an `Array` (which frees it) or freed on failure.
    unsafe {
        let mut parts = mlx_sys::mlx_vector_array_new();
        let status = mlx_sys::mlx_quantize(
            &mut parts,
            values.as_ptr(),
            optional_int(params.group_size),
            optional_int(params.bits),
            c_name(params.mode).as_ptr(),
            no_array(),
            stream.as_ptr(),
        );
        let mut arrays = Vec::new();
        if status == 0 {
            for i in 0..mlx_sys::mlx_vector_array_size(parts) {
                let mut item = mlx_sys::mlx_array_new();
                if mlx_sys::mlx_vector_array_get(&mut item, parts, i) != 0 {
                    mlx_sys::mlx_array_free(item);
                    break;
                }
                arrays.push(Array::from_ptr(item));
            }
        }
        mlx_sys::mlx_vector_array_free(parts);
        let expected = if params.has_biases() { 3 } else { 2 };
        if status != 0 || arrays.len() != expected {
            return Err(Exception::custom(format!("MLX could not build {}", what())));
        }
        let mut arrays = arrays.into_iter();
        match (arrays.next(), arrays.next(), arrays.next()) {
            (Some(weight), Some(scales), biases) => Ok((weight, scales, biases)),
            _ => Err(Exception::custom(format!("MLX could not build {}", what()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::{Dtype, ops, random};

    fn matrix(rows: i32, cols: i32, seed: u64) -> Array {
        let key = random::key(seed).unwrap();
        random::normal::<f32>(&[rows, cols][..], 0.0, 1.0, &key).unwrap()
    }

    fn close(a: &Array, b: &Array) -> f32 {
        let diff = ops::abs(ops::subtract(a, b).unwrap()).unwrap();
        diff.max(None).unwrap().item_exact::<f32>()
    }

    const MXFP4: QuantParams = QuantParams {
        group_size: 32,
        bits: 4,
        mode: QuantMode::Mxfp4,
    };

    /// mxfp4 packs 4-bit floats with one shared power-of-two scale (a uint8
    /// exponent) per 32 values and no biases; the matmul reads them in that
    /// mode, equal to multiplying by the dequantized matrix.
    #[test]
    fn mxfp4_round_trips_through_matmul_and_gather() {
        let w = matrix(64, 128, 1);
        let (packed, scales, biases) = quantize(&w, MXFP4).unwrap();
        assert!(biases.is_none());
        assert_eq!(scales.dtype(), Dtype::Uint8);
        assert_eq!(scales.shape(), &[64, 4]);
        assert_eq!(packed.shape(), &[64, 16]);
        let dense = dequantize(&packed, &scales, None, MXFP4).unwrap();
        // 4-bit floats: within a quarter of each group's largest value.
        assert!(close(&dense, &w) < 1.5, "dequantized far from the original");

        let x = matrix(3, 128, 2);
        let expected = ops::matmul(&x, dense.transpose().unwrap()).unwrap();
        let ours = quantized_matmul(&x, &packed, &scales, None, MXFP4).unwrap();
        assert!(close(&ours, &expected) < 1e-3);
        // Read as affine, the same bytes mean something else entirely.
        let affine = QuantParams {
            mode: QuantMode::Affine,
            ..MXFP4
        };
        let zeros = ops::zeros_like(scales.as_dtype(Dtype::Float32).unwrap()).unwrap();
        let misread = quantized_matmul(
            &x,
            &packed,
            &scales.as_dtype(Dtype::Float32).unwrap(),
            Some(&zeros),
            affine,
        )
        .unwrap();
        assert!(close(&misread, &expected) > 1.0);

        // Two experts stacked; each row picks one.
        let stacked = ops::stack(&[&packed, &packed], 0).unwrap();
        let stacked_scales = ops::stack(&[&scales, &scales], 0).unwrap();
        let indices = Array::from_slice(&[1u32, 0, 1], &[3]);
        let rows = x.reshape(&[3, 1, 128]).unwrap();
        let gathered = gather_qmm(
            &rows,
            &stacked,
            &stacked_scales,
            None,
            &indices,
            MXFP4,
            false,
        )
        .unwrap();
        assert!(close(&gathered.reshape(&[3, 64]).unwrap(), &expected) < 1e-3);
    }
}
