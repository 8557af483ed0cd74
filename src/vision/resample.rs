//! Resizing as Pillow's `Image.resize` does it, to the byte: the image
//! processors of transformers and mlx-vlm resize through Pillow, and a
//! vision tower sees those pixels, so Ondo's must be the same ones.
//!
//! Pillow resizes 8-bit images in two separable passes, horizontal first
//! (into an 8-bit intermediate), then vertical. Each output pixel is a
//! weighted sum of the input pixels under a filter centred on it; when
//! shrinking, the filter widens by the scale so every input pixel counts
//! (antialiasing). The weights are normalized to sum to one, then held as
//! fixed-point integers with 22 fractional bits, and each sum is rounded
//! half up and clipped to 0..=255.

/// The resampling filters Ondo needs: Gemma 3's processor uses bilinear,
/// Qwen's bicubic (Pillow's numbers 2 and 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    Bilinear,
    Bicubic,
}

impl Filter {
    /// Pillow's `Resampling` number, as preprocessor configs name it.
    pub fn from_pil(number: i64) -> Option<Self> {
        match number {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    /// Half the width of the filter at scale 1, in input pixels.
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                // Keys' cubic with a = -0.5, as Pillow has it.
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// Fractional bits of the fixed-point weights (Pillow's PRECISION_BITS for
/// 8-bit images: 32 - 8 - 2).
const PRECISION_BITS: u32 = 22;

/// For each output position along one axis: the first input position it
/// reads, and the fixed-point weights of the inputs from there.
struct Coefficients {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

fn coefficients(input: usize, output: usize, filter: Filter) -> Coefficients {
    let scale = input as f64 / output as f64;
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    let mut first = Vec::with_capacity(output);
    let mut weights = Vec::with_capacity(output);
    for out in 0..output {
        let center = (out as f64 + 0.5) * scale;
        // Pillow truncates toward zero here (a C cast); both bounds are
        // clamped to the image.
        let start = ((center - support + 0.5) as i64).max(0) as usize;
        let end = ((center + support + 0.5) as i64).min(input as i64).max(0) as usize;
        let raw: Vec<f64> = (start..end)
            .map(|x| filter.weight((x as f64 - center + 0.5) / filter_scale))
            .collect();
        let total: f64 = raw.iter().sum();
        let fixed = raw
            .iter()
            .map(|&w| {
                let w = if total != 0.0 { w / total } else { w };
                let scaled = w * f64::from(1u32 << PRECISION_BITS);
                if scaled < 0.0 {
                    (scaled - 0.5) as i32
                } else {
                    (scaled + 0.5) as i32
                }
            })
            .collect();
        first.push(start);
        weights.push(fixed);
    }
    Coefficients { first, weights }
}

fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// An image of `width` x `height` pixels of `channels` bytes each, rows
/// one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub data: Vec<u8>,
}

impl Pixels {
    /// Resized to `width` x `height` with `filter`, as Pillow's
    /// `Image.resize((width, height), filter)` (no reducing gap). The same
    /// size gives the image back unchanged, as Pillow does.
    pub fn resize(&self, width: usize, height: usize, filter: Filter) -> Pixels {
        let (width, height) = (width.max(1), height.max(1));
        if width == self.width && height == self.height {
            return self.clone();
        }
        let vertical = coefficients(self.height, height, filter);
        let mut first_row = vertical.first.clone();
        let resized_rows;
        let rows = if width != self.width {
            // Only the rows the vertical pass reads are resized.
            let from = vertical.first[0];
            let to = vertical.first[height - 1] + vertical.weights[height - 1].len();
            let horizontal = coefficients(self.width, width, filter);
            resized_rows = horizontal_pass(self, from, to, width, &horizontal);
            first_row.iter_mut().for_each(|s| *s -= from);
            &resized_rows
        } else {
            self
        };
        if height == self.height {
            return rows.clone();
        }
        vertical_pass(
            rows,
            height,
            &Coefficients {
                first: first_row,
                weights: vertical.weights,
            },
        )
    }
}

fn horizontal_pass(
    input: &Pixels,
    rows_from: usize,
    rows_to: usize,
    width: usize,
    k: &Coefficients,
) -> Pixels {
    let c = input.channels;
    let rows = rows_to - rows_from;
    let mut data = vec![0u8; width * rows * c];
    for y in 0..rows {
        let row = &input.data[(y + rows_from) * input.width * c..][..input.width * c];
        for x in 0..width {
            let start = k.first[x];
            for ch in 0..c {
                let mut sum: i64 = 1 << (PRECISION_BITS - 1);
                for (i, &w) in k.weights[x].iter().enumerate() {
                    sum += i64::from(row[(start + i) * c + ch]) * i64::from(w);
                }
                data[(y * width + x) * c + ch] = clip8(sum);
            }
        }
    }
    Pixels {
        width,
        height: rows,
        channels: c,
        data,
    }
}

fn vertical_pass(input: &Pixels, height: usize, k: &Coefficients) -> Pixels {
    let c = input.channels;
    let stride = input.width * c;
    let mut data = vec![0u8; stride * height];
    for y in 0..height {
        let start = k.first[y];
        for x in 0..stride {
            let mut sum: i64 = 1 << (PRECISION_BITS - 1);
            for (i, &w) in k.weights[y].iter().enumerate() {
                sum += i64::from(input.data[(start + i) * stride + x]) * i64::from(w);
            }
            data[y * stride + x] = clip8(sum);
        }
    }
    Pixels {
        width: input.width,
        height,
        channels: c,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: usize, height: usize) -> Pixels {
        let mut data = Vec::new();
        for y in 0..height {
            for x in 0..width {
                data.extend([(x * 255 / width.max(1)) as u8, (y * 7 % 256) as u8, 200]);
            }
        }
        Pixels {
            width,
            height,
            channels: 3,
            data,
        }
    }

    #[test]
    fn the_same_size_is_the_same_image_and_a_flat_image_stays_flat() {
        let image = gradient(9, 5);
        assert_eq!(image.resize(9, 5, Filter::Bicubic), image);
        let flat = Pixels {
            width: 13,
            height: 7,
            channels: 3,
            data: vec![77; 13 * 7 * 3],
        };
        for filter in [Filter::Bilinear, Filter::Bicubic] {
            for (w, h) in [(4, 3), (30, 20), (13, 2), (5, 7)] {
                let out = flat.resize(w, h, filter);
                assert_eq!((out.width, out.height), (w, h));
                assert!(out.data.iter().all(|&v| v == 77), "{filter:?} {w}x{h}");
            }
        }
    }

    #[test]
    fn weights_of_each_output_pixel_sum_to_one_in_fixed_point() {
        for filter in [Filter::Bilinear, Filter::Bicubic] {
            for (input, output) in [(1000, 896), (300, 896), (7, 3)] {
                let k = coefficients(input, output, filter);
                for w in &k.weights {
                    let sum: i64 = w.iter().map(|&v| i64::from(v)).sum();
                    assert!((sum - (1 << PRECISION_BITS)).abs() <= w.len() as i64);
                }
            }
        }
    }
}
