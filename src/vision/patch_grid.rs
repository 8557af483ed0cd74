//! Dynamic-resolution image processing (Qwen3-VL, Qwen 3.5): an image
//! keeps roughly its own size and shape. Each side is rounded to a
//! multiple of `patch_size * merge_size`, the area brought within
//! `min_pixels..=max_pixels`; the image is resized there (Pillow's bicubic),
//! rescaled and normalized in float32, and cut into patches, each patch
//! flattened channel by channel with the image repeated `temporal_patch_size`
//! times (the tower's patch kernel is a video kernel). Patches are listed
//! window by window: the `merge_size` x `merge_size` patches that become one
//! image token are consecutive. An image then fills
//! `(height / patch) * (width / patch) / merge_size²` tokens.
//!
//! The arithmetic follows mlx-vlm's image processor for these models, which
//! replaces transformers' there: the rounding of each side is half to even
//! (Python's `round`), the rescale a float32 multiply.

use std::path::Path;

use serde_json::Value;

use super::preprocess::{ProcessorConfigError, read_preprocessor_config};
use super::resample::{Filter, Pixels};

/// A model's dynamic-resolution image processing, from its
/// `preprocessor_config.json` (and `processor_config.json`'s
/// `image_processor`, which takes precedence).
#[derive(Debug, Clone, PartialEq)]
pub struct PatchGridProcessor {
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// The resized image's area is brought within these.
    pub min_pixels: u64,
    pub max_pixels: u64,
    /// Multiplies each 8-bit value (in float32), when set.
    pub rescale_factor: Option<f32>,
    /// Per channel, when normalizing.
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

/// An image's patch grid: `height` x `width` patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchGrid {
    pub height: usize,
    pub width: usize,
}

impl PatchGrid {
    /// Patches in the grid.
    pub fn patches(&self) -> usize {
        self.height * self.width
    }
}

fn three(value: Option<&Value>) -> Result<[f32; 3], String> {
    match value {
        None | Some(Value::Null) => Ok([0.5; 3]),
        Some(Value::Array(items)) if items.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(items) {
                *o = v.as_f64().ok_or_else(|| format!("{v} is not a number"))? as f32;
            }
            Ok(out)
        }
        Some(Value::Number(n)) => Ok([n.as_f64().unwrap_or(0.5) as f32; 3]),
        Some(other) => Err(format!("{other} is not 3 numbers")),
    }
}

impl PatchGridProcessor {
    /// The processor the files in the model folder `dir` describe.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ProcessorConfigError> {
        let (config, fail) = read_preprocessor_config(dir)?;
        let overrides = std::fs::read_to_string(dir.join("processor_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .and_then(|v| v.get("image_processor").cloned());
        Self::from_config(&config, overrides.as_ref()).map_err(fail)
    }

    /// The processor a parsed `preprocessor_config.json` describes, with
    /// the keys of `overrides` (`processor_config.json`'s
    /// `image_processor`) in place of its own.
    pub fn from_config(config: &Value, overrides: Option<&Value>) -> Result<Self, String> {
        let mut merged = config.clone();
        if let (Some(into), Some(Value::Object(over))) = (merged.as_object_mut(), overrides) {
            for (key, value) in over {
                into.insert(key.clone(), value.clone());
            }
        }
        let c = &merged;
        let count = |key: &str, default: u64| -> Result<u64, String> {
            match c.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("\"{key}\" is {v}, not a positive whole number")),
            }
        };
        let flag = |key: &str| c.get(key).and_then(Value::as_bool).unwrap_or(true);
        let size = c.get("size");
        let edge = |key: &str| size.and_then(|s| s.get(key)).and_then(Value::as_u64);
        let min_pixels = c
            .get("min_pixels")
            .and_then(Value::as_u64)
            .or_else(|| edge("shortest_edge"))
            .unwrap_or(56 * 56);
        let max_pixels = c
            .get("max_pixels")
            .and_then(Value::as_u64)
            .or_else(|| edge("longest_edge"))
            .unwrap_or(14 * 14 * 4 * 1280);
        if min_pixels > max_pixels {
            return Err(format!(
                "the smallest image area ({min_pixels} pixels) is above the largest ({max_pixels})"
            ));
        }
        let rescale_factor = flag("do_rescale").then(|| {
            c.get("rescale_factor")
                .and_then(Value::as_f64)
                .unwrap_or(1.0 / 255.0) as f32
        });
        let mean_std = if flag("do_normalize") {
            let mean = three(c.get("image_mean")).map_err(|e| format!("\"image_mean\": {e}"))?;
            let std = three(c.get("image_std")).map_err(|e| format!("\"image_std\": {e}"))?;
            Some((mean, std))
        } else {
            None
        };
        Ok(Self {
            patch_size: count("patch_size", 16)? as usize,
            temporal_patch_size: count("temporal_patch_size", 2)? as usize,
            merge_size: count("merge_size", 2)? as usize,
            min_pixels,
            max_pixels,
            rescale_factor,
            mean_std,
        })
    }

    /// The size (width, height) an image of `width` x `height` is resized
    /// to: each side a multiple of `patch_size * merge_size`, the area
    /// within the limits, the shape kept as near as that allows.
    pub fn resized(&self, width: usize, height: usize) -> Result<(usize, usize), String> {
        let factor = (self.patch_size * self.merge_size) as f64;
        let (w, h) = (width as f64, height as f64);
        if width == 0 || height == 0 {
            return Err(format!("the image is {width}x{height} pixels"));
        }
        if w.max(h) / w.min(h) > 200.0 {
            return Err(format!(
                "the image is {width}x{height} pixels, longer than 200 times its width; crop it \
                 nearer to a rectangle first"
            ));
        }
        let side = |x: f64| (x / factor).round_ties_even() * factor;
        let (mut h_bar, mut w_bar) = (side(h), side(w));
        if h_bar * w_bar > self.max_pixels as f64 {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            h_bar = factor.max((h / beta / factor).floor() * factor);
            w_bar = factor.max((w / beta / factor).floor() * factor);
        } else if h_bar * w_bar < self.min_pixels as f64 {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            h_bar = (h * beta / factor).ceil() * factor;
            w_bar = (w * beta / factor).ceil() * factor;
        }
        Ok((w_bar as usize, h_bar as usize))
    }

    /// The patch grid of an image of `width` x `height` pixels.
    pub fn grid(&self, width: usize, height: usize) -> Result<PatchGrid, String> {
        let (w, h) = self.resized(width, height)?;
        Ok(PatchGrid {
            height: h / self.patch_size,
            width: w / self.patch_size,
        })
    }

    /// Image tokens an image with `grid` fills.
    pub fn tokens(&self, grid: PatchGrid) -> usize {
        grid.patches() / (self.merge_size * self.merge_size)
    }

    /// Values in one flattened patch: channels x time x patch x patch.
    pub fn patch_values(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// `image`'s patches, `[patches, patch_values]` float32 row by row
    /// (window by window, see the module comment), with its grid.
    pub fn patches(&self, image: &Pixels) -> Result<(Vec<f32>, PatchGrid), String> {
        let (w, h) = self.resized(image.width, image.height)?;
        let resized = image.resize(w, h, Filter::Bicubic);
        let c = resized.channels;
        let value = |channel: usize, y: usize, x: usize| -> f32 {
            let byte = resized.data[(y * w + x) * c + channel.min(c - 1)];
            let mut v = f32::from(byte);
            if let Some(scale) = self.rescale_factor {
                v *= scale;
            }
            if let Some((mean, std)) = &self.mean_std {
                v = (v - mean[channel]) / std[channel];
            }
            v
        };
        let (p, t, m) = (self.patch_size, self.temporal_patch_size, self.merge_size);
        let grid = PatchGrid {
            height: h / p,
            width: w / p,
        };
        let mut rows = Vec::with_capacity(grid.patches() * self.patch_values());
        for block_row in 0..grid.height / m {
            for block_col in 0..grid.width / m {
                for inner_row in 0..m {
                    for inner_col in 0..m {
                        let (top, left) = (
                            (block_row * m + inner_row) * p,
                            (block_col * m + inner_col) * p,
                        );
                        for channel in 0..3 {
                            for _ in 0..t {
                                for y in top..top + p {
                                    for x in left..left + p {
                                        rows.push(value(channel, y, x));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok((rows, grid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(min_pixels: u64, max_pixels: u64) -> PatchGridProcessor {
        PatchGridProcessor::from_config(
            &serde_json::json!({"size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
                                "patch_size": 16, "merge_size": 2}),
            None,
        )
        .unwrap()
    }

    #[test]
    fn sides_round_half_to_even_and_the_area_keeps_within_its_limits() {
        let p = processor(4096, 65536);
        // 80/32 = 2.5 and 48/32 = 1.5 both round to 2 (half to even).
        assert_eq!(p.resized(48, 80).unwrap(), (64, 64));
        // Within the limits each side rounds to a multiple of 32: 100x60
        // to 96x64. Too large: both sides shrink by the same factor,
        // rounded down.
        assert_eq!(p.resized(100, 60).unwrap(), (96, 64));
        assert_eq!(p.resized(300, 400).unwrap(), (192, 288));
        assert_eq!(p.resized(1024, 640).unwrap(), (320, 192));
        assert_eq!(p.tokens(p.grid(1024, 640).unwrap()), 60);
        // Too small: both sides grow, rounded up.
        assert_eq!(p.resized(10, 10).unwrap(), (64, 64));
        let error = p.resized(1, 300).unwrap_err();
        assert!(error.contains("200 times"), "{error}");
    }

    #[test]
    fn processor_config_overrides_the_preprocessor_and_bad_limits_are_named() {
        let p = PatchGridProcessor::from_config(
            &serde_json::json!({"size": {"shortest_edge": 100, "longest_edge": 1000}}),
            Some(&serde_json::json!({"max_pixels": 5000, "patch_size": 14})),
        )
        .unwrap();
        assert_eq!((p.min_pixels, p.max_pixels, p.patch_size), (100, 5000, 14));
        let error = PatchGridProcessor::from_config(
            &serde_json::json!({"min_pixels": 10, "max_pixels": 5}),
            None,
        )
        .unwrap_err();
        assert!(error.contains("above the largest"), "{error}");
    }

    #[test]
    fn each_token_s_patches_are_consecutive_rows_of_channel_time_row_column() {
        let mut p = processor(1, 1 << 20);
        p.patch_size = 2;
        p.mean_std = None;
        p.rescale_factor = None;
        // 8x4 pixels, each value its own x + 10 y in channel 0.
        let (w, h) = (8, 4);
        let mut data = vec![0u8; w * h * 3];
        for y in 0..h {
            for x in 0..w {
                data[(y * w + x) * 3] = (x + 10 * y) as u8;
            }
        }
        let image = Pixels {
            width: w,
            height: h,
            channels: 3,
            data,
        };
        let (rows, grid) = p.patches(&image).unwrap();
        assert_eq!(
            grid,
            PatchGrid {
                height: 2,
                width: 4
            }
        );
        let row = |n: usize| &rows[n * 24..n * 24 + 24];
        // Patch 0: top-left; patch 1: right of it (same window); patch 2:
        // below patch 0; patch 4: the next window's first.
        assert_eq!(&row(0)[..8], &[0., 1., 10., 11., 0., 1., 10., 11.]);
        assert_eq!(&row(1)[..4], &[2., 3., 12., 13.]);
        assert_eq!(&row(2)[..4], &[20., 21., 30., 31.]);
        assert_eq!(&row(4)[..4], &[4., 5., 14., 15.]);
    }
}
